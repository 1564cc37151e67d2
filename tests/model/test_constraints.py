"""Chunk constraints in every head: known first steps kept exactly (inpainting) and seen by the
model, and per-dimension bounds never left; then the same through the policy."""

import numpy as np
import pytest
import torch
from tiny_models import ACTION_DIM, BINS, CHUNK, tiny_vla

from dvla.action_head import ActionTokenizer, FactoredHeadConfig
from dvla.action_head.base import ChunkConstraint
from dvla.backbone.decoder import DecodeConfig
from dvla.backbone.tokenizer import train_text_tokenizer
from dvla.model import TextSpecials
from dvla.policy import DiffusionVLAPolicy, PolicyConfig
from dvla.types import fake_observation

HEADS = {"discrete": "discrete", "factored": FactoredHeadConfig(levels=BINS), "flow": "flow"}
K = 2  # known steps


def observation(batch=2):
    return fake_observation(batch, ["a"], 32, 6, 50, 5, seed=3)


def bin_centres(batch: int, seed: int, lowest: int = 0, highest: int = BINS - 1) -> torch.Tensor:
    """Random normalised actions (B, K, D) on bin centres, as a decoded chunk's are."""
    g = torch.Generator().manual_seed(seed)
    bins = torch.randint(lowest, highest + 1, (batch, K, ACTION_DIM), generator=g)
    return ActionTokenizer(-torch.ones(ACTION_DIM), torch.ones(ACTION_DIM), BINS).decode(bins)


@pytest.mark.parametrize("head", list(HEADS))
def test_known_steps_are_kept_exactly_at_no_extra_cost(head):
    torch.manual_seed(0)
    model = tiny_vla(HEADS[head], cameras=("a",)).eval()
    obs, decode, known = observation(), DecodeConfig(steps=2), bin_centres(2, 0)
    with torch.no_grad():
        actions, forwards = model.sample_actions(obs, decode, constraint=ChunkConstraint(known=known))
        _, free_forwards = model.sample_actions(obs, decode)
    torch.testing.assert_close(actions[:, :K], known)
    assert forwards <= free_forwards  # a continuation costs no more forwards than a fresh chunk


@pytest.mark.parametrize("head", ["discrete", "factored"])
def test_known_steps_are_read_by_the_backbone_at_every_step(head):
    """The discrete heads feed the known values as tokens with the hidden ones (the flow head's
    velocity network acts on each step alone, so there the known steps cannot steer the others)."""
    torch.manual_seed(0)
    model = tiny_vla(HEADS[head], cameras=("a",)).eval()
    known = bin_centres(2, 0)
    values = ActionTokenizer(-torch.ones(ACTION_DIM), torch.ones(ACTION_DIM), BINS).encode(known).flatten(1)
    seen, embed = [], model.head.embed
    model.head.embed = lambda tokens, *a: seen.append(tokens.clone()) or embed(tokens, *a)
    with torch.no_grad():
        model.sample_actions(observation(), DecodeConfig(steps=3), constraint=ChunkConstraint(known=known))
    assert len(seen) == 3 and all(torch.equal(s[:, : K * ACTION_DIM], values) for s in seen)


@pytest.mark.parametrize("head", list(HEADS))
def test_bounds_are_never_left(head):
    torch.manual_seed(0)
    model = tiny_vla(HEADS[head], cameras=("a",)).eval()
    obs = observation(4)
    # a range in each dimension, the last narrower than one bin (2 / 32 = 0.0625 wide)
    low, high = torch.tensor([-0.9, 0.1, 0.30]), torch.tensor([-0.2, 0.8, 0.31])
    with torch.no_grad():
        free, _ = model.sample_actions(obs, DecodeConfig(steps=2))
        bounded, _ = model.sample_actions(
            obs, DecodeConfig(steps=2), constraint=ChunkConstraint(low=low, high=high)
        )
    outside = (free < low) | (free > high)
    assert outside.any()  # the model would leave them
    assert ((bounded >= low) & (bounded <= high)).all()
    if head != "flow":  # the masks leave only bins inside: every in-range dimension is a bin centre
        centres = -1 + (torch.arange(BINS) + 0.5) * 2 / BINS
        on_centre = (bounded[..., :2, None] - centres).abs().min(-1).values < 1e-5
        assert on_centre.all()


def test_autoregressive_decoding_keeps_known_steps_and_bounds():
    torch.manual_seed(0)
    model = tiny_vla("discrete", cameras=("a",)).eval()
    low, high = -0.5 * torch.ones(ACTION_DIM), 0.5 * torch.ones(ACTION_DIM)
    known = bin_centres(2, 0, 8, 23)  # centres -0.47 .. 0.47
    with torch.no_grad():
        constraint = ChunkConstraint(known=known, low=low, high=high)
        actions, _ = model.sample_actions(
            observation(), DecodeConfig(autoregressive=True), constraint=constraint
        )
    torch.testing.assert_close(actions[:, :K], known)
    assert ((actions >= low) & (actions <= high)).all()


