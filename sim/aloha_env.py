"""Bimanual ALOHA in MuJoCo (gym-aloha's models and tasks) with lerobot's conventions.

Two tasks, `transfer_cube` and `insertion`, as lerobot's `--env.type aloha` runs them: 50 fps,
400-step episodes, 14-D joint-position actions and state (per arm: 6 joint angles in radians, then
the gripper, 0 = closed, 1 = open), the `top` camera at 480x640, success when the reward reaches its
maximum (4); the episode then terminates. `reset(seed=s)` places the objects exactly as gym-aloha's
`reset(seed=s)` does, so seeds mean the same here, in `lerobot-eval` and in the hub's datasets.

Observation: {"images": {camera: uint8 (H, W, 3)}, "state": float32 (14,), "task": instruction}.
gym-aloha renders three 480x640 cameras at every step (150 ms); this environment renders only the
cameras asked for, without shadows or anti-aliasing unless `shadow_size` is set (11 ms a frame).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from dvla.sim.environments import checked_action
from dvla.sim.rendering import CameraRenderer

STATE_DIM = ACTION_DIM = 14
FPS = 50
EPISODE_STEPS = 400  # lerobot's AlohaEnv.episode_length
MAX_REWARD = 4
IMAGE_SHAPE = (480, 640)  # (height, width) of lerobot's `top` camera
CAMERAS = ("top", "angle", "front_close", "left_pillar", "right_pillar", "left_wrist", "right_wrist")
# The instructions of lerobot's `aloha_sim_*` datasets, so checkpoints trained on them run here.
INSTRUCTIONS = {
    "transfer_cube": "Pick up the cube with the right arm and transfer it to the left arm.",
    "insertion": "Insert the peg into the socket.",
}
TASKS = tuple(INSTRUCTIONS)
# gym-aloha's gymnasium ids, for users who know the tasks by them.
GYM_IDS = {"AlohaTransferCube-v0": "transfer_cube", "AlohaInsertion-v0": "insertion"}
JOINT_NAMES = [
    f"{side}_{joint}"
    for side in ("left", "right")
    for joint in ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate", "gripper")
]
XML = {"transfer_cube": "bimanual_viperx_transfer_cube.xml", "insertion": "bimanual_viperx_insertion.xml"}


def check_tasks(tasks: list[str]) -> None:
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise ValueError(f"unknown ALOHA task(s) {unknown}; valid: {', '.join(TASKS)}")


def object_pose(task: str, seed: int | None) -> np.ndarray:
    """The objects' free-joint poses at reset(seed): (7,) for the cube, (14,) for peg and socket,
    drawn by gym-aloha's own samplers from `seed`."""
    from gym_aloha.utils import sample_box_pose, sample_insertion_pose

    if task == "transfer_cube":
        return sample_box_pose(seed)
    return np.concatenate(sample_insertion_pose(seed))


@dataclass
class AlohaEnvConfig:
    """How one ALOHA environment is built and rendered."""

    task: str = "transfer_cube"
    # Cameras to render, any of CAMERAS; lerobot's datasets and policies use `top`.
    cameras: list[str] = field(default_factory=lambda: ["top"])
    # Rendered (height, width); lerobot's is 480x640. Policies resize to their own input size.
    image_shape: tuple[int, int] = IMAGE_SHAPE
    # Shadow map size; 0 = no shadows and no anti-aliasing (4.7x faster). gym-aloha renders with
    # shadows (4096) and 4x anti-aliasing, as the hub's datasets were recorded.
    shadow_size: int = 0
    max_episode_steps: int = EPISODE_STEPS

    def __post_init__(self):
        check_tasks([self.task])
        bad = [c for c in self.cameras if c not in CAMERAS]
        if not self.cameras or bad or len(set(self.cameras)) != len(self.cameras):
            raise ValueError(f"cameras must be distinct names among {CAMERAS}, got {self.cameras}")
        self.image_shape = tuple(int(s) for s in self.image_shape)
        if len(self.image_shape) != 2 or not all(16 <= s <= 2048 for s in self.image_shape):
            raise ValueError(f"image_shape must be (height, width) in [16, 2048], got {self.image_shape}")
        if self.max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {self.max_episode_steps}")


def action_bounds(task: str) -> tuple[list[float], list[float]]:
    """(low, high) of the 14 joint-position actions: the arm joints' ranges in the task's model, the
    grippers' normalised opening in [0, 1]."""
    from dm_control import mujoco as dm_mujoco
    from gym_aloha.constants import ASSETS_DIR

    check_tasks([task])
    model = dm_mujoco.Physics.from_xml_path(str(ASSETS_DIR / XML[task])).named.model
    limits = []
    for name in JOINT_NAMES:
        side, joint = name.split("_", 1)
        limits.append((0.0, 1.0) if joint == "gripper" else model.jnt_range[f"vx300s_{side}/{joint}"])
    return [float(lo) for lo, _ in limits], [float(hi) for _, hi in limits]


