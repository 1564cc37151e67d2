"""The robot data of a run: one LeRobot dataset, or several trained on as one.

Datasets trained together must agree on what the model sees and does: the same camera names
(map keys with `cameras`), state and action dimensions, image size, chunk length and fps (a chunk of
16 actions is 0.5 s at 30 fps but 1.6 s at 10 fps). Normalisation statistics are computed over
all their frames together.
"""

from __future__ import annotations

import numpy as np
import torch

from dvla.data.lerobot import LeRobotChunks, LeRobotDataConfig
from dvla.data.stats import low_dim_values, sim_state_stats, stats_of
from dvla.processor import ACTION_KEY, SIM_STATE_KEY, STATE_KEY


def dataset_name(config: LeRobotDataConfig) -> str:
    return config.repo_id or config.root


class ConcatChunks(torch.utils.data.ConcatDataset):
    """Several LeRobotChunks as one dataset, with the attributes of one (tasks, stats, cameras...)."""

    def __init__(self, parts: list[LeRobotChunks]):
        if not parts:
            raise ValueError("no datasets given")
        first = parts[0]
        for part in parts[1:]:
            _check_compatible(first, part)
        super().__init__(parts)
        self.parts = parts
        self.tasks = list(dict.fromkeys(task for part in parts for task in part.tasks))
        self.cameras, self.fps, self.robot_type = first.cameras, first.fps, first.robot_type
        self.image_shapes = first.image_shapes
        self.state_dim, self.action_dim = first.state_dim, first.action_dim
        self.sim_state_dim = first.sim_state_dim
        states = [low_dim_values(p.dataset, p.config.state_key) for p in parts]  # [(N_i, S)]
        actions = [low_dim_values(p.dataset, p.config.action_key) for p in parts]  # [(N_i, D)]
        self.stats = {
            STATE_KEY: stats_of(np.concatenate(states)),
            ACTION_KEY: stats_of(np.concatenate(actions)),
        }
        if self.sim_state_dim:
            sims = [low_dim_values(p.dataset, p.config.sim_state_key) for p in parts]  # [(N_i, E)]
            self.stats[SIM_STATE_KEY] = sim_state_stats(np.concatenate(sims))


def _check_compatible(first: LeRobotChunks, part: LeRobotChunks) -> None:
    a, b = dataset_name(first.config), dataset_name(part.config)
    checks = {
        "camera names": (sorted(first.cameras), sorted(part.cameras), "map keys to names with `cameras`"),
        "state dimension": (first.state_dim, part.state_dim, "pick a state_key of the same size"),
        "action dimension": (first.action_dim, part.action_dim, "pick an action_key of the same size"),
        "simulator state dimension": (
            first.sim_state_dim,
            part.sim_state_dim,
            "give every dataset a sim_state_key of the same size, or none",
        ),
        "fps": (first.fps, part.fps, "train datasets of different rates in separate runs"),
        "chunk_size": (first.config.chunk_size, part.config.chunk_size, "set the same chunk_size"),
        "image_size": (first.config.image_size, part.config.image_size, "set the same image_size"),
    }
    for what, (x, y, fix) in checks.items():
        if x != y:
            raise ValueError(f"datasets {a} and {b} cannot be trained together: {what} {x} vs {y}; {fix}")
    if first.config.image_size is None:  # native sizes must then agree
        x = {name: tuple(image.shape) for name, image in first[0]["images"].items()}
        y = {name: tuple(image.shape) for name, image in part[0]["images"].items()}
        if x != y:
            raise ValueError(
                f"datasets {a} and {b} cannot be trained together: image shapes {x} vs {y}; set image_size"
            )


def robot_dataset(configs: list[LeRobotDataConfig]) -> LeRobotChunks | ConcatChunks | None:
    """The run's robot dataset: None, one LeRobotChunks, or ConcatChunks of several."""
    if not configs:
        return None
    if len(configs) == 1:
        return LeRobotChunks(configs[0])
    return ConcatChunks([LeRobotChunks(config) for config in configs])
