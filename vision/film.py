"""Language-conditioned image tokens (FiLM, Perez et al. 2018; RT-1 conditions its encoder the same way).

The instruction or question scales and shifts every image token channel-wise before the backbone
reads them, so "is there a red cube?" can light up the tokens that show one in a single step,
instead of the backbone having to discover that comparison through attention alone.
"""

from __future__ import annotations

import torch
from torch import nn


class TextPooling(nn.Module):
    """text embeddings (B, L, d) with validity (B, L) -> (B, out_dim).

    queries = 0 is the mean of the valid embeddings, which cannot tell "the red cube left of the blue
    sphere" from "the blue sphere left of the red cube"; queries = Q is Q learned attention queries
    over the embeddings plus a learned embedding of each position (up to max_len), concatenated, so
    the words' roles come through too."""

    def __init__(self, width: int, queries: int = 0, max_len: int = 32):
        super().__init__()
        self.out_dim = width * max(queries, 1)
        self.queries = None
        if queries:
            self.queries = nn.Parameter(torch.randn(queries, width) * width**-0.5)
            self.position = nn.Parameter(torch.randn(max_len, width) * 0.02)
            self.key_norm = nn.LayerNorm(width)

    def forward(self, text: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        if self.queries is None:
            weights = valid.to(text.dtype)[..., None]  # (B, L, 1)
            return (text * weights).sum(1) / weights.sum(1).clamp(min=1)  # (B, d)
        keys = self.key_norm(text + self.position[: text.shape[1]])  # (B, L, d)
        scores = torch.einsum("bld,qd->bql", keys, self.queries.to(keys.dtype))  # (B, Q, L)
        scores = scores.masked_fill(~valid[:, None].to(scores.device), float("-inf"))
        weights = scores.float().softmax(-1).nan_to_num().to(text.dtype)  # no valid token: zeros
        return torch.einsum("bql,bld->bqd", weights, text).flatten(1)  # (B, Q * d)


class TextFiLM(nn.Module):
    """image tokens (B, N, d), text embeddings (B, L, d) with validity (B, L) -> (B, N, d), the
    text pooled by `TextPooling(width, queries, max_len)`."""

    def __init__(self, width: int, queries: int = 0, max_len: int = 32):
        super().__init__()
        self.pool = TextPooling(width, queries, max_len)
        self.norm = nn.LayerNorm(self.pool.out_dim)
        self.to_scale_shift = nn.Sequential(
            nn.Linear(self.pool.out_dim, width), nn.GELU(), nn.Linear(width, 2 * width)
        )
        nn.init.zeros_(self.to_scale_shift[-1].weight)  # starts as the identity
        nn.init.zeros_(self.to_scale_shift[-1].bias)

    def forward(self, image_tokens: torch.Tensor, text: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        scale, shift = self.to_scale_shift(self.norm(self.pool(text, valid))).chunk(2, dim=-1)  # (B, d) each
        return image_tokens * (1 + scale[:, None]) + shift[:, None]
