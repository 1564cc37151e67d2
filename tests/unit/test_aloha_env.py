"""The ALOHA environment (gym-aloha's models under lerobot's conventions) and its scripted experts."""

import numpy as np
import pytest

from dvla.eval.rollout import check_fits_environment
from dvla.sim.aloha_expert import AlohaExpert
from dvla.sim.environments import environment_for_robot, get_environment

ALOHA = get_environment("aloha")
# Training seeds on which the experts succeed (each does on about two thirds of them), with the
# steps between which success comes: the cube changes hands, and the peg is pushed in, late.
EXPERT_RUNS = [
    ("transfer_cube", 1),
    ("transfer_cube", 4),
    ("transfer_cube", 8),
    ("insertion", 0),
    ("insertion", 3),
]
SUCCESS_STEPS = {"transfer_cube": (250, 400), "insertion": (260, 400)}


def make(task="transfer_cube", steps=400, shape=(48, 64)):
    return ALOHA.make(task, ["top"], shape, 0, steps)


def test_reset_and_step_follow_lerobot_conventions():
    from gym_aloha.utils import sample_box_pose

    env = make()
    obs, info = env.reset(seed=3)
    assert obs["images"]["top"].shape == (48, 64, 3) and obs["images"]["top"].dtype == np.uint8
    assert obs["state"].shape == (14,) and obs["state"].dtype == np.float32
    assert obs["task"] == "Pick up the cube with the right arm and transfer it to the left arm."
    assert info == {"success": False} and env.fps == 50
    # objects are placed by gym-aloha's own sampler, so seeds mean what they mean in lerobot-eval
    np.testing.assert_allclose(env.physics.named.data.qpos["red_box_joint"], sample_box_pose(3))
    again, _ = env.reset(seed=3)
    np.testing.assert_array_equal(again["images"]["top"], obs["images"]["top"])
    obs, reward, terminated, truncated, info = env.step(obs["state"])  # hold the start pose
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, False, False)
    with pytest.raises(ValueError, match=r"shape \(14,\)"):
        env.step(np.zeros(4))
    with pytest.raises(ValueError, match="NaN"):
        env.step(np.full(14, np.nan))
    env.close()


def test_episode_truncates_at_its_step_limit():
    env = make(steps=3)
    obs, _ = env.reset(seed=0)
    flags = [env.step(obs["state"])[3] for _ in range(3)]
    assert flags == [False, False, True]
    env.close()


@pytest.mark.parametrize(("task", "seed"), EXPERT_RUNS)
def test_expert_succeeds_in_replay_and_success_terminates(task, seed):
    actions, planned = AlohaExpert(task).joint_actions(seed)
    assert actions.shape == (400, 14) and actions.dtype == np.float32 and planned == 4
    env = make(task)
    env.reset(seed=seed)
    for step, action in enumerate(actions):  # noqa: B007 (the step of success is checked)
        _, reward, terminated, truncated, info = env.step(action)
        if terminated:
            break
    # the replay repeats the expert's own run exactly (it planned from this simulation's objects)
    assert terminated and info["success"] and reward == 4 and not truncated
    low, high = SUCCESS_STEPS[task]
    assert low < step < high
    env.close()


def test_tasks_instructions_and_cameras_are_checked():
    assert ALOHA.resolve_tasks("AlohaInsertion-v0,transfer_cube", None) == ["insertion", "transfer_cube"]
    assert ALOHA.resolve_tasks(None, "all") == ["transfer_cube", "insertion"]
    with pytest.raises(ValueError, match="transfer_cube"):
        ALOHA.resolve_tasks("pick-place-v3", None)
    with pytest.raises(ValueError, match="no camera"):
        ALOHA.check_camera_names(["corner2"])
    assert ALOHA.image_shape(None) == (480, 640) and ALOHA.image_shape(96) == (96, 128)
    assert ALOHA.instruction("insertion") == "Insert the peg into the socket."
    assert environment_for_robot("aloha") == "aloha" and environment_for_robot("sawyer") == "metaworld"
    with pytest.raises(ValueError, match="--env"):
        environment_for_robot("koch")


def test_a_checkpoint_that_does_not_fit_the_environment_is_refused():
    check_fits_environment(ALOHA, 14, 14, ["top"])
    with pytest.raises(ValueError, match="14-D states and 14-D actions; the checkpoint has 4-D"):
        check_fits_environment(ALOHA, 4, 4, ["top"])
    with pytest.raises(ValueError, match=r"camera\(s\) \['corner2'\]"):
        check_fits_environment(ALOHA, 14, 14, ["corner2"])
    with pytest.raises(ValueError, match="4-D actions; the checkpoint has 14-D"):
        check_fits_environment(get_environment("metaworld"), 14, 14, ["corner2"])
