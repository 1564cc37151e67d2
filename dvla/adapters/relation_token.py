"""A question-conditioned relation network over the image tokens (Santoro et al. 2017), as one token.

"Is the red cube left of the blue sphere?" needs two objects found and their positions compared.
Through attention alone that is a chain of steps none of which helps the answer until all work.
Here one MLP reads every ordered pair of image tokens together with the pooled question, so "this
token shows the red cube, that one the blue sphere, and the first is left of the second" is a single
learned function; the pairs' mean becomes one more prefix token after the image tokens. Questions
only. Measured effect (spatial questions stayed at chance): docs/adapters.md#relation_token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dvla.adapters.base import Adapter, Applies, CoreSpec, PrefixInputs, Slot, register_adapter
from dvla.adapters.text_pooling import TextPooling


@dataclass
class RelationTokenConfig:
    """The relation token."""

    # Attention queries the question is pooled with.
    queries: int = 4
    # Width of the pair MLP.
    hidden: int = 256

    def __post_init__(self):
        if self.queries < 0 or self.hidden < 1:
            raise ValueError("adapters.relation_token needs queries >= 0 and hidden >= 1")


@register_adapter("relation_token", RelationTokenConfig)
class RelationToken(Adapter):
    """image tokens (B, N, d), text embeddings (B, L, d) with validity (B, L) -> (B, 1, d)."""

    applies_to = Applies.QUESTION
    slot = Slot.AFTER_IMAGES

    def __init__(self, config: RelationTokenConfig, core: CoreSpec):
        super().__init__(config, core)
        width, hidden = core.width, config.hidden
        self.pool = TextPooling(width, config.queries, core.max_text_tokens)
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

    def prefix_tokens(self, inputs: PrefixInputs) -> torch.Tensor:
        return self(inputs.images, inputs.text, inputs.obs.text_valid)  # reads the modulated tokens
