"""The question pooled into a vector, shared by the question adapters (FiLM, relation, referents)."""

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
