"""The factored discrete head: long chunks as few backbone tokens, each carrying several dimensions.

The discrete head gives every (step, dimension) its own backbone token: a 100-step chunk of 14-D
ALOHA actions is 1400 target tokens, and attention over them costs every denoising step. Here one
backbone token carries `dims_per_token` dimensions of one step (all of them by default: 100
tokens for that chunk). Each dimension is still its own discrete variable, hidden and revealed on
its own by the same masked-diffusion loss and parallel decoder: a token's input is the sum of its
dimensions' value embeddings (a hidden one has its dimension's [MASK] embedding), its output one
distribution over the bins per dimension. So inpainting and per-dimension constraints work as for
the discrete head; the backbone only sees D / dims_per_token times fewer tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from dvla.action_head.base import (
    ActionHead,
    HeadConfig,
    HeadSpec,
    TrainingTarget,
    constrained_block,
    hide_chunk,
    register_head,
)
from dvla.action_head.tokenizer import ActionTokenizer
from dvla.backbone.decoder import DecodeConfig, decode
from dvla.backbone.loss import masked_diffusion_loss


@HeadConfig.register_subclass("factored")
@dataclass
class FactoredHeadConfig(HeadConfig):
    """Several action dimensions per backbone token, each in its own bins."""

    RUN_FIELDS: ClassVar[tuple[str, ...]] = ("full_mask_fraction",)

    # Uniform bins per action dimension over the normalised [-1, 1] (the head's own embeddings:
    # no action tokens are added to the backbone's vocabulary).
    levels: int = 256
    # Dimensions of one step per backbone token; None = all of them (one token per step). Must
    # divide the action dimension (14-D ALOHA: 1, 2, 7 or 14).
    dims_per_token: int | None = None
    # Fraction of samples whose whole chunk is hidden (t = 1), as for the discrete head.
    full_mask_fraction: float = 0.0

    def __post_init__(self):
        if self.levels < 2:
            raise ValueError(f"head.levels must be >= 2, got {self.levels}")
        if self.dims_per_token is not None and self.dims_per_token < 1:
            raise ValueError(f"head.dims_per_token must be >= 1 (or unset), got {self.dims_per_token}")
        if not 0.0 <= self.full_mask_fraction <= 1.0:
            raise ValueError(f"head.full_mask_fraction must be in [0, 1], got {self.full_mask_fraction}")


@register_head("factored")
class FactoredHead(ActionHead):
    def __init__(self, config: FactoredHeadConfig, spec: HeadSpec):
        super().__init__(config, spec)
        d = spec.action_dim
        self.group = config.dims_per_token or d
        if d % self.group:
            raise ValueError(
                f"head.dims_per_token {self.group} must divide the action dimension {d} "
                f"(e.g. {[g for g in range(1, d + 1) if d % g == 0]})"
            )
        self.levels = config.levels
        self.tokens = ActionTokenizer(-torch.ones(d), torch.ones(d), config.levels)
        # value v of dimension j (v = levels: hidden) -> embedding row j * (levels + 1) + v
        self.values = nn.Embedding(d * (config.levels + 1), spec.width)
        self.position = nn.Embedding(self.target_length, spec.width)  # which token of the chunk
        self.readout = nn.Linear(spec.width, self.group * config.levels)
        nn.init.normal_(self.values.weight, std=0.02)
        nn.init.normal_(self.position.weight, std=0.02)

    @property
    def target_length(self) -> int:
        return self.spec.chunk_size * self.spec.action_dim // self.group

    def embed(self, values: torch.Tensor) -> torch.Tensor:
        """Per-dimension values (B, H*D) in [0, levels] (levels = hidden) -> tokens (B, T, d)."""
        b, n = values.shape
        dims = torch.arange(n, device=values.device) % self.spec.action_dim  # (H*D,)
        rows = self.values(dims * (self.levels + 1) + values)  # (B, H*D, d)
        tokens = rows.view(b, n // self.group, self.group, -1).sum(2)  # (B, T, d)
        return tokens + self.position.weight

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states (B, T, d) -> per-dimension logits (B, H*D, levels)."""
        return self.readout(hidden).reshape(hidden.shape[0], -1, self.levels)

    def training_target(self, actions, is_pad, generator=None) -> TrainingTarget:
        values = self.tokens.encode(actions).flatten(1)  # (B, H*D) in [0, levels)
        c = self.config
        noisy, masked, valid, t = hide_chunk(
            values, is_pad, self.spec.action_dim, c.levels, c.full_mask_fraction, generator
        )
        extras = {"values": values, "valid": valid, "t": t, "masked": masked}
        return TrainingTarget(self.embed(noisy), extras)

    def loss(self, hidden, target, actions, is_pad, generator=None):
        x = target.extras
        logits = self.logits(hidden)  # (B, H*D, levels)
        return masked_diffusion_loss(logits, x["values"], x["masked"] & x["valid"], x["t"], x["valid"])

    def check_decode(self, decode_config: DecodeConfig) -> None:
        n = self.spec.chunk_size * self.spec.action_dim
        if decode_config.autoregressive:
            raise ValueError(
                "the factored head decodes in parallel only; for one value per forward use "
                f"--decode.steps {n} (or the discrete head's autoregressive mode)"
            )
        if decode_config.steps > n:
            raise ValueError(f"decode.steps {decode_config.steps} > the {n} action values of a chunk")

    def sample(self, backbone, decode_config, generator=None, use_cache=True, constraint=None):
        """As the discrete head: known steps are fixed values, bounds allowed-value masks."""
        h, d = self.spec.chunk_size, self.spec.action_dim
        device = backbone.prefix.valid.device
        batch = backbone.batch_size
        block, allowed = constrained_block(self.tokens, constraint, batch, h, self.levels, device)
        pass_ = backbone.target_hidden if use_cache else backbone.full_hidden
        result = decode(
            lambda values: self.logits(pass_(self.embed(values))),
            block,
            self.levels,
            decode_config,
            allowed=allowed,
            generator=generator,
        )
        self.trace = result if decode_config.record_history else None
        actions = self.tokens.decode(result.tokens.view(-1, h, d))
        return (constraint.clamp(actions) if constraint else actions), result.forwards
