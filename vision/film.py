"""Language-conditioned image tokens (FiLM, Perez et al. 2018; RT-1 conditions its encoder the same way).

The instruction or question scales and shifts every image token channel-wise before the backbone
reads them, so "is there a red cube?" can light up the tokens that show one in a single step,
instead of the backbone having to discover that comparison through attention alone.
"""

from __future__ import annotations

import torch
from torch import nn


class TextFiLM(nn.Module):
    """image tokens (B, N, d), text embeddings (B, L, d) with validity (B, L) -> (B, N, d)."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.to_scale_shift = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, 2 * width))
        nn.init.zeros_(self.to_scale_shift[-1].weight)  # starts as the identity
        nn.init.zeros_(self.to_scale_shift[-1].bias)

    def forward(self, image_tokens: torch.Tensor, text: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        weights = valid.to(text.dtype)[..., None]  # (B, L, 1)
        pooled = (text * weights).sum(1) / weights.sum(1).clamp(min=1)  # (B, d): mean of valid tokens
        scale, shift = self.to_scale_shift(self.norm(pooled)).chunk(2, dim=-1)  # (B, d) each
        return image_tokens * (1 + scale[:, None]) + shift[:, None]
