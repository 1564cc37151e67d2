"""Training batches: robot chunks and/or VQA scenes, interleaved in a fixed, resumable pattern.

Micro-batch g of a run is VQA when floor((g + 1) * ratio) > floor(g * ratio): with ratio 0.25 every
fourth batch. Each source has its own shuffled order (ResumableBatchSampler), so the batch seen at
step g depends only on (seed, g) and a resumed run continues exactly.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import DataLoader, Sampler

from dvla.data.images import collate

ROBOT, VQA, PERCEPTION = "robot", "vqa", "perception"


class ResumableBatchSampler(Sampler[list[int]]):
    """Shuffled batches whose order depends only on (seed, epoch): batch g of the run is always the
    same, so a resumed run starts exactly where the interrupted one stopped."""

    def __init__(self, size: int, batch_size: int, seed: int, start_batch: int = 0):
        if size < batch_size:
            raise ValueError(f"the dataset has {size} samples, fewer than batch_size={batch_size}")
        self.size, self.batch_size, self.seed, self.start = size, batch_size, seed, start_batch
        self.per_epoch = size // batch_size  # the last partial batch is dropped

    def __len__(self) -> int:
        return 10**12  # endless: the training loop decides when to stop

    def __iter__(self):
        g = self.start
        while True:
            epoch, offset = divmod(g, self.per_epoch)
            order = torch.randperm(
                self.size, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            )
            for b in range(offset, self.per_epoch):
                yield order[b * self.batch_size : (b + 1) * self.batch_size].tolist()
                g += 1


def vqa_batches_before(g: int, ratio: float) -> int:
    """How many of micro-batches 0 .. g-1 are VQA."""
    return math.floor(g * ratio)


def source_of(g: int, ratio: float) -> str:
    return VQA if vqa_batches_before(g + 1, ratio) > vqa_batches_before(g, ratio) else ROBOT


def make_loader(
    dataset, batch_size: int, seed: int, start_batch: int, num_workers: int, collate_fn=None
) -> DataLoader:
    return DataLoader(
        dataset,
        batch_sampler=ResumableBatchSampler(len(dataset), batch_size, seed, start_batch),
        collate_fn=collate_fn or collate,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        generator=torch.Generator().manual_seed(seed),  # keeps the loader off the global RNG
    )


class MixedBatches:
    """Endless (source, batch) pairs from prepared loaders {ROBOT: ..., VQA: ...} from micro-batch `start`.

    A `perception` loader rides along the robot batches: each robot batch carries its next batch
    under "perception" (so it starts at the number of robot batches already seen)."""

    def __init__(
        self, loaders: dict[str, DataLoader], ratio: float, start: int, perception: DataLoader | None = None
    ):
        self.iterators = {name: iter(loader) for name, loader in loaders.items()}
        self.perception = iter(perception) if perception is not None else None
        self.ratio, self.g = ratio, start

    def __next__(self) -> tuple[str, dict]:
        source = source_of(self.g, self.ratio)
        self.g += 1
        batch = next(self.iterators[source])
        if source == ROBOT and self.perception is not None:
            batch = {**batch, "perception": next(self.perception)}
        return source, batch


def mixing_ratio(has_robot: bool, has_vqa: bool, vqa_ratio: float) -> float:
    """Fraction of VQA micro-batches: 0 robot only, 1 VQA only, else the configured ratio."""
    if has_robot and has_vqa:
        return vqa_ratio
    return 1.0 if has_vqa else 0.0
