"""Every sample of a LeRobot dataset decoded once and kept in RAM, for fast epochs on a CPU.

Video decoding dominates CPU training on small models: each random access seeks and decodes a few
frames per camera. With `dataset.cache_frames: true` the frames are decoded once, resized and stored
as uint8 (N x cameras x 3 x size x size bytes: 2 cameras of 4,500 frames at 64 px are 110 MB), and
the action chunks are cut from the episode's actions exactly as lerobot's delta_timestamps would
(indices past the episode end repeat its last action and are marked as padding).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from dvla.data.images import resize_image


class _DecodedFrames(torch.utils.data.Dataset):
    """Index -> {camera: uint8 (3, size, size)} read through the LeRobotDataset."""

    def __init__(self, chunks):
        self.chunks = chunks

    def __len__(self) -> int:
        return len(self.chunks.dataset)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        item = self.chunks.dataset[index]
        size = self.chunks.config.image_size
        return {
            name: (resize_image(item[key], size) * 255).round().to(torch.uint8)
            for name, key in self.chunks.cameras.items()
        }


class FrameCache:
    """Images, state, task and action chunks of every sample of a LeRobotChunks, in memory."""

    def __init__(self, chunks, num_workers: int = 1, batch_size: int = 64):
        config, dataset = chunks.config, chunks.dataset
        columns = [config.state_key, config.action_key, "episode_index", "task_index"]
        if config.sim_state_key:
            columns.append(config.sim_state_key)
        table = dataset.hf_dataset.select_columns(columns).with_format("numpy")[:]
        n = len(table["episode_index"])

        def column(key: str) -> torch.Tensor:  # (N, width) float32
            return torch.from_numpy(np.asarray(table[key], np.float32).reshape(n, -1))

        self.state = column(config.state_key)
        self.sim_state = column(config.sim_state_key) if config.sim_state_key else None
        self.actions = column(config.action_key)
        episodes = np.asarray(table["episode_index"])
        starts = np.flatnonzero(np.r_[True, episodes[1:] != episodes[:-1]])  # first frame of each run
        if len(np.unique(episodes[starts])) != len(starts):  # an episode split into several runs
            raise ValueError("frames are not grouped by episode; set dataset.cache_frames false")
        # last frame index of each frame's episode: (N,)
        ends = np.r_[starts[1:], n] - 1
        self.episode_end = torch.from_numpy(np.repeat(ends, np.diff(np.r_[starts, n])))
        tasks = dataset.meta.tasks  # DataFrame: index = task string, column task_index
        names = {int(i): task for task, i in zip(tasks.index, tasks["task_index"], strict=True)}
        self.tasks = [names[int(i)] for i in np.asarray(table["task_index"])]
        self.chunk_size = config.chunk_size
        self.images = self._decode(chunks, num_workers, batch_size)  # {camera: uint8 (N, 3, s, s)}

    @staticmethod
    def _decode(chunks, num_workers: int, batch_size: int) -> dict[str, torch.Tensor]:
        loader = DataLoader(_DecodedFrames(chunks), batch_size=batch_size, num_workers=num_workers)
        parts: dict[str, list[torch.Tensor]] = {name: [] for name in chunks.cameras}
        with tqdm(total=len(chunks.dataset), desc="caching frames", unit="frame") as bar:
            for batch in loader:
                for name, images in batch.items():
                    parts[name].append(images)
                bar.update(len(next(iter(batch.values()))))
        return {name: torch.cat(images) for name, images in parts.items()}

    @property
    def nbytes(self) -> int:
        return sum(images.numel() for images in self.images.values())

    def sample(self, index: int) -> dict:
        """The same dict LeRobotChunks.__getitem__ returns, without decoding video."""
        offsets = torch.arange(self.chunk_size)  # (H,)
        wanted = index + offsets
        end = int(self.episode_end[index])
        sample = {
            "images": {name: images[index].float() / 255 for name, images in self.images.items()},
            "state": self.state[index].clone(),  # (S,)
            "task": self.tasks[index],
            "actions": self.actions[wanted.clamp(max=end)],  # (H, D)
            "actions_is_pad": wanted > end,  # (H,)
        }
        if self.sim_state is not None:
            sample["sim_state"] = self.sim_state[index].clone()  # (E,)
        return sample
