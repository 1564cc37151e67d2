import numpy as np
import pytest

from dvla.sim.experts import ScriptedExpert
from dvla.sim.metaworld_env import MetaWorldEnv, MetaWorldEnvConfig


@pytest.fixture(scope="module")
def env():
    env = MetaWorldEnv(MetaWorldEnvConfig(task="reach-v3", cameras=["corner2", "topview"], image_size=64))
    yield env
    env.close()


def test_reset_and_step_shapes(env):
    obs, info = env.reset(seed=3)
    assert set(obs["images"]) == {"corner2", "topview"}
    for image in obs["images"].values():
        assert image.shape == (64, 64, 3) and image.dtype == np.uint8
        assert image.std() > 5  # a real picture, not a blank frame
    assert obs["state"].shape == (4,) and obs["state"].dtype == np.float32
    assert obs["task"] == "Reach a goal position"
    assert info == {"success": False}
    obs, reward, terminated, truncated, info = env.step(np.zeros(4, np.float32))
    assert isinstance(reward, float) and not terminated and not truncated
    assert isinstance(info["success"], bool)
    np.testing.assert_allclose(obs["state"], env.raw_obs[:4].astype(np.float32))


def test_reset_seed_places_objects_reproducibly(env):
    env.reset(seed=5)
    first = env.raw_obs.copy()
    env.reset(seed=6)
    other = env.raw_obs.copy()
    env.reset(seed=5)
    np.testing.assert_array_equal(env.raw_obs, first)
    assert not np.allclose(first[36:39], other[36:39])  # the goal moved with the seed


def test_first_frame_shows_this_seeds_goal(env):
    """MetaWorld moves the goal marker after the last forward pass of its reset; the first frame
    must show the marker at this seed's goal, not where an earlier draw of the reset put it."""
    import mujoco

    obs, _ = env.reset(seed=1001)
    model, data = env._env.model, env._env.data
    np.testing.assert_allclose(data.site_xpos[model.site("goal").id], env.raw_obs[36:39], atol=1e-9)
    mujoco.mj_forward(model, data)  # everything current: the same picture
    again = env._renderer.render(data)
    for camera, image in obs["images"].items():
        np.testing.assert_array_equal(image, again[camera])


def test_bad_actions_are_rejected(env):
    env.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros(3))
    with pytest.raises(ValueError, match="NaN"):
        env.step(np.array([0, np.nan, 0, 0]))


def test_bad_config_is_rejected():
    with pytest.raises(ValueError, match="unknown camera"):
        MetaWorldEnvConfig(cameras=["frontview"])
    with pytest.raises(ValueError, match="unknown MetaWorld task"):
        MetaWorldEnvConfig(task="stack-v3")
    with pytest.raises(ValueError, match="image_size"):
        MetaWorldEnvConfig(image_size=8)


def test_corner2_follows_lerobots_camera_and_flip():
    """Our corner2 frame equals MetaWorld's own render, moved and flipped as lerobot does."""
    import metaworld
    import mujoco

    from dvla.sim.rendering import CORNER2_POS

    mt1 = metaworld.MT1("reach-v3", seed=42)
    ref_env = mt1.train_classes["reach-v3"](
        render_mode="rgb_array", camera_name="corner2", width=64, height=64
    )
    ref_env.set_task(mt1.train_tasks[0])
    ref_env.model.cam_pos[mujoco.mj_name2id(ref_env.model, mujoco.mjtObj.mjOBJ_CAMERA, "corner2")] = (
        CORNER2_POS
    )
    ref_env.model.vis.quality.shadowsize = 0
    ref_env._freeze_rand_vec, ref_env.seeded_rand_vec = False, True
    ref_env.seed(7)
    ref_env.reset()
    reference = np.flip(ref_env.render(), (0, 1)).astype(float)  # lerobot's flip

    ours = MetaWorldEnv(MetaWorldEnvConfig(task="reach-v3", cameras=["corner2"], image_size=64))
    obs, _ = ours.reset(seed=7)
    image = obs["images"]["corner2"].astype(float)
    ours.close()
    ref_env.close()
    err_flipped = np.abs(image - reference).mean()
    err_unflipped = np.abs(image - np.flip(reference, (0, 1))).mean()
    assert err_flipped < 3.0, err_flipped  # same picture up to shadow/antialiasing noise
    assert err_unflipped > 5 * err_flipped


@pytest.mark.parametrize("task", ["reach-v3", "door-open-v3"])
def test_scripted_expert_succeeds(task):
    env = MetaWorldEnv(MetaWorldEnvConfig(task=task, image_size=32, max_episode_steps=300))
    expert = ScriptedExpert(task)
    successes = 0
    for seed in range(2):
        env.reset(seed=seed)
        for _ in range(300):
            _, _, terminated, truncated, info = env.step(expert(env.raw_obs))
            if terminated or truncated:
                break
        successes += info["success"]
    env.close()
    assert successes == 2
