"""A LeRobot dataset read as robot samples:

{"images": {camera: float (3, H, W) in [0, 1]}, "state": (S,), "task": str,
 "actions": (H_chunk, D), "actions_is_pad": bool (H_chunk,)[, "sim_state": (E,)]}
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from dvla.data.finite import bad_episodes, check_stats_finite, nonfinite_frames
from dvla.data.frame_cache import FrameCache
from dvla.data.frames import FrameReader
from dvla.data.stats import low_dim_stats
from dvla.data.table import LowDimTable
from dvla.sim.recording import VIDEO_BACKEND


@dataclass
class LeRobotDataConfig:
    """Which LeRobot dataset to read and how its keys map onto dvla's inputs."""

    # Local dataset folder (offline). Give this or repo_id.
    root: str | None = None
    # Hub dataset id, e.g. lerobot/metaworld_mt50 (downloaded when online; with root, cached there).
    repo_id: str | None = None
    # Camera name -> dataset key, e.g. {corner2: observation.image}. Empty = every camera in the dataset,
    # named by the last part of its key.
    cameras: dict[str, str] = field(default_factory=dict)
    # Dataset key of the robot state.
    state_key: str = "observation.state"
    # Dataset key of the action.
    action_key: str = "action"
    # Dataset key of a simulator state to predict as an auxiliary training target (never a policy
    # input), e.g. sim.state in datasets recorded by `dvla collect`. None = no auxiliary target.
    sim_state_key: str | None = None
    # Action chunk length H: actions t .. t+H-1 (padded past the episode end).
    chunk_size: int = 16
    # Resize images to this height, each camera keeping its aspect ratio (a 480x640 camera at 96
    # becomes 96x128; square ones stay square); None keeps the dataset's size.
    image_size: int | None = None
    # Only these episode indices (None = all).
    episodes: list[int] | None = None
    # Only the episodes of these tasks, named by their instruction as the dataset stores it (meta/tasks),
    # e.g. ["Open a drawer"]; combined with `episodes` when both are set. None = every task.
    tasks: list[str] | None = None
    # Video decoder: pyav works everywhere; torchcodec is faster where system FFmpeg is installed.
    video_backend: str = VIDEO_BACKEND
    # Decode every frame once before training and keep it in RAM as uint8 (frames x cameras x 3 x
    # image_size^2 bytes). Epochs then cost no video decoding: much faster on CPU for small datasets.
    cache_frames: bool = False
    # Episodes with a NaN or inf in the state, the actions or the simulator state are an error that
    # names them; true drops those episodes instead (with a warning).
    drop_nonfinite_episodes: bool = False

    def __post_init__(self):
        if not self.root and not self.repo_id:
            raise ValueError("set dataset.root (a local LeRobot dataset) or dataset.repo_id (a hub id)")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.image_size is not None and self.image_size < 8:
            raise ValueError(f"image_size must be >= 8, got {self.image_size}")


def _load_metadata(config: LeRobotDataConfig):
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

    repo_id = config.repo_id or f"local/{Path(config.root).name}"
    if config.root and not config.repo_id and not (Path(config.root) / "meta" / "info.json").exists():
        raise FileNotFoundError(
            f"{config.root} is not a LeRobot dataset (no meta/info.json). "
            "Record one with `dvla collect`, or set dataset.repo_id to load one from the hub."
        )
    return repo_id, LeRobotDatasetMetadata(repo_id, root=config.root)


def select_episodes(config: LeRobotDataConfig, meta) -> list[int] | None:
    """The episode indices `episodes` and `tasks` select (None = every episode)."""
    if config.tasks is None:
        return config.episodes
    known = set(meta.tasks.index)
    unknown = [task for task in config.tasks if task not in known]
    if unknown:
        raise ValueError(
            f"dataset.tasks {unknown} are not tasks of {config.root or config.repo_id}; "
            f"its tasks are {sorted(known)}. Name them by these instructions."
        )
    wanted = set(config.tasks)
    allowed = None if config.episodes is None else {int(e) for e in config.episodes}
    episodes = [
        int(row["episode_index"])
        for row in meta.episodes
        if wanted & set(row["tasks"]) and (allowed is None or int(row["episode_index"]) in allowed)
    ]
    if not episodes:
        raise ValueError(f"dataset.episodes {config.episodes} hold no episode of the tasks {config.tasks}")
    return sorted(episodes)


