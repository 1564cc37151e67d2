"""The discrete action head (default): H*D action tokens in uniform bins, filled by the parallel decoder.

Every action dimension of every chunk step is one token of the backbone's vocabulary (the bins sit
after the text tokens). In training a random share t of them is hidden and predicted (masked
diffusion, weight 1/t); at inference the decoder fills the whole block in a few forwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
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
from dvla.backbone import layout
from dvla.backbone.decoder import DecodeConfig, decode, decode_autoregressive
from dvla.backbone.loss import masked_diffusion_loss


@HeadConfig.register_subclass("discrete")
@dataclass
class DiscreteHeadConfig(HeadConfig):
    """Action tokens in bins, decoded in parallel."""

    RUN_FIELDS: ClassVar[tuple[str, ...]] = ("full_mask_fraction",)

    # Uniform bins per action dimension over the normalised [-1, 1].
    bins: int = 256
    # Fraction of robot samples whose whole chunk is hidden (t = 1) instead of a random share:
    # one-step decoding predicts every action token from the observation alone, which the 1/t
    # weighted loss otherwise rarely asks for (docs/adapters.md, "full-mask fraction").
    full_mask_fraction: float = 0.0

    def __post_init__(self):
        if self.bins < 2:
            raise ValueError(f"head.bins must be >= 2, got {self.bins}")
        if not 0.0 <= self.full_mask_fraction <= 1.0:
            raise ValueError(f"head.full_mask_fraction must be in [0, 1], got {self.full_mask_fraction}")


@register_head("discrete")
class DiscreteHead(ActionHead):
    def __init__(self, config: DiscreteHeadConfig, spec: HeadSpec):
        super().__init__(config, spec)
        self.vocab = spec.vocabulary
        self.tokens = ActionTokenizer(-torch.ones(spec.action_dim), torch.ones(spec.action_dim), config.bins)
        self.step_embed = nn.Embedding(spec.chunk_size, spec.width)  # which step of the chunk
        self.dim_embed = nn.Embedding(spec.action_dim, spec.width)  # which action dimension
        nn.init.normal_(self.step_embed.weight, std=0.02)
        nn.init.normal_(self.dim_embed.weight, std=0.02)

    @property
    def target_length(self) -> int:
        return self.spec.chunk_size * self.spec.action_dim

    def embed(self, bin_tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Action tokens at flattened chunk positions start .. start+n-1: (B, n) bins, with the value
        `bins` for hidden ones -> (B, n, d), plus chunk-step and action-dimension embeddings."""
        d = self.spec.action_dim
        hidden = bin_tokens == self.config.bins
        ids = torch.where(
            hidden, torch.full_like(bin_tokens, self.vocab.mask_id), bin_tokens + self.vocab.action_offset
        )
        pos = torch.arange(start, start + bin_tokens.shape[1], device=ids.device)
        return self.vocab.embed(ids) + self.step_embed(pos // d) + self.dim_embed(pos % d)

    def training_target(self, actions, is_pad, generator=None) -> TrainingTarget:
        bins = self.tokens.encode(actions).flatten(1)  # (B, H*D) in [0, bins)
        c = self.config
        noisy, masked, valid, t = hide_chunk(
            bins, is_pad, self.spec.action_dim, c.bins, c.full_mask_fraction, generator
        )
        extras = {"bins": bins, "valid": valid, "t": t, "masked": masked}
        return TrainingTarget(self.embed(noisy), extras)

    def loss(self, hidden, target, actions, is_pad, generator=None):
        x = target.extras
        logits = self.vocab.bin_logits(hidden)  # (B, H*D, bins)
        return masked_diffusion_loss(logits, x["bins"], x["masked"] & x["valid"], x["t"], x["valid"])

    def check_decode(self, decode: DecodeConfig) -> None:
        n = self.target_length  # each step reveals at least one token
        if not decode.autoregressive and decode.steps > n:
            raise ValueError(
                f"decode.steps {decode.steps} > the {n} action tokens of a chunk: use at most {n}"
            )

    def sample(self, backbone, decode_config, generator=None, use_cache=True, constraint=None):
        """Known steps are fixed tokens the decoder keeps; bounds are allowed-bin masks on every
        position (a bound narrower than a bin also clamps the decoded centre)."""
        h, d = self.spec.chunk_size, self.spec.action_dim
        device = backbone.prefix.valid.device
        block, allowed = constrained_block(self.tokens, constraint, backbone.batch_size, h, self.config.bins,
                                           device)  # fmt: skip
        if decode_config.autoregressive:
            step = self._autoregressive_step(backbone.prefix)
            result = decode_autoregressive(
                step, block, self.config.bins, decode_config, allowed=allowed, generator=generator
            )
        else:
            pass_ = backbone.target_hidden if use_cache else backbone.full_hidden
            result = decode(
                lambda tokens: self.vocab.bin_logits(pass_(self.embed(tokens))),
                block,
                self.config.bins,
                decode_config,
                allowed=allowed,
                generator=generator,
            )
        self.trace = result if decode_config.record_history else None
        actions = self.tokens.decode(result.tokens.view(-1, h, d))
        return (constraint.clamp(actions) if constraint else actions), result.forwards

    @torch.no_grad()
    def first_step_nll(self, hidden_fn, actions, is_pad) -> torch.Tensor:
        """(B,) mean cross-entropy of each sample's true bins with the whole chunk hidden: what the
        first denoising step knows. `hidden_fn(target_embeds)` is the backbone pass."""
        bins = self.tokens.encode(actions).flatten(1)  # (B, H*D)
        valid = (~is_pad).repeat_interleave(self.spec.action_dim, dim=1)  # (B, H*D)
        hidden = hidden_fn(self.embed(torch.full_like(bins, self.config.bins)))  # every token hidden
        logits = self.vocab.bin_logits(hidden).float()  # (B, H*D, bins)
        ce = F.cross_entropy(logits.transpose(1, 2), bins, reduction="none")  # (B, H*D)
        return (ce * valid).sum(1) / valid.sum(1).clamp(min=1)

    def _autoregressive_step(self, prefix):
        """Left-to-right decoding with a KV cache: each forward feeds the token chosen at k-1 (cached
        for later steps) and a hidden token at k (whose logits are returned, then dropped)."""
        state = {"cache": prefix.cache, "length": 0}
        mask_bin = self.config.bins
        backbone = self.vocab.backbone

        def step(k: int, previous: torch.Tensor | None) -> torch.Tensor:
            b = prefix.valid.shape[0]
            hidden_k = torch.full((b, 1), mask_bin, device=prefix.valid.device)
            tokens = hidden_k if previous is None else torch.cat([previous[:, None], hidden_k], dim=1)
            embeds = self.embed(tokens, start=k - (tokens.shape[1] - 1))
            n_new, cached = tokens.shape[1], state["length"]
            keys = torch.cat(
                [prefix.valid, torch.ones(b, cached + n_new, dtype=torch.bool, device=prefix.valid.device)], 1
            )
            mask = keys[:, None, None, :].expand(-1, 1, n_new, -1).clone()
            if n_new == 2:
                mask[:, :, 0, -1] = False  # the chosen token does not see the hidden one after it
            positions = layout.target_positions(prefix.valid, cached + n_new)[:, cached:]
            out = backbone(
                inputs_embeds=embeds,
                position_ids=positions,
                attention_mask=mask,
                past_key_values=state["cache"],
                return_logits=False,
            )
            state["cache"] = [(keys_[:, :, :-1], values[:, :, :-1]) for keys_, values in out.past_key_values]
            state["length"] = cached + n_new - 1  # the chosen token is cached, the hidden one dropped
            return self.vocab.bin_logits(out.hidden_states[:, -1])  # (B, bins)

        return step
