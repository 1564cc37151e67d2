"""A gymnasium environment over one MetaWorld v3 task, with lerobot's conventions.

Observation: {"images": {camera: uint8 (H, W, 3)}, "state": float32 (4,) = hand xyz + gripper,
"task": instruction}. Action: float32 (4,) in [-1, 1]. `info["success"]` says whether the task is
solved at this step; the episode terminates at the first success (as lerobot's env does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium import spaces

from dvla.sim.environments import checked_action
from dvla.sim.rendering import CORNER2_POS, CameraRenderer
from dvla.sim.tasks import MT1_SEED, check_tasks, task_description

STATE_DIM = 4
SIM_STATE_DIM = 39  # MetaWorld's observation: hand, gripper, 2 object poses, the same a step earlier, goal
ACTION_DIM = 4
CAMERAS = ("corner2", "topview", "behindGripper", "gripperPOV", "corner", "corner3")


def build_task_env(task: str):
    """MetaWorld's environment of `task` (its first MT1 task variant), with `corner2` where lerobot
    puts it."""
    import metaworld

    mt1 = metaworld.MT1(task, seed=MT1_SEED)
    env = mt1.train_classes[task]()
    env.set_task(mt1.train_tasks[0])
    corner2 = mujoco.mj_name2id(env.model, mujoco.mjtObj.mjOBJ_CAMERA, "corner2")
    env.model.cam_pos[corner2] = CORNER2_POS
    return env


def plan_overlay(task: str, cameras: list[str], image_shape: tuple[int, int]):
    """Where a chunk (H, 4) takes the hand from the state's hand position: the actions' displacements
    (scaled as MetaWorld scales them, within its hand workspace) added up, (H, 1, 3), projected into
    the fixed cameras' images. The hand lags its target a little, so this is where it is sent."""
    from dvla.sim.plan_overlay import CameraProjection, PlanOverlay

    env = build_task_env(task)

    def points(state: np.ndarray, chunk: np.ndarray) -> np.ndarray:
        steps = np.clip(chunk[:, :3], -1, 1) * env.action_scale  # (H, 3)
        path, hand = np.empty((len(chunk), 1, 3)), np.asarray(state[:3], dtype=float)
        for k, step in enumerate(steps):  # bounded step by step, as MetaWorld moves its mocap
            hand = np.clip(hand + step, env.mocap_low, env.mocap_high)
            path[k, 0] = hand
        return path

    return PlanOverlay(CameraProjection(env.model, cameras, image_shape), points)


@dataclass
class MetaWorldEnvConfig:
    """How one MetaWorld environment is built and rendered."""

    task: str = "pick-place-v3"
    # Cameras to render, any of CAMERAS. `corner2` is lerobot's default view.
    cameras: list[str] = field(default_factory=lambda: ["corner2"])
    # Square image side in pixels.
    image_size: int = 128
    # Shadow map size; 0 turns shadows off (4x faster on a CPU, see sim/rendering.py).
    shadow_size: int = 0
    # Episode step limit; MetaWorld's MT1 tasks allow at most 500.
    max_episode_steps: int = 500

    def __post_init__(self):
        check_tasks([self.task])
        if not self.cameras:
            raise ValueError("cameras must name at least one camera")
        bad = [c for c in self.cameras if c not in CAMERAS]
        if bad:
            raise ValueError(f"unknown camera(s) {bad}; valid: {', '.join(CAMERAS)}")
        if len(set(self.cameras)) != len(self.cameras):
            raise ValueError(f"duplicate cameras in {self.cameras}")
        if not 16 <= self.image_size <= 1024:
            raise ValueError(f"image_size must be in [16, 1024], got {self.image_size}")
        if not 1 <= self.max_episode_steps <= 500:
            raise ValueError(f"max_episode_steps must be in [1, 500], got {self.max_episode_steps}")


class MetaWorldEnv(gym.Env):
    """One MetaWorld task; `reset(seed=s)` places the objects by `s` (lerobot's seeding)."""

    metadata: ClassVar[dict] = {"render_modes": ["rgb_array"], "render_fps": 80}

    def __init__(self, config: MetaWorldEnvConfig):
        super().__init__()
        self.config = config
        self.task = config.task
        self.instruction = task_description(config.task)
        size = config.image_size
        self.observation_space = spaces.Dict(
            {
                "images": spaces.Dict(
                    {c: spaces.Box(0, 255, (size, size, 3), np.uint8) for c in config.cameras}
                ),
                "state": spaces.Box(-np.inf, np.inf, (STATE_DIM,), np.float32),
                "task": spaces.Text(max_length=256),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32)
        self._env = None  # built lazily so that worker processes own their GL context
        self._renderer: CameraRenderer | None = None
        self.raw_obs: np.ndarray | None = None  # MetaWorld's 39-D observation (for scripted experts)
        self._steps = 0

    @property
    def fps(self) -> int:
        self._ensure_env()
        return round(1.0 / self._env.dt)

    def _ensure_env(self) -> None:
        if self._env is not None:
            return
        env = build_task_env(self.task)
        env.reset()
        env._freeze_rand_vec = False  # randomise object positions at every reset ...
        env.seeded_rand_vec = True  # ... from the env's seeded RNG, so reset(seed=s) is reproducible
        self._env = env
        size = self.config.image_size
        self._renderer = CameraRenderer(env.model, self.config.cameras, size, size, self.config.shadow_size)

    def _observation(self) -> dict:
        return {
            "images": self._renderer.render(self._env.data),
            "state": self.raw_obs[:STATE_DIM].astype(np.float32),
            "task": self.instruction,
        }

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self._ensure_env()
        super().reset(seed=seed)
        if seed is not None:
            self._env.seed(seed)
        self.raw_obs, _ = self._env.reset()
        # MetaWorld moves goal markers (model.site_pos) after its last mj_forward of the reset, so the
        # site positions in `data` are still those of an earlier draw: without this, the first frame
        # shows e.g. reach's goal dot where it is not. Positions only; the dynamics are untouched.
        mujoco.mj_kinematics(self._env.model, self._env.data)
        mujoco.mj_camlight(self._env.model, self._env.data)
        self._steps = 0
        return self._observation(), {"success": False}

    def step(self, action: np.ndarray):
        reward, success, info = self._advance(action)
        truncated = self._steps >= self.config.max_episode_steps and not success
        return self._observation(), reward, success, truncated, info

    def step_unrendered(self, action: np.ndarray) -> bool:
        """One step without rendering the cameras (for frames nobody records); returns success."""
        return self._advance(action)[1]

    def _advance(self, action: np.ndarray) -> tuple[float, bool, dict]:
        if self._env is None or self.raw_obs is None:
            raise RuntimeError("call reset() before step()")
        action = checked_action(action, ACTION_DIM, np.float32)
        action = np.clip(action, -1.0, 1.0)
        self.raw_obs, reward, _, _, info = self._env.step(action)
        self._steps += 1
        success = bool(info.get("success", 0.0))
        return float(reward), success, {**info, "success": success}

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        if self._env is not None:
            self._env.close()
            self._env = None
