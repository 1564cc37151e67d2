"""Simulated environments behind one interface, looked up by name (`--env metaworld`, `--env aloha`).

An environment says what it is (tasks and their instructions, state and action dimensions, cameras,
fps, episode length, the robot type it records), builds gymnasium environments that observe
{"images": {camera: uint8 (H, W, 3)}, "state": float32 (S,), "task": str} and report
`info["success"]`, and records its scripted expert's demonstrations. `dvla collect` and
`dvla rollout` know nothing else of it. A new environment is one module defining a subclass of
`Environment` as `ENVIRONMENT`, named in `BUILTIN`.
"""

from __future__ import annotations

import importlib
from typing import ClassVar

import numpy as np

BUILTIN = {"metaworld": "dvla.sim.metaworld", "aloha": "dvla.sim.aloha"}


def checked_action(action, dim: int, dtype=np.float32) -> np.ndarray:
    """`action` as a (dim,) array, or a ValueError for a wrong shape or a NaN/inf."""
    action = np.asarray(action, dtype=dtype)
    if action.shape != (dim,):
        raise ValueError(f"action must have shape ({dim},), got {action.shape}")
    if not np.all(np.isfinite(action)):
        raise ValueError(f"action contains NaN or inf: {action}")
    return action


class Environment:
    """The interface; see the metaworld and aloha modules for the two implementations."""

    name: ClassVar[str]
    robot_type: ClassVar[str]  # LeRobot's `robot_type` of the datasets it records
    fps: ClassVar[int]
    state_dim: ClassVar[int]
    action_dim: ClassVar[int]
    cameras: ClassVar[tuple[str, ...]]  # every camera it can render
    default_cameras: ClassVar[tuple[str, ...]]
    max_episode_steps: ClassVar[int]  # the most steps an episode may have
    default_episode_steps: ClassVar[int]
    default_suite: ClassVar[str]  # the tasks `dvla bench` evaluates when none are named

    def resolve_tasks(self, tasks: str | list[str] | None, suite: str | None) -> list[str]:
        """`--tasks a,b` or `--suite NAME` -> task names (exactly one must be given)."""
        raise NotImplementedError

    def instruction(self, task: str) -> str:
        raise NotImplementedError

    def image_shape(self, height: int | None) -> tuple[int, int]:
        """(height, width) to render at for an image height (None = the environment's default)."""
        raise NotImplementedError

    def make(self, task: str, cameras: list[str], image_shape: tuple[int, int], shadow_size: int,
             max_episode_steps: int):  # fmt: skip
        """A gymnasium environment of `task` (built lazily: safe to create in a parent process)."""
        raise NotImplementedError

    def features(self, cameras: list[str], image_shape: tuple[int, int], use_videos: bool, sim_state: bool):
        """The LeRobot feature spec of a recorded dataset."""
        raise NotImplementedError

    def make_expert(self, task: str):
        """The scripted expert of `task` (whatever `record_demo` needs)."""
        raise NotImplementedError

    def record_demo(self, env, expert, seed: int, spec) -> tuple[list[dict], bool]:
        """The expert's episode from `reset(seed)`: recorded frames and whether it succeeded."""
        raise NotImplementedError

    def action_bounds(self, task: str) -> tuple[list[float], list[float]]:
        """The robot's action limits (low, high), `action_dim` values each (`--action_bounds env`)."""
        raise NotImplementedError(f"{self.name} declares no action limits; give them as numbers")

    def plan_overlay(self, task: str, cameras: list[str], image_shape: tuple[int, int]):
        """A `dvla.sim.plan_overlay.PlanOverlay`: where a planned chunk takes the robot's grippers,
        in the images of the fixed cameras among `cameras` (`dvla rollout --show_plan`)."""
        raise NotImplementedError(f"{self.name} cannot draw planned chunks (--show_plan)")

    def check_camera_names(self, cameras: list[str]) -> None:
        bad = [c for c in cameras if c not in self.cameras]
        if bad or not cameras:
            raise ValueError(
                f"{self.name} has no camera(s) {bad or cameras}; it has {', '.join(self.cameras)}"
            )


def get_environment(name: str) -> Environment:
    """The environment registered under `name`."""
    if name not in BUILTIN:
        raise ValueError(f"unknown environment {name!r}; available: {', '.join(BUILTIN)}")
    return importlib.import_module(BUILTIN[name]).ENVIRONMENT


def environment_for_robot(robot_type: str | None) -> str:
    """The environment whose datasets carry `robot_type` (a checkpoint's training data)."""
    for name in BUILTIN:
        if get_environment(name).robot_type == robot_type:
            return name
    raise ValueError(
        f"no environment records robot type {robot_type!r}; pass --env ({', '.join(BUILTIN)}) "
        "to choose the simulator to evaluate in"
    )
