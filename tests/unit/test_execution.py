"""Chunk execution under a simulated inference delay (dvla/execution.py), and the jerk metric."""

import numpy as np
import pytest
import torch

from dvla.eval.metrics import jerk_ratio, switch_jerk
from dvla.execution import ChunkExecutor, ExecutionConfig

H, D = 8, 2


def chunk(index: int, t: int) -> torch.Tensor:
    """A recognisable chunk (H, D): value = 100 * chunk index + the control step it is meant for."""
    steps = torch.arange(t, t + H, dtype=torch.float32)
    return torch.stack([100 * index + steps, -(100 * index + steps)], dim=1)


def run(config: ExecutionConfig, steps: int, n_action_steps: int | None = 4):
    """Drive one executor for `steps` control steps; (executed actions, plan steps, known per plan)."""
    executor = ChunkExecutor(config, H, n_action_steps)
    executed, plans, knowns = [], [], []
    for t in range(steps):
        if executor.wants_plan():
            knowns.append(executor.known())
            planned = chunk(len(plans), t)
            plans.append(t)
            executor.accept(planned / 1000, planned)  # "normalised" = robot / 1000
        executed.append(executor.pop())
    return torch.stack(executed), plans, knowns, executor


def test_receding_horizon_without_delay_plans_every_window():
    executed, plans, knowns, _ = run(ExecutionConfig(), 12)
    assert plans == [0, 4, 8] and all(k is None for k in knowns)
    # every action is the one its chunk meant for this step
    assert executed[:, 0].tolist() == [0, 1, 2, 3, 104, 105, 106, 107, 208, 209, 210, 211]


def test_delay_runs_the_old_chunk_while_the_next_is_computed():
    d = 2
    executed, plans, _, executor = run(ExecutionConfig(inference_delay=d), 12)
    # planned when d actions of the window are left: at steps 2, 6, 10 (and 0, the synchronous start)
    assert plans == [0, 2, 6, 10]
    # steps 2-3 still run chunk 0; from step 4 chunk 1 from its step d, which is meant for step 4
    assert executed[:, 0].tolist() == [0, 1, 2, 3, 104, 105, 106, 107, 208, 209, 210, 211]
    assert executor.source == 2
    # the latest chunk (planned at step 10, for steps 10..17) is drawn from its step 2 (step 12) on
    latest, next_step = executor.plan_ahead()
    torch.testing.assert_close(latest, chunk(3, 10))
    assert next_step == 2


def test_inpainting_hands_over_the_actions_executed_meanwhile():
    d = 2
    _, _, knowns, _ = run(ExecutionConfig(mode="inpaint", inference_delay=d), 8)
    assert knowns[0] is None  # the first chunk starts from nothing
    # the chunk planned at step 2 must start with chunk 0's actions for steps 2 and 3
    torch.testing.assert_close(knowns[1], chunk(0, 0)[2:4] / 1000)
    torch.testing.assert_close(knowns[2], chunk(1, 2)[4:6] / 1000)  # chunk 1 for steps 6 and 7


def test_temporal_ensembling_averages_every_available_chunk():
    config = ExecutionConfig(mode="ensemble", ensemble_coeff=0.0)  # equal weights
    executed, plans, _, executor = run(config, 3, None)
    assert plans == [0, 1, 2] and executor.source is None
    # step 2: chunks 0, 1, 2 predict 2, 102, 202
    assert executed[2, 0].item() == pytest.approx((2 + 102 + 202) / 3)
    delayed = ExecutionConfig(mode="ensemble", inference_delay=2, ensemble_coeff=0.0)
    executed, *_ = run(delayed, 4, None)
    # chunk 1 (planned at 1) is usable from step 3: step 2 has chunk 0 alone, step 3 chunks 0 and 1
    assert executed[2, 0].item() == 2 and executed[3, 0].item() == pytest.approx((3 + 103) / 2)
    weighted = ExecutionConfig(mode="ensemble", ensemble_coeff=1.0)
    executed, *_ = run(weighted, 2, None)
    w = np.exp(-1.0)  # the oldest chunk weighs 1, the next exp(-1)
    assert executed[1, 0].item() == pytest.approx((1 + w * 101) / (1 + w))


def test_execution_settings_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="execution.mode"):
        ExecutionConfig(mode="blend")
    with pytest.raises(ValueError, match="inference_delay must be >= 0"):
        ExecutionConfig(inference_delay=-1)
    with pytest.raises(ValueError, match="does not fit a chunk of 8"):
        ExecutionConfig(inference_delay=5).window(H, 4)  # more than the window
    with pytest.raises(ValueError, match="does not fit a chunk of 8"):
        ExecutionConfig(inference_delay=3).window(H, 6)  # 3 + 6 > 8
    with pytest.raises(ValueError, match="below the chunk"):
        ExecutionConfig(mode="ensemble", inference_delay=8).window(H, None)
    assert ExecutionConfig(inference_delay=4).window(H, None) == 4


def test_jerk_splits_within_chunks_from_switches():
    actions = np.array([[0.0], [1.0], [2.0], [3.0], [10.0], [11.0]])  # a jump at the switch to chunk 1
    sources = [0, 0, 0, 0, 1, 1]
    jerk = switch_jerk(actions, sources)
    assert jerk["within_n"] == 2 and jerk["within"] == 0.0  # straight lines inside chunk 0
    assert jerk["switch_n"] == 2 and jerk["switch"] == pytest.approx(6 + 6)  # |10-6+2|, |11-20+3|
    pooled = jerk_ratio([{"jerk": jerk}, {"jerk": switch_jerk(np.array([[0.0], [1.0], [3.0]]), [0, 0, 0])}])
    assert pooled["within"] == pytest.approx(1 / 3) and pooled["ratio"] == pytest.approx(6 / (1 / 3))
    assert jerk_ratio([{"jerk": None}]) is None


def test_rollout_bounds_are_parsed_or_refused():
    from dvla.eval.rollout_config import RolloutConfig, parse_bounds

    assert parse_bounds("-1,0;1,2.5") == ([-1.0, 0.0], [1.0, 2.5])
    with pytest.raises(ValueError, match="'env' or 'LOW"):
        RolloutConfig(checkpoint="x", action_bounds="workspace")
    with pytest.raises(ValueError, match="2 low values but 1 high"):
        RolloutConfig(checkpoint="x", action_bounds="0,0;1")
    assert RolloutConfig(checkpoint="x", action_bounds="env").action_bounds == "env"
