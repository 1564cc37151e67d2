"""A bias-corrected exponential moving average of the weights, for torch's AveragedModel."""

from __future__ import annotations

import torch


def bias_corrected_ema(decay: float):
    """`multi_avg_fn` for `torch.optim.swa_utils.AveragedModel`: after k updates the average weighs
    update j by decay^(k-j), normalised by their sum (Adam's bias correction), so the first
    weights, which a plain EMA keeps at weight decay^k (5% after 3000 steps at 0.999), fade like
    any other step's.

    AveragedModel copies the first update and then calls this with the count before the new one;
    tensors arrive grouped by dtype.
    """

    if not 0.0 <= decay < 1.0:
        raise ValueError(f"ema_decay must be in [0, 1), got {decay}")

    @torch.no_grad()
    def update(averaged: list[torch.Tensor], current: list[torch.Tensor], num_averaged: torch.Tensor):
        k = int(num_averaged) + 1  # this update's index (>= 2)
        weight = (1 - decay) / (1 - decay**k)
        if torch.is_floating_point(averaged[0]):
            torch._foreach_lerp_(averaged, current, weight)
        else:  # integer buffers (counters) are not averaged: they follow the model
            for a, c in zip(averaged, current, strict=True):
                a.copy_(c)

    return update
