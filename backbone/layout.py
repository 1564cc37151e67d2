"""Attention layout of a [prefix | target] sequence.

The prefix (image tokens, text, state) attends within itself; the target block (action or answer
tokens) attends to the prefix and to the whole target. Prefix states therefore never depend on the
target, and the prefix keys/values are computed once and reused at every denoising step.
"""

from __future__ import annotations

import torch


def prefix_positions(prefix_valid: torch.Tensor) -> torch.Tensor:
    """RoPE positions of prefix tokens (B, P): consecutive over valid tokens (padding repeats)."""
    return (prefix_valid.long().cumsum(1) - 1).clamp(min=0)


def target_positions(prefix_valid: torch.Tensor, target_len: int) -> torch.Tensor:
    """RoPE positions of target tokens (B, T): they follow each sample's valid prefix."""
    start = prefix_valid.long().sum(1, keepdim=True)  # (B, 1)
    return start + torch.arange(target_len, device=prefix_valid.device)  # (B, T)


def prefix_mask(prefix_valid: torch.Tensor) -> torch.Tensor:
    """Prefix queries over prefix keys (B, 1, P, P): valid keys only (a padded query sees itself,
    so no softmax row is empty)."""
    p = prefix_valid.shape[1]
    mask = prefix_valid[:, None, None, :].expand(-1, 1, p, -1)
    eye = torch.eye(p, dtype=torch.bool, device=prefix_valid.device)
    return mask | eye


def target_mask(prefix_valid: torch.Tensor, target_len: int) -> torch.Tensor:
    """Target queries over [prefix | target] keys (B, 1, T, P+T): every valid prefix key, the whole target."""
    b = prefix_valid.shape[0]
    target_keys = torch.ones(b, target_len, dtype=torch.bool, device=prefix_valid.device)
    keys = torch.cat([prefix_valid, target_keys], dim=1)  # (B, P+T)
    return keys[:, None, None, :].expand(-1, 1, target_len, -1)


def full_mask(prefix_valid: torch.Tensor, target_len: int) -> torch.Tensor:
    """The whole sequence at once (B, 1, P+T, P+T), as used in training."""
    p = prefix_valid.shape[1]
    top = torch.cat(  # prefix rows: no target keys
        [
            prefix_mask(prefix_valid),
            torch.zeros(
                prefix_valid.shape[0], 1, p, target_len, dtype=torch.bool, device=prefix_valid.device
            ),
        ],
        dim=-1,
    )
    return torch.cat([top, target_mask(prefix_valid, target_len)], dim=2)
