"""The masked-diffusion training loss (MDLM / LLaDA): cross-entropy on hidden tokens, weighted 1/t."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_diffusion_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    masked: torch.Tensor,
    t: torch.Tensor,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """logits (B, T, V), targets (B, T), masked (B, T) bool, t (B,), valid (B, T) bool.

    loss = sum over hidden tokens of CE / t, divided by the number of valid target tokens: an
    unbiased estimate of the negative ELBO per token under the linear schedule.
    """
    valid = torch.ones_like(masked) if valid is None else valid
    ce = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")  # (B*T,)
    ce = ce.view_as(targets) * masked  # (B, T)
    loss = (ce / t[:, None]).sum() / valid.sum().clamp(min=1)
    with torch.no_grad():
        hidden = masked.sum().clamp(min=1)
        correct = (logits.argmax(-1) == targets) & masked
        metrics = {
            "masked_ce": float(ce.sum() / hidden),
            "masked_accuracy": float(correct.sum() / hidden),
            "mask_fraction": float(masked.sum() / valid.sum().clamp(min=1)),
        }
    return loss, metrics
