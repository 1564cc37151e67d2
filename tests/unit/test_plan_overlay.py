"""Planned chunks in camera pixels (`dvla rollout --show_plan`): the projection lands on what the
camera renders, and each environment's path is where its actions send the grippers."""

import mujoco
import numpy as np
import pytest

from dvla.sim.aloha_env import AlohaEnv, AlohaEnvConfig
from dvla.sim.aloha_env import plan_overlay as aloha_overlay
from dvla.sim.metaworld_env import MetaWorldEnv, MetaWorldEnvConfig
from dvla.sim.metaworld_env import plan_overlay as metaworld_overlay
from dvla.sim.plan_overlay import CameraProjection
from dvla.sim.rendering import FLIPPED_CAMERAS


def rendered_centroid(model, data, camera, shape, geom_ids) -> np.ndarray:
    """(x, y) mean pixel of the given geoms in a segmentation render, flipped as the env flips."""
    renderer = mujoco.Renderer(model, *shape)
    renderer.enable_segmentation_rendering()
    renderer.update_scene(data, camera=camera)
    ids = renderer.render()[..., 0]  # (H, W) geom id per pixel
    renderer.close()
    if camera in FLIPPED_CAMERAS:
        ids = np.flip(ids, (0, 1))
    ys, xs = np.nonzero(np.isin(ids, geom_ids))
    assert len(xs) > 5, "the object is not in view"
    return np.array([xs.mean(), ys.mean()]) + 0.5  # pixel centres


def test_projection_lands_on_the_rendered_cube_in_alohas_top_camera():
    env = AlohaEnv(AlohaEnvConfig("transfer_cube", image_shape=(96, 128)))
    env.reset(seed=3)
    model, data = env.physics.model.ptr, env.physics.data.ptr
    projection = CameraProjection(model, ["top", "left_wrist"], (96, 128))
    assert projection.cameras == ["top"]  # a wrist camera moves with the arm: not drawn
    cube = model.body("box").id
    geoms = [g for g in range(model.ngeom) if model.geom_bodyid[g] == cube]
    expected = rendered_centroid(model, data, "top", (96, 128), geoms)
    np.testing.assert_allclose(projection.project(data.xpos[cube])["top"], expected, atol=1.5)
    env.close()


def test_projection_follows_metaworlds_flipped_corner2_camera():
    env = MetaWorldEnv(MetaWorldEnvConfig("pick-place-v3", ["corner2"], 128))
    env.reset(seed=5)
    model, data = env._env.model, env._env.data
    obj = model.body("obj").id
    geoms = [g for g in range(model.ngeom) if model.geom_bodyid[g] == obj]
    expected = rendered_centroid(model, data, "corner2", (128, 128), geoms)
    projected = CameraProjection(model, ["corner2"], (128, 128)).project(data.xpos[obj])["corner2"]
    np.testing.assert_allclose(projected, expected, atol=1.5)
    env.close()


def test_aloha_path_is_the_fingers_at_the_chunks_joint_positions():
    env = AlohaEnv(AlohaEnvConfig("insertion", image_shape=(48, 64)))
    obs, _ = env.reset(seed=0)
    physics = env.physics
    fingers = [
        (
            physics.named.data.xpos[f"vx300s_{s}/left_finger_link"]
            + physics.named.data.xpos[f"vx300s_{s}/right_finger_link"]
        )
        / 2
        for s in ("left", "right")
    ]
    overlay = aloha_overlay("insertion", ["top", "angle"], (48, 64))
    chunk = np.stack([obs["state"]] * 3)  # hold the current pose
    points = overlay.points(obs["state"], chunk)
    assert points.shape == (3, 2, 3)
    np.testing.assert_allclose(points[0], np.stack(fingers), atol=1e-6)
    moved = chunk.copy()
    moved[1:, 0] += 0.5  # turn the left arm's waist
    path = overlay.points(obs["state"], moved)
    assert np.abs(path[1:, 0] - points[1:, 0]).max() > 0.05  # the left fingers move ...
    np.testing.assert_allclose(path[:, 1], points[:, 1])  # ... the right ones do not
    pixels = overlay.pixels(obs["state"], moved)
    assert set(pixels) == {"top", "angle"} and pixels["top"].shape == (3, 2, 2)
    env.close()


def test_metaworld_path_adds_up_the_scaled_displacements_within_the_workspace():
    overlay = metaworld_overlay("reach-v3", ["corner2", "gripperPOV"], (64, 64))
    assert overlay.cameras == ["corner2"]
    state = np.array([0.0, 0.6, 0.2, 1.0])
    chunk = np.zeros((4, 4))
    chunk[:, 0] = 1.0  # full speed along +x
    chunk[2:, 2] = 5.0  # beyond the action space: clipped to 1
    path = overlay.points(state, chunk)[:, 0]  # (H, 3)
    np.testing.assert_allclose(path[:, 0], [0.01, 0.02, 0.03, 0.04])
    np.testing.assert_allclose(path[:, 2], [0.2, 0.2, 0.21, 0.22])
    far = overlay.points(np.array([0.0, 0.6, 0.2, 1.0]), np.ones((200, 4)))[-1, 0]
    assert far[0] == pytest.approx(0.5) and far[2] == pytest.approx(0.5)  # the hand's workspace ends


def test_frames_show_the_plan_from_its_next_step_on_the_camera_it_belongs_to():
    from dvla.eval.video import CAPTION_HEIGHT, DONE, NEAR, compose_frame

    black = {"a": np.zeros((64, 64, 3), np.uint8), "b": np.zeros((64, 64, 3), np.uint8)}
    path = np.array([[[10.0, 10.0]], [[20.0, 10.0]], [[30.0, 10.0]], [[40.0, 10.0]]])  # (K=4, P=1, 2)
    plain = compose_frame(black, ["x"])
    frame = compose_frame(black, ["x"], {"b": (path, 1)})  # step 0 executed, step 1 next
    assert frame.shape == plain.shape  # 64 px scaled x4 to 256
    image = frame[CAPTION_HEIGHT:]
    np.testing.assert_array_equal(image[:, :256], 0)  # camera a untouched
    y = 10 * 4
    np.testing.assert_array_equal(image[y, 256 + 15 * 4], DONE)  # executed segment
    np.testing.assert_array_equal(image[y, 256 + 20 * 4], NEAR)  # the next step's dot
    far = image[y, 256 + 38 * 4]
    assert far[0] > 200 and far[1] < 100  # reddens towards the chunk's end
    nothing = compose_frame(black, ["x"], {"b": (np.full((4, 1, 2), np.nan), 0)})
    np.testing.assert_array_equal(nothing, plain)  # an invisible path draws nothing
