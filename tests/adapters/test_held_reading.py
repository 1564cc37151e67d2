"""The held_reading policy hook: the mean of an episode's first readings, then held."""

import numpy as np
import pytest
import torch
from tiny_models import tiny_vla

from dvla.adapters import PolicyHooksConfig
from dvla.adapters.held_reading import HeldReading, HoldReadingConfig
from dvla.adapters.sim_state import SimStateConfig
from dvla.backbone.tokenizer import train_text_tokenizer
from dvla.model import TextSpecials
from dvla.policy import DiffusionVLAPolicy, PolicyConfig

STATS = {
    "observation.state": {"q01": np.zeros(5), "q99": np.ones(5)},
    "action": {"q01": -2 * np.ones(3), "q99": 2 * np.ones(3)},
    "sim.state": {"q01": np.zeros(6), "q99": np.ones(6)},
}


def held_policy(model, tokenizer, slices=((3, 6),), plans=1):
    hooks = PolicyHooksConfig(hold_reading=HoldReadingConfig([list(s) for s in slices], plans))
    return DiffusionVLAPolicy(model, tokenizer, STATS, PolicyConfig(hooks=hooks))


def test_averages_the_first_plans_then_holds_per_episode():
    model = tiny_vla(cameras=("a",), adapters={"sim_state": SimStateConfig(dim=6, input=True)})
    memory = HeldReading(HoldReadingConfig([[1, 4]], plans=2), model)
    first, second, third = torch.zeros(2, 6), torch.ones(2, 6), 5 * torch.ones(2, 6)
    memory.update(["x", "y"], first)
    held = memory.update(["x", "y"], second)
    assert torch.isnan(held[:, [0, 4, 5]]).all()  # outside the slice: the live reading
    torch.testing.assert_close(held[:, 1:4], torch.full((2, 3), 0.5))
    assert not memory.filling(["x", "y"])  # no more live readings needed
    torch.testing.assert_close(memory.update(["x", "y"], third)[:, 1:4], torch.full((2, 3), 0.5))
    memory.forget("y")  # a new episode in slot y starts over
    assert memory.filling(["x", "y"])
    torch.testing.assert_close(memory.update(["x", "y"], third)[:, 1:4], torch.tensor([[0.5] * 3, [5.0] * 3]))
    with pytest.raises(ValueError, match="3-D position"):
        HoldReadingConfig([[1, 3]])
    with pytest.raises(ValueError, match="empty"):
        HoldReadingConfig([])


def test_the_policy_feeds_the_held_values_to_the_model():
    torch.manual_seed(0)
    tokenizer = train_text_tokenizer(["open the door"], vocab_size=50)
    text = TextSpecials.from_tokenizer(tokenizer)
    with pytest.raises(ValueError, match="takes the head's reading as an input"):
        held_policy(tiny_vla(cameras=("a",), text=text), tokenizer)
    model = tiny_vla(cameras=("a",), text=text, adapters={"sim_state": SimStateConfig(dim=6, input=True)})
    policy = held_policy(model, tokenizer)
    images = {"a": torch.randint(0, 255, (1, 32, 32, 3), dtype=torch.uint8)}
    with pytest.raises(ValueError, match="episodes="):
        policy.predict_action_chunk(images, ["open the door"], torch.rand(1, 5))
    first_obs = policy.observation(images, ["open the door"], torch.rand(1, 5))
    policy.select_action(images, ["open the door"], torch.rand(1, 5))  # the first plan fills the memory
    (hook,) = policy.hooks
    first = model.adapters["sim_state"].predict(model, first_obs)  # (1, 6)
    later = {"a": torch.randint(0, 255, (1, 32, 32, 3), dtype=torch.uint8)}  # other images, same episode
    obs = policy.observation(later, ["open the door"], torch.rand(1, 5))
    live = model.adapters["sim_state"].predict(model, obs)
    hook.before_plan(model, obs, [0])
    embeds, _, _ = model.prefix_embeds(obs)
    expected = torch.cat([live[:, :3], first[:, 3:]], 1)  # live outside the slice, the first reading in it
    torch.testing.assert_close(embeds[:, -1], model.adapters["sim_state"].input_proj(expected))
    policy.reset()
    assert not hook._reads