def resolve_cameras(config: LeRobotDataConfig, features: dict) -> dict[str, str]:
    """Camera name -> dataset key, checked against the dataset's features."""
    camera_keys = [k for k, v in features.items() if v["dtype"] in ("image", "video")]
    if not config.cameras:
        if not camera_keys:
            raise ValueError("the dataset has no image or video features; dvla needs at least one camera")
        short = [k.split(".")[-1] for k in camera_keys]
        if len(set(short)) < len(short):  # e.g. observation.images.front and observation.depth.front
            return {k: k for k in camera_keys}
        return dict(zip(short, camera_keys, strict=True))
    missing = {name: key for name, key in config.cameras.items() if key not in camera_keys}
    if missing:
        raise ValueError(
            f"camera keys {missing} are not image/video features of the dataset; "
            f"its cameras are {camera_keys}. Fix dataset.cameras."
        )
    return dict(config.cameras)


class LeRobotChunks(torch.utils.data.Dataset):
    """A LeRobot dataset read as (images, state, task, action chunk) samples."""

    def __init__(self, config: LeRobotDataConfig):
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        self.config = config
        repo_id, meta = _load_metadata(config)
        features = meta.features
        roles = [("state", config.state_key), ("action", config.action_key)]
        if config.sim_state_key:
            roles.append(("sim_state", config.sim_state_key))
        for role, key in roles:
            if key not in features:
                fix = f"Set dataset.{role}_key."
                if role == "sim_state":
                    fix += " `dvla collect` records sim.state since it exists; re-record, or drop the key."
                raise ValueError(
                    f"the dataset has no {role} feature {key!r}; its features are {sorted(features)}. {fix}"
                )
        self.cameras = resolve_cameras(config, features)
        self.fps = meta.fps
        self.robot_type = meta.robot_type  # which simulator (dvla.sim.environments) can evaluate it
        self.state_dim = int(np.prod(features[config.state_key]["shape"]))
        self.action_dim = int(np.prod(features[config.action_key]["shape"]))
        sim_key = config.sim_state_key
        self.sim_state_dim = int(np.prod(features[sim_key]["shape"])) if sim_key else 0
        selected_episodes = select_episodes(config, meta)

        def open_dataset(episodes):
            # no delta_timestamps: lerobot would decode the images of every row an action chunk
            # touches; the chunk is cut from the in-memory action column instead (LowDimTable)
            return LeRobotDataset(
                repo_id, root=config.root, episodes=episodes, video_backend=config.video_backend
            )  # fmt: skip

        self.dataset = open_dataset(selected_episodes)
        episodes = selected_episodes if selected_episodes is not None else range(meta.total_episodes)
        keys = [key for _, key in roles]
        found = nonfinite_frames(self.dataset.hf_dataset, keys)
        if found:
            episodes = self._drop_nonfinite(found, episodes)
            self.dataset = open_dataset(episodes)
        # the tasks of the selected episodes, in the dataset's order
        selected = {task for e in episodes for task in meta.episodes[int(e)]["tasks"]}
        self.tasks = [task for task in meta.tasks.index if task in selected]
        self.stats = low_dim_stats(self.dataset, config.state_key, config.action_key, sim_key)
        check_stats_finite(self.stats, config.root or config.repo_id)
        self.table = LowDimTable(
            self.dataset, config.state_key, config.action_key, sim_key, config.chunk_size
        )
        self.frames = FrameReader(
            self.dataset, self.cameras, config.image_size, self.table, config.video_backend
        )
        self.image_shapes = self.frames.shapes  # {camera: (h, w)} as training reads them
        self.cache = None
        if config.cache_frames:
            self.cache = FrameCache(self.frames, len(self.table), num_workers=min(4, os.cpu_count() or 1))

    def _drop_nonfinite(self, found: list, episodes) -> list[int]:
        """The episodes without non-finite values, or an error naming where they are."""
        where = self.config.root or self.config.repo_id
        lines = "; ".join(item.describe() for item in found)
        if not self.config.drop_nonfinite_episodes:
            raise ValueError(
                f"{where}: {lines}. Fix the data, or drop these episodes with "
                "--dataset.drop_nonfinite_episodes true"
            )
        bad = bad_episodes(found)
        kept = [int(e) for e in episodes if int(e) not in bad]
        if not kept:
            raise ValueError(f"{where}: every selected episode has non-finite values ({lines})")
        warnings.warn(f"{where}: dropped {len(bad)} episode(s) {sorted(bad)[:10]}: {lines}", stacklevel=3)
        return kept

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index: int) -> dict:
        images = self.cache.frames(index) if self.cache is not None else self.frames.frame(index)
        return {"images": images, **self.table.sample(index)}
