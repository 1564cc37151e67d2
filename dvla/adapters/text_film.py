"""Question-conditioned image tokens (FiLM, Perez et al. 2018; RT-1 conditions its encoder the same way).

The question scales and shifts every image token channel-wise before the backbone reads them, so
"is there a red cube?" can light up the tokens that show one in a single step, instead of the
backbone having to discover that comparison through attention alone. Starts as the identity.
Questions only: robot observations skip it. Measured effect: docs/adapters.md#text_film.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dvla.adapters.base import Adapter, Applies, CoreSpec, PrefixInputs, register_adapter
from dvla.adapters.text_pooling import TextPooling


@dataclass
class TextFiLMConfig:
    """FiLM of the image tokens by the question."""

    # How the question is pooled: 0 = the mean of its embeddings (blind to word order); N = N learned
    # attention queries plus learned positions, so "is the red cube left of the blue sphere?" and "is
    # the blue sphere left of the red cube?" condition differently.
    queries: int = 0

    def __post_init__(self):
        if self.queries < 0:
            raise ValueError(f"adapters.text_film.queries must be >= 0, got {self.queries}")


@register_adapter("text_film", TextFiLMConfig)
class TextFiLM(Adapter):
    """image tokens (B, N, d), text embeddings (B, L, d) with validity (B, L) -> (B, N, d)."""

    applies_to = Applies.QUESTION

    def __init__(self, config: TextFiLMConfig, core: CoreSpec):
        super().__init__(config, core)
        width = core.width
        self.pool = TextPooling(width, config.queries, core.max_text_tokens)
        self.norm = nn.LayerNorm(self.pool.out_dim)
        self.to_scale_shift = nn.Sequential(
            nn.Linear(self.pool.out_dim, width), nn.GELU(), nn.Linear(width, 2 * width)
        )
        nn.init.zeros_(self.to_scale_shift[-1].weight)  # starts as the identity
        nn.init.zeros_(self.to_scale_shift[-1].bias)

    def forward(self, image_tokens: torch.Tensor, text: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        scale, shift = self.to_scale_shift(self.norm(self.pool(text, valid))).chunk(2, dim=-1)  # (B, d) each
        return image_tokens * (1 + scale[:, None]) + shift[:, None]

    def modulate_images(self, inputs: PrefixInputs) -> torch.Tensor:
        return self(inputs.images, inputs.text, inputs.obs.text_valid)
