"""Separate batch-norm running statistics for question images in a co-trained vision encoder.

A CNN's batch norms normalise each training batch by its own statistics but, at inference, by
running averages over every batch seen. Co-training alternates robot and VQA batches, so those
averages blend two kinds of image (robot cameras, rendered question scenes) that the network never
saw mixed in training; robot images are then normalised with statistics that are mostly VQA ones.
This module keeps a second set for question images (as in domain-specific batch norm, Chang et
al. 2019); the affine weights stay shared.
"""

from __future__ import annotations

from contextlib import contextmanager

from torch import nn

STATS = ("running_mean", "running_var", "num_batches_tracked")


def batch_norms(module: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    """The batch norms of `module` that keep running statistics, in module order."""
    return [
        m
        for m in module.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]


class QuestionNormStats(nn.Module):
    """Holds the question images' running statistics of every batch norm of `backbone` as buffers
    (saved with the model); `active()` swaps them into the batch norms for one forward pass."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self._norms = batch_norms(backbone)  # a plain list: the modules stay registered in backbone
        for i, norm in enumerate(self._norms):
            for stat in STATS:
                self.register_buffer(f"{stat}_{i}", getattr(norm, stat).clone())

    def __len__(self) -> int:
        return len(self._norms)

    def _swap(self) -> None:
        for i, norm in enumerate(self._norms):
            for stat in STATS:
                mine = f"{stat}_{i}"
                norm._buffers[stat], self._buffers[mine] = self._buffers[mine], norm._buffers[stat]

    @contextmanager
    def active(self):
        """Within the block the batch norms read (and in training update) the question statistics."""
        self._swap()
        try:
            yield
        finally:
            self._swap()
