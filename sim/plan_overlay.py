"""Where a planned chunk takes the robot, in camera pixels (`dvla rollout --show_plan`).

An environment turns a chunk of actions (H, D), and the state it was planned from, into world
positions (H, P, 3) of the robot's P grippers (`Environment.plan_overlay`); `CameraProjection`
projects them into the images of the model's fixed cameras with MuJoCo's pinhole camera.
"""

from __future__ import annotations

from collections.abc import Callable

import mujoco
import numpy as np

from dvla.sim.rendering import FLIPPED_CAMERAS


class CameraProjection:
    """World points -> pixel coordinates (x right, y down) in the images of a model's fixed cameras,
    rendered at `image_shape` (H, W). MuJoCo's camera frame: x right, y up, looking along -z."""

    def __init__(self, model: mujoco.MjModel, cameras: list[str], image_shape: tuple[int, int]):
        data = mujoco.MjData(model)
        mujoco.mj_kinematics(model, data)
        mujoco.mj_camlight(model, data)
        self.shape = image_shape
        self.poses: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}  # camera -> (position, axes, focal)
        for camera in cameras:
            index = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
            if index < 0:
                raise ValueError(f"unknown camera {camera!r}")
            if not _static(model, index):
                continue  # moves with the robot: its pose at plan time is not in the model
            focal = 0.5 * image_shape[0] / np.tan(np.radians(model.cam_fovy[index]) / 2)
            self.poses[camera] = (
                data.cam_xpos[index].copy(),
                data.cam_xmat[index].reshape(3, 3).copy(),
                focal,
            )
        self.cameras = list(self.poses)

    def project(self, points: np.ndarray) -> dict[str, np.ndarray]:
        """(..., 3) world points -> {camera: (..., 2) pixel (x, y)}, NaN behind a camera."""
        h, w = self.shape
        pixels = {}
        for camera, (position, axes, focal) in self.poses.items():
            local = (points - position) @ axes  # (..., 3) in the camera's frame
            depth = -local[..., 2]
            with np.errstate(divide="ignore", invalid="ignore"):
                x = w / 2 + focal * local[..., 0] / depth
                y = h / 2 - focal * local[..., 1] / depth
            xy = np.stack([x, y], axis=-1)
            xy[depth <= 0] = np.nan
            if camera in FLIPPED_CAMERAS:  # rendered images of these are flipped on both axes
                xy = np.array([w, h]) - xy
            pixels[camera] = xy
        return pixels


def _static(model: mujoco.MjModel, camera: int) -> bool:
    """Whether a camera stays put: on the world body, fixed or aimed at a body welded to the world."""
    if model.cam_bodyid[camera] != 0:
        return False
    mode = mujoco.mjtCamLight(model.cam_mode[camera])
    if mode == mujoco.mjtCamLight.mjCAMLIGHT_FIXED:
        return True
    aimed = (mujoco.mjtCamLight.mjCAMLIGHT_TARGETBODY, mujoco.mjtCamLight.mjCAMLIGHT_TARGETBODYCOM)
    return mode in aimed and model.body_weldid[model.cam_targetbodyid[camera]] == 0


class PlanOverlay:
    """`pixels(state, chunk)`: {camera: (H, P, 2)} where a chunk planned from `state` takes the P
    grippers, for the fixed cameras among those asked for (`cameras`)."""

    def __init__(self, projection: CameraProjection, points: Callable[[np.ndarray, np.ndarray], np.ndarray]):
        self.projection, self.points = projection, points
        self.cameras = projection.cameras

    def pixels(self, state: np.ndarray, chunk: np.ndarray) -> dict[str, np.ndarray]:
        return self.projection.project(self.points(np.asarray(state), np.asarray(chunk)))
