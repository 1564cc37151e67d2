"""The reading_offsets adapter: the read positions minus the hand, in decimetres, as one prefix token."""

import numpy as np
import pytest
import torch
from tiny_models import batch, tiny_vla

from dvla.adapters.reading_offsets import ReadingOffsetsConfig
from dvla.adapters.sim_state import SimStateConfig
from dvla.backbone.tokenizer import train_text_tokenizer
from dvla.model import TextSpecials
from dvla.policy import DiffusionVLAPolicy


def offsets_vla(slices=((3, 6),), text=None, **sim):
    adapters = {
        "sim_state": SimStateConfig(**{"dim": 6, **sim}),
        "reading_offsets": ReadingOffsetsConfig([list(s) for s in slices]),
    }
    return tiny_vla(adapters=adapters, **({"text": text} if text else {}))


def test_token_is_the_read_positions_minus_the_hand_in_decimetres():
    """Slice [3, 6] turns the head's reading of simulator-state dims 3..5 and the robot state's
    first three values back into metres (with the run's q01 and span) and gives their difference
    x10 as one more prefix token; without units it refuses to guess."""
    torch.manual_seed(0)
    model = offsets_vla()
    adapter, sim = model.adapters["reading_offsets"], model.adapters["sim_state"]
    data = batch()
    with pytest.raises(RuntimeError, match="no units yet"):
        model.prefix_embeds(data.observation)
    model.bind_stats(
        {
            "observation.state": {
                "q01": np.array([0.0, 0.5, 0.1, 0, 0]),
                "q99": np.array([0.2, 0.9, 0.4, 1, 1]),
            },
            "sim.state": {"q01": np.zeros(6), "q99": np.array([1, 1, 1, 0.2, 0.4, 0.6])},
        }
    )
    reading = torch.tensor([[0.0, 0, 0, 1.0, -1.0, 0.0]])  # goal read at (0.2, 0, 0.3) m
    state = torch.tensor([[-1.0, 1.0, 0.0, 0, 0]])  # hand at (0, 0.9, 0.25) m
    torch.testing.assert_close(adapter.offsets(reading, state), torch.tensor([[2.0, -9.0, 0.5]]))
    embeds, valid, _ = model.prefix_embeds(data.observation)  # 8 image + 6 text + state + offsets
    assert embeds.shape[1] == valid.shape[1] == 8 + 6 + 2
    read = sim.predict(model, data.observation)
    torch.testing.assert_close(embeds[:, -1], adapter.proj(adapter.offsets(read, data.observation.state)))
    loss, _ = model.compute_loss(data, generator=torch.Generator().manual_seed(1))
    loss.backward()
    assert adapter.proj[0].weight.grad.abs().sum() > 0  # the action loss trains the projection
    assert sim.head.readout.weight.grad is None  # but never the head


def test_bad_slices_are_named():
    with pytest.raises(ValueError, match="3-D position"):
        ReadingOffsetsConfig([[3, 5]])
    with pytest.raises(ValueError, match="empty"):
        ReadingOffsetsConfig([])
    with pytest.raises(ValueError, match="past the simulator state"):
        offsets_vla(slices=((4, 7),))
    with pytest.raises(ValueError, match="reads: vision"):
        offsets_vla(reads="state_token")
    with pytest.raises(ValueError, match="needs model.adapters.sim_state"):
        tiny_vla(adapters={"reading_offsets": ReadingOffsetsConfig([[3, 6]])})


def test_the_policy_gives_it_the_runs_units():
    tokenizer = train_text_tokenizer(["open the door"], vocab_size=50)
    model = offsets_vla(text=TextSpecials.from_tokenizer(tokenizer))
    stats = {
        "observation.state": {"q01": np.zeros(5), "q99": np.ones(5)},
        "action": {"q01": -np.ones(3), "q99": np.ones(3)},
    }
    with pytest.raises(ValueError, match="sim.state"):
        DiffusionVLAPolicy(model, tokenizer, stats)
    DiffusionVLAPolicy(
        model, tokenizer, {**stats, "sim.state": {"q01": np.zeros(6), "q99": np.arange(1, 7.0)}}
    )
    torch.testing.assert_close(model.adapters["reading_offsets"].sim_span, torch.arange(1, 7.0))
    torch.testing.assert_close(model.adapters["reading_offsets"].state_span, torch.ones(5))