def plan_overlay(task: str, cameras: list[str], image_shape: tuple[int, int]):
    """Where the joint positions of a chunk (H, 14) put the midpoint of each gripper's fingers:
    (H, 2, 3), left then right, projected into the fixed cameras' images."""
    import mujoco
    from dm_control import mujoco as dm_mujoco
    from gym_aloha.constants import ASSETS_DIR

    from dvla.sim.plan_overlay import CameraProjection, PlanOverlay

    check_tasks([task])
    model = dm_mujoco.Physics.from_xml_path(str(ASSETS_DIR / XML[task])).model.ptr
    data = mujoco.MjData(model)
    arm = [i for i, name in enumerate(JOINT_NAMES) if not name.endswith("gripper")]  # action columns
    address = [model.joint(f"vx300s_{JOINT_NAMES[i].replace('_', '/', 1)}").qposadr[0] for i in arm]
    fingers = [[model.body(f"vx300s_{side}/{finger}_finger_link").id for finger in ("left", "right")]
               for side in ("left", "right")]  # fmt: skip

    def points(state: np.ndarray, chunk: np.ndarray) -> np.ndarray:
        out = np.empty((len(chunk), 2, 3))
        for k, action in enumerate(chunk):
            data.qpos[address] = action[arm]
            mujoco.mj_kinematics(model, data)
            out[k] = [data.xpos[pair].mean(axis=0) for pair in fingers]
        return out

    return PlanOverlay(CameraProjection(model, cameras, image_shape), points)


def joint_space_task(task: str):
    """gym-aloha's joint-space task whose observation skips its three 480x640 renders."""
    from gym_aloha.tasks.sim import InsertionTask, TransferCubeTask

    base = TransferCubeTask if task == "transfer_cube" else InsertionTask

    class Unrendered(base):
        def get_observation(self, physics):
            return {"qpos": self.get_qpos(physics)}

    return Unrendered()


def build_control_env(xml: str, task):
    """A dm_control Environment over one of gym-aloha's models, stepped at 50 Hz."""
    from dm_control import mujoco as dm_mujoco
    from dm_control.rl import control
    from gym_aloha.constants import ASSETS_DIR, DT

    physics = dm_mujoco.Physics.from_xml_path(str(ASSETS_DIR / xml))
    return control.Environment(
        physics, task, time_limit=float("inf"), control_timestep=DT, n_sub_steps=None, flat_observation=False
    )


class AlohaEnv(gym.Env):
    """One ALOHA task; `reset(seed=s)` places the objects as gym-aloha does for seed s."""

    metadata: ClassVar[dict] = {"render_modes": ["rgb_array"], "render_fps": FPS}
    fps = FPS

    def __init__(self, config: AlohaEnvConfig):
        super().__init__()
        self.config = config
        self.task = config.task
        self.instruction = INSTRUCTIONS[config.task]
        h, w = config.image_shape
        self.observation_space = spaces.Dict(
            {
                "images": spaces.Dict({c: spaces.Box(0, 255, (h, w, 3), np.uint8) for c in config.cameras}),
                "state": spaces.Box(-np.inf, np.inf, (STATE_DIM,), np.float32),
                "task": spaces.Text(max_length=256),
            }
        )
        # gym-aloha declares [-1, 1] but its actions are joint angles in radians: nothing is clipped.
        self.action_space = spaces.Box(-np.inf, np.inf, (ACTION_DIM,), np.float32)
        self._env = None  # built lazily so that worker processes own their GL context
        self._renderer: CameraRenderer | None = None
        self._qpos: np.ndarray | None = None
        self._steps = 0
        self.max_reward = 0.0

    @property
    def physics(self):
        self._ensure_env()
        return self._env.physics

    def _ensure_env(self) -> None:
        if self._env is not None:
            return
        self._env = build_control_env(XML[self.task], joint_space_task(self.task))
        model = self._env.physics.model.ptr
        if self.config.shadow_size == 0:
            model.vis.quality.offsamples = 0  # before the GL context exists: no multisampling
        h, w = self.config.image_shape
        self._renderer = CameraRenderer(model, self.config.cameras, h, w, self.config.shadow_size)

    def _observation(self) -> dict:
        return {
            "images": self._renderer.render(self._env.physics.data.ptr),
            "state": self._qpos.astype(np.float32),
            "task": self.instruction,
        }

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        from gym_aloha.tasks import sim

        self._ensure_env()
        super().reset(seed=seed)
        sim.BOX_POSE[0] = object_pose(self.task, seed)  # gym-aloha's tasks read it at reset
        self._qpos = self._env.reset().observation["qpos"]
        self._steps, self.max_reward = 0, 0.0
        return self._observation(), {"success": False}

    def step(self, action: np.ndarray):
        reward, success, info = self._advance(action)
        truncated = self._steps >= self.config.max_episode_steps and not success
        return self._observation(), reward, success, truncated, info

    def step_unrendered(self, action: np.ndarray) -> bool:
        """One step without rendering the cameras; returns success."""
        return self._advance(action)[1]

    def _advance(self, action: np.ndarray) -> tuple[float, bool, dict]:
        if self._env is None or self._qpos is None:
            raise RuntimeError("call reset() before step()")
        action = checked_action(action, ACTION_DIM, np.float64)
        timestep = self._env.step(action)
        self._qpos = timestep.observation["qpos"]
        self._steps += 1
        reward = float(timestep.reward)
        self.max_reward = max(self.max_reward, reward)
        success = reward >= MAX_REWARD
        return reward, success, {"success": success, "reward": reward}

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        self._env = None