def test_bad_constraints_are_refused():
    model = tiny_vla("discrete", cameras=("a",)).eval()
    obs = observation()
    cases = [
        (ChunkConstraint(known=torch.zeros(2, CHUNK + 1, ACTION_DIM)), "1 <= K <= the chunk's 4 steps"),
        (ChunkConstraint(known=torch.zeros(2, 1, ACTION_DIM + 1)), "expected \\(2, K, 3\\)"),
        (ChunkConstraint(known=torch.full((2, 1, ACTION_DIM), float("nan"))), "NaN"),
        (ChunkConstraint(low=torch.zeros(ACTION_DIM)), "both low and high"),
        (ChunkConstraint(low=torch.ones(ACTION_DIM), high=torch.zeros(ACTION_DIM)), "exceeds"),
    ]
    for constraint, message in cases:
        with pytest.raises(ValueError, match=message):
            model.sample_actions(obs, DecodeConfig(steps=1), constraint=constraint)


STATS = {
    "observation.state": {"q01": np.zeros(5), "q99": np.ones(5)},
    "action": {"q01": -2 * np.ones(3), "q99": 2 * np.ones(3)},
}


@pytest.fixture(scope="module")
def tokenizer():
    return train_text_tokenizer(["open the door"], vocab_size=50)


def policy_with(tokenizer, head="discrete", **config):
    torch.manual_seed(0)
    model = tiny_vla(HEADS[head], cameras=("a",), text=TextSpecials.from_tokenizer(tokenizer))
    return DiffusionVLAPolicy(model, tokenizer, STATS, PolicyConfig(**config))


@pytest.mark.parametrize("head", ["discrete", "flow"])
def test_policy_continuation_starts_with_what_ran_meanwhile(tokenizer, head):
    from dvla.execution import ExecutionConfig

    d = 1
    policy = policy_with(tokenizer, head, n_action_steps=2, execution=ExecutionConfig("inpaint", d))
    chunks, constraints = [], []
    original = policy.model.sample_actions

    def spy(obs, decode, **kw):
        constraints.append(kw.get("constraint"))
        chunks.append(original(obs, decode, **kw)[0])
        return chunks[-1], 2

    policy.model.sample_actions = spy
    images = {"a": torch.randint(0, 255, (2, 32, 32, 3), dtype=torch.uint8)}
    executed = [policy.select_action(images, ["open the door"] * 2, torch.rand(2, 5)) for _ in range(3)]
    # chunk 0 at step 0 runs steps 0-1; chunk 1 planned at step 1 (d = 1 left), runs from step 2
    assert len(chunks) == 2 and constraints[0] is None
    torch.testing.assert_close(constraints[1].known[:, 0], chunks[0][:, 1])  # what step 1 executes
    torch.testing.assert_close(chunks[1][:, :d], chunks[0][:, 1 : 1 + d])  # reproduced exactly
    robot = policy.processor.robot_actions
    torch.testing.assert_close(executed[1], robot(chunks[0][:, 1]))
    torch.testing.assert_close(executed[2], robot(chunks[1][:, d]))  # switched at the new chunk's step d


def test_policy_bounds_in_robot_units(tokenizer):
    low, high = [-0.5, -1.0, 0.0], [0.5, 0.2, 0.3]
    policy = policy_with(tokenizer, action_bounds=(low, high))
    images = {"a": torch.randint(0, 255, (3, 32, 32, 3), dtype=torch.uint8)}
    chunk = policy.predict_action_chunk(images, ["open the door"] * 3, torch.rand(3, 5))
    assert ((chunk >= torch.tensor(low) - 1e-5) & (chunk <= torch.tensor(high) + 1e-5)).all()
    with pytest.raises(ValueError, match="need 3 low and 3 high"):
        policy_with(tokenizer, action_bounds=([0.0], [1.0]))
    with pytest.raises(ValueError, match="exceeds"):
        policy_with(tokenizer, action_bounds=([1.0, 1.0, 1.0], [0.0, 2.0, 2.0]))


def test_background_planning_gives_the_simulated_delays_actions_without_blocking(tokenizer):
    import time

    from dvla.execution import ExecutionConfig

    images = {"a": torch.randint(0, 255, (2, 32, 32, 3), dtype=torch.uint8)}
    state, texts = torch.rand(2, 5), ["open the door"] * 2
    runs = {}
    for background in (False, True):
        execution = ExecutionConfig("inpaint", 2)
        policy = policy_with(tokenizer, n_action_steps=2, execution=execution, background=background)
        original = policy.model.sample_actions

        def slow(*a, original=original, **k):
            time.sleep(0.3)
            return original(*a, **k)

        policy.model.sample_actions = slow
        actions, plan_seconds = [], []
        for _ in range(6):
            tick = time.perf_counter()
            actions.append(policy.select_action(images, texts, state))
            plan_seconds.append(time.perf_counter() - tick)
        runs[background] = (torch.stack(actions), plan_seconds)
    torch.testing.assert_close(runs[True][0], runs[False][0])  # the same chunks, the same actions
    # step 0 waits for the first chunk; at the pipelined plans the background run does not
    assert runs[False][1][0] > 0.25 and runs[True][1][0] > 0.25
    assert max(runs[False][1][1:]) > 0.25 and min(runs[True][1][1:]) < 0.1
    with pytest.raises(ValueError, match="inference_delay > 0"):
        PolicyConfig(background=True)
