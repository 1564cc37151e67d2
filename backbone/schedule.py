"""The masking (noise) schedule of masked diffusion: how much of the target is hidden at time t."""

from __future__ import annotations

import torch


def sample_times(batch: int, eps: float = 1e-3, generator: torch.Generator | None = None) -> torch.Tensor:
    """t in [eps, 1) for each sample, low-discrepancy across the batch (stratified with one offset),
    which lowers the variance of the loss estimate compared with i.i.d. draws. Returns (B,)."""
    if not 0.0 <= eps < 1.0:
        raise ValueError(f"eps must be in [0, 1), got {eps}")
    offset = torch.rand((), generator=generator)
    u = (offset + torch.arange(batch) / batch) % 1.0  # (B,)
    return eps + (1.0 - eps) * u


def mask_tokens(
    targets: torch.Tensor,
    t: torch.Tensor,
    mask_token_id: int,
    maskable: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hide each maskable target token with probability t (linear schedule: alpha_t = 1 - t).

    targets (B, T) token ids, t (B,), maskable (B, T) bool (False for padding). Returns the noisy
    tokens (B, T) and the boolean mask of hidden positions (B, T).
    """
    u = torch.rand(targets.shape, generator=generator).to(targets.device)  # (B, T)
    masked = u < t.to(targets.device)[:, None]
    if maskable is not None:
        masked &= maskable
    noisy = torch.where(masked, torch.full_like(targets, mask_token_id), targets)
    return noisy, masked
