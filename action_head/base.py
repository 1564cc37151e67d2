"""The action-head interface and its registry: the head owns the target block of robot batches.

A head says what the backbone reads after the prefix in training (`training_target`), turns the
backbone's hidden states of that block into a loss (`loss`), and fills a chunk at inference
(`sample`). Heads are picked by `model.head.type`; a new head is one module that registers a
config (`@HeadConfig.register_subclass`) and a class (`@register_head`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import draccus
import torch
from torch import nn

from dvla.backbone.decoder import DecodeConfig
from dvla.backbone.schedule import mask_tokens, sample_times


@dataclass
class HeadConfig(draccus.ChoiceRegistry):
    """Base of the heads' configs; `type` in a config file picks the subclass."""

    # Fields a fine-tuning run takes from its own config (the rest come from the checkpoint).
    RUN_FIELDS: ClassVar[tuple[str, ...]] = ()

    @property
    def type(self) -> str:
        return self.get_choice_name(type(self))

    @classmethod
    def default_choice_name(cls) -> str:
        """`--model.head.bins 64` without a `type` means the default head."""
        return "discrete"


class Vocabulary:
    """The backbone's shared vocabulary as a head sees it: [text | action bins | MASK].

    Holds a reference to the backbone without registering it as a submodule (its weights belong
    to the model, not the head)."""

    def __init__(self, backbone: nn.Module, text_size: int, bins: int):
        self._backbone = [backbone]
        self.text_size, self.bins = text_size, bins
        self.action_offset = text_size
        self.mask_id = text_size + bins

    @property
    def backbone(self) -> nn.Module:
        return self._backbone[0]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.backbone.embed(ids)

    def bin_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the action bins only: (B, T, d) -> (B, T, bins)."""
        w = self.backbone.lm_head.weight[self.action_offset : self.action_offset + self.bins]
        return hidden @ w.T


@dataclass
class HeadSpec:
    """What a head may know of the core model when it is built."""

    width: int
    chunk_size: int
    action_dim: int
    vocabulary: Vocabulary


@dataclass
class TrainingTarget:
    """The target block of one training batch: its embeddings (B, T, d) and what the loss needs."""

    embeds: torch.Tensor
    extras: dict[str, Any]


@dataclass
class ChunkConstraint:
    """What a decoded chunk must respect, in normalised units ([-1, 1] = the data's q01..q99).

    `known` fixes the chunk's first K steps (inpainting: a continuation starts with the actions the
    robot executes while it is computed); `low` / `high` bound every action dimension, and a decoded
    chunk never leaves them (heads enforce this by construction, see each head's `sample`)."""

    known: torch.Tensor | None = None  # (B, K, D), K <= H
    low: torch.Tensor | None = None  # (D,)
    high: torch.Tensor | None = None  # (D,)

    def check(self, batch: int, chunk: int, action_dim: int) -> None:
        if self.known is not None:
            b, k, d = self.known.shape
            if b != batch or d != action_dim or not 0 < k <= chunk:
                raise ValueError(
                    f"known actions have shape {tuple(self.known.shape)}; expected ({batch}, K, "
                    f"{action_dim}) with 1 <= K <= the chunk's {chunk} steps"
                )
            if not torch.isfinite(self.known).all():
                raise ValueError("known actions contain NaN or inf")
        if (self.low is None) != (self.high is None):
            raise ValueError("give both low and high bounds, or neither")
        if self.low is not None:
            if self.low.shape != (action_dim,) or self.high.shape != (action_dim,):
                raise ValueError(f"bounds must have shape ({action_dim},), got {tuple(self.low.shape)}")
            if (self.low > self.high).any():
                raise ValueError(f"a lower bound exceeds its upper bound: {self.low} > {self.high}")

    def clamp(self, actions: torch.Tensor) -> torch.Tensor:
        """actions (B, H, D) inside the bounds (the identity without bounds)."""
        if self.low is None:
            return actions
        return torch.maximum(torch.minimum(actions, self.high.to(actions)), self.low.to(actions))


def constrained_block(tokenizer, constraint: ChunkConstraint | None, batch: int, chunk: int, hidden: int,
                      device) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """The block a per-value discrete head decodes: (B, H*D) all `hidden` but the known steps' values,
    and the allowed values per position (H*D, V) under the bounds (None = all)."""
    d = tokenizer.action_dim
    block = torch.full((batch, chunk * d), hidden, device=device)
    if constraint is None:
        return block, None
    constraint.check(batch, chunk, d)
    if constraint.known is not None:
        known = tokenizer.encode(constraint.known.float().cpu()).flatten(1) - tokenizer.offset  # (B, K*D)
        block[:, : known.shape[1]] = known.to(device)
    allowed = None
    if constraint.low is not None:
        per_dim = tokenizer.allowed_bins(constraint.low.float().cpu(), constraint.high.float().cpu())
        allowed = per_dim.repeat(chunk, 1).to(device)  # (H*D, V): position i is dimension i % D
    return block, allowed


@dataclass
class Backbone:
    """The passes a head may ask for at inference, closed over one observation's prefix."""

    target_hidden: Callable[[torch.Tensor], torch.Tensor]  # target embeds (B, T, d) -> hidden (B, T, d)
    full_hidden: Callable[[torch.Tensor], torch.Tensor]  # the same, recomputing the prefix
    prefix: Any  # the prefix cache (dvla.model.vla.Prefix)
    batch_size: int


class ActionHead(nn.Module):
    """Base class of action heads."""

    name: ClassVar[str]

    def __init__(self, config: HeadConfig, spec: HeadSpec):
        super().__init__()
        self.config, self.spec = config, spec

    @property
    def target_length(self) -> int:
        raise NotImplementedError

    def training_target(self, actions: torch.Tensor, is_pad: torch.Tensor, generator=None) -> TrainingTarget:
        """actions (B, H, D) in [-1, 1], is_pad (B, H) -> what the backbone reads after the prefix."""
        raise NotImplementedError

    def loss(
        self, hidden: torch.Tensor, target: TrainingTarget, actions, is_pad, generator=None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """hidden (B, T, d) of the target block -> the head's loss and its metrics."""
        raise NotImplementedError

    def check_decode(self, decode: DecodeConfig) -> None:
        """Refuse decoding settings this head cannot honour (names the limit)."""

    # The last parallel decode's DecodeResult when DecodeConfig.record_history was set (its blocks
    # are per-value tokens (B, H*D), hidden = the head's `tokens.bins`), for visualisation.
    trace = None

    def sample(
        self,
        backbone: Backbone,
        decode: DecodeConfig,
        generator=None,
        use_cache: bool = True,
        constraint: ChunkConstraint | None = None,
    ) -> tuple[torch.Tensor, int]:
        """An action chunk (B, H, D) in [-1, 1] and the backbone forwards it took after the prefix;
        `constraint`: known first steps and bounds it must respect."""
        raise NotImplementedError


def hide_chunk(values, is_pad, action_dim: int, hidden: int, full_mask_fraction: float, generator=None):
    """The masked-diffusion corruption of a chunk of per-value tokens (B, H*D): a time t per sample
    (t = 1, the whole chunk, for a `full_mask_fraction` of them), each value hidden (set to
    `hidden`) with probability t, and values past the episode end always hidden.
    Returns (noisy, masked, valid, t)."""
    valid = (~is_pad).repeat_interleave(action_dim, dim=1)  # (B, H*D)
    t = sample_times(values.shape[0], generator=generator)  # (B,)
    if full_mask_fraction > 0:  # these samples hide the whole chunk
        full = torch.rand(t.shape, generator=generator) < full_mask_fraction  # (B,)
        t = torch.where(full, torch.ones_like(t), t)
    t = t.to(values.device)
    noisy, masked = mask_tokens(values, t, hidden, generator=generator)
    noisy = noisy.masked_fill(~valid, hidden)  # past the episode end: always hidden
    return noisy, masked, valid, t


HEADS: dict[str, type[ActionHead]] = {}


def register_head(name: str):
    """Class decorator: the head built for `model.head.type == name`."""

    def register(cls: type[ActionHead]) -> type[ActionHead]:
        if name in HEADS:
            raise ValueError(f"an action head named {name!r} is already registered")
        cls.name = name
        HEADS[name] = cls
        return cls

    return register


def build_head(config: HeadConfig, spec: HeadSpec) -> ActionHead:
    if config.type not in HEADS:
        raise ValueError(f"unknown action head {config.type!r}; registered: {sorted(HEADS)}")
    return HEADS[config.type](config, spec)
