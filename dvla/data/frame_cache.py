"""Every frame of the chosen cameras decoded once and kept in RAM, for fast epochs on a CPU.

Decoding dominates CPU training of small models. With `dataset.cache_frames: true` the frames are
decoded once, resized and stored as uint8 (N x cameras x 3 x size x size bytes: 2 cameras of 4,500
frames at 64 px are 110 MB). Videos are decoded a window of an episode at a time (one seek, then
sequential decoding) in worker processes, image features straight from their column.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from dvla.data.frames import FrameReader


class _Windows(torch.utils.data.Dataset):
    """Window i -> (start row, {camera: uint8 (n, 3, s, s)})."""

    def __init__(self, reader: FrameReader):
        self.reader, self.ranges = reader, reader.windows()

    def __len__(self) -> int:
        return len(self.ranges)

    def __getitem__(self, i: int):
        start, stop = self.ranges[i]
        return start, self.reader.window(start, stop)


class FrameCache:
    """uint8 frames of every row of a FrameReader's dataset, in row order."""

    def __init__(self, reader: FrameReader, rows: int, num_workers: int = 1):
        windows = _Windows(reader)
        loader = DataLoader(windows, batch_size=None, num_workers=min(num_workers, len(windows)))
        self.images: dict[str, torch.Tensor] = {}  # {camera: uint8 (N, 3, s, s)}
        with tqdm(total=rows, desc="caching frames", unit="frame") as bar:
            for start, frames in loader:
                for name, images in frames.items():
                    if name not in self.images:
                        self.images[name] = torch.empty((rows, *images.shape[1:]), dtype=torch.uint8)
                    self.images[name][start : start + len(images)] = images
                bar.update(len(next(iter(frames.values()))))

    @property
    def nbytes(self) -> int:
        return sum(images.numel() for images in self.images.values())

    def frames(self, index: int) -> dict[str, torch.Tensor]:
        """{camera: float (3, s, s) in [0, 1]} of one row."""
        return {name: images[index].float() / 255 for name, images in self.images.items()}
