"""A question-conditioned relation network over the image tokens (Santoro et al. 2017).

"Is the red cube left of the blue sphere?" needs two objects found and their positions compared.
Through attention alone that is a chain of steps none of which helps the answer until all work
(spatial questions stayed at chance in 10,000 steps). Here one MLP reads every ordered pair of image
tokens together with the pooled question, so "this token shows the red cube, that one the blue
sphere, and the first is left of the second" is a single learned function; the pairs' sum becomes
one more prefix token the backbone attends to.
"""

from __future__ import annotations

import torch
from torch import nn

from dvla.vision.film import TextPooling


class RelationToken(nn.Module):
    """image tokens (B, N, d), text embeddings (B, L, d) with validity (B, L) -> (B, 1, d)."""

    def __init__(self, width: int, queries: int, max_len: int, hidden: int = 256):
        super().__init__()
        self.pool = TextPooling(width, queries, max_len)
        self.norm = nn.LayerNorm(width)
        # g([o_i, o_j, q]) = MLP; its first layer split by input so no (B, N, N, 3d) tensor is built
        self.first = nn.Linear(width, hidden)
        self.second = nn.Linear(width, hidden, bias=False)
        self.question = nn.Sequential(nn.LayerNorm(self.pool.out_dim), nn.Linear(self.pool.out_dim, hidden))
        self.pair = nn.Sequential(nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, hidden))
        self.out = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, width))

    def forward(self, image_tokens: torch.Tensor, text: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        x = self.norm(image_tokens)
        q = self.question(self.pool(text, valid))  # (B, h)
        pairs = self.first(x)[:, :, None] + self.second(x)[:, None] + q[:, None, None]  # (B, N, N, h)
        summed = self.pair(pairs).mean(dim=(1, 2))  # (B, h)
        return self.out(summed)[:, None]  # (B, 1, d)
