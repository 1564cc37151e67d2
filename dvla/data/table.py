"""The low-dimensional columns of a LeRobot dataset, read once into memory.

State, actions, tasks and timestamps of every selected frame are a few MB even for hub-sized
datasets; action chunks are cut from them exactly as lerobot's `delta_timestamps` would (indices
past the episode's last frame repeat it and are marked as padding), without touching any image.
"""

from __future__ import annotations

import numpy as np
import torch


class LowDimTable:
    """Per-row state, actions, simulator state, task, episode and timestamp of a LeRobotDataset."""

    def __init__(self, dataset, state_key: str, action_key: str, sim_state_key: str | None, chunk_size: int):
        columns = [state_key, action_key, "episode_index", "task_index", "timestamp"]
        if sim_state_key:
            columns.append(sim_state_key)
        table = dataset.hf_dataset.select_columns(columns).with_format("numpy")[:]
        n = len(table["episode_index"])

        def column(key: str) -> torch.Tensor:  # (N, width) float32
            return torch.from_numpy(np.asarray(table[key], np.float32).reshape(n, -1))

        self.state = column(state_key)
        self.actions = column(action_key)
        self.sim_state = column(sim_state_key) if sim_state_key else None
        self.timestamp = np.asarray(table["timestamp"], np.float64)  # (N,) seconds into the episode
        self.episode_index = np.asarray(table["episode_index"]).astype(np.int64)  # (N,)
        starts = np.flatnonzero(np.r_[True, self.episode_index[1:] != self.episode_index[:-1]])
        if len(np.unique(self.episode_index[starts])) != len(starts):  # an episode split into runs
            raise ValueError(
                "the dataset's frames are not grouped by episode (LeRobot writes each episode's frames "
                "together); rewrite it with lerobot's dataset tools"
            )
        self._starts = starts
        ends = np.r_[starts[1:], n] - 1  # last row of each episode
        self.episode_end = torch.from_numpy(np.repeat(ends, np.diff(np.r_[starts, n])))  # (N,)
        tasks = dataset.meta.tasks  # DataFrame: index = task string, column task_index
        names = {int(i): task for task, i in zip(tasks.index, tasks["task_index"], strict=True)}
        self.tasks = [names[int(i)] for i in np.asarray(table["task_index"])]
        self.chunk_size = chunk_size

    def __len__(self) -> int:
        return len(self.tasks)

    def episode_ranges(self) -> list[tuple[int, int]]:
        """(first row, last row) of each episode, in row order."""
        return [(int(s), int(self.episode_end[s])) for s in self._starts]

    def sample(self, index: int) -> dict:
        """state (S,), task, actions (H, D), actions_is_pad (H,)[, sim_state (E,)] of one row."""
        wanted = index + torch.arange(self.chunk_size)  # (H,)
        end = int(self.episode_end[index])
        sample = {
            "state": self.state[index].clone(),
            "task": self.tasks[index],
            "actions": self.actions[wanted.clamp(max=end)],
            "actions_is_pad": wanted > end,
        }
        if self.sim_state is not None:
            sample["sim_state"] = self.sim_state[index].clone()
        return sample
