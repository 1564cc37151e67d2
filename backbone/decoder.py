"""Parallel decoding of a masked diffusion LM: fill a masked block in a few forwards.

`decode` is a pure driver over a `logits_fn(tokens) -> logits` closure (which can reuse a prefix KV
cache); `decode_autoregressive` fills the same block left to right, one token per forward, for
side-by-side comparison.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import torch


class UnmaskSchedule(StrEnum):
    """How many hidden tokens each step reveals."""

    LINEAR = "linear"  # the same number each step
    COSINE = "cosine"  # few first, many last (MaskGIT): the hidden fraction follows cos(pi/2 * s/S)


class Confidence(StrEnum):
    """How sure the model is of a position's prediction; the surest are revealed first."""

    MAX_PROB = "max_prob"  # probability of the chosen token
    MARGIN = "margin"  # top-1 minus top-2 probability
    ENTROPY = "entropy"  # negative entropy of the distribution


@dataclass
class DecodeConfig:
    """How a masked block is decoded."""

    # Denoising steps (backbone forwards); 1 fills everything at once, block length = one per step.
    steps: int = 4
    schedule: UnmaskSchedule = UnmaskSchedule.LINEAR
    confidence: Confidence = Confidence.MAX_PROB
    # When set, each step reveals every position whose confidence exceeds it (at least one, and all
    # by the last step) and decoding may stop early; `schedule` is then not used.
    threshold: float | None = None
    # 0 = greedy (argmax); > 0 samples from softmax(logits / temperature).
    temperature: float = 0.0
    # Self-correction: after each step but the last, tokens revealed in earlier steps (never fixed ones)
    # to which the latest forward gives a probability below this are hidden again. 0 = off.
    remask: float = 0.0
    # Keep every intermediate block and the confidence of each step (for visualisation); costs memory.
    record_history: bool = False
    # Decode left to right, one token per forward (with a KV cache) instead of in parallel.
    autoregressive: bool = False

    def __post_init__(self):
        self.schedule, self.confidence = UnmaskSchedule(self.schedule), Confidence(self.confidence)
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.threshold is not None and not 0.0 < self.threshold < 1.0 and self.confidence != "entropy":
            raise ValueError(f"threshold must be in (0, 1), got {self.threshold}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 <= self.remask < 1.0:
            raise ValueError(f"remask must be in [0, 1), got {self.remask}")


# Denoising steps per action chunk by default. One step (every action token filled in at once)
# succeeded more often than 4 on every model swept so far (docs/results/decoding_sweep.md) and is the
# fastest; answers keep DecodeConfig's multi-step default, since a multi-token answer needs its
# tokens to agree with each other.
ACTION_DECODE_STEPS = 1


def action_decode_config() -> DecodeConfig:
    """The default decoding of action chunks."""
    return DecodeConfig(steps=ACTION_DECODE_STEPS)


@dataclass
class DecodeResult:
    tokens: torch.Tensor  # (B, T) the filled block
    forwards: int  # backbone forwards used
    history: list[torch.Tensor] = field(default_factory=list)  # (B, T) after each step, if recorded
    confidence: list[torch.Tensor] = field(default_factory=list)  # (B, T) of each step's predictions


def reveal_counts(total: int, steps: int, schedule: UnmaskSchedule) -> list[int]:
    """How many tokens to reveal at each step so that all `total` are revealed after `steps`
    (at least one per step; fewer steps when there are fewer tokens than steps)."""
    steps = max(1, min(steps, total))
    counts, revealed = [], 0
    for s in range(1, steps + 1):
        if schedule == UnmaskSchedule.LINEAR:
            target = round(total * s / steps)
        else:
            target = total - round(total * math.cos(math.pi / 2 * s / steps))
        target = min(max(target, revealed + 1), total - (steps - s))  # >= 1 now, >= 1 per later step
        counts.append(target - revealed)
        revealed = target
    return counts


def _pick(logits: torch.Tensor, config: DecodeConfig, generator):
    """Chosen tokens (B, T), their confidence (B, T) and the probabilities (B, T, V) from logits."""
    probs = torch.softmax(logits.float(), dim=-1)  # (B, T, V)
    if config.temperature > 0:
        sample_probs = torch.softmax(logits.float() / config.temperature, dim=-1)
        flat = torch.multinomial(sample_probs.flatten(0, 1), 1, generator=generator)
        tokens = flat.view(probs.shape[:2])
    else:
        tokens = probs.argmax(-1)
    chosen = probs.gather(-1, tokens[..., None])[..., 0]  # (B, T)
    if config.confidence == Confidence.MAX_PROB:
        conf = chosen
    elif config.confidence == Confidence.MARGIN:
        top2 = probs.topk(2, dim=-1).values
        conf = top2[..., 0] - top2[..., 1]
    else:
        conf = (probs * probs.clamp_min(1e-12).log()).sum(-1)  # negative entropy
    return tokens, conf, probs


def _constrain(logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Forbid tokens outside each position's vocabulary: logits (B, T, V), allowed broadcastable."""
    if allowed is None:
        return logits
    return logits.masked_fill(~allowed.to(logits.device).expand_as(logits), float("-inf"))


def decode(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    tokens: torch.Tensor,
    mask_token_id: int,
    config: DecodeConfig,
    allowed: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> DecodeResult:
    """Fill the positions of `tokens` (B, T) equal to `mask_token_id`; other positions are fixed and
    kept (inpainting). `allowed` (T, V) or (B, T, V) bool restricts each position's vocabulary.
    `logits_fn` maps a block (B, T) to logits (B, T, V); it is called once per step."""
    if config.autoregressive:
        raise ValueError("use decode_autoregressive for DecodeConfig(autoregressive=True)")
    tokens = tokens.clone()
    fixed = tokens != mask_token_id  # (B, T)
    hidden_total = int((~fixed).sum(1).max())
    counts = reveal_counts(hidden_total, config.steps, config.schedule)
    history, confidence, forwards = [], [], 0
    for step in range(len(counts)):
        hidden = tokens == mask_token_id  # (B, T)
        if not hidden.any():
            break
        logits = _constrain(logits_fn(tokens), allowed)  # (B, T, V)
        forwards += 1
        predicted, conf, probs = _pick(logits, config, generator)
        last = step == len(counts) - 1
        candidates = conf.masked_fill(~hidden, float("-inf"))  # (B, T): only hidden positions compete
        if config.threshold is not None:
            reveal = hidden & (conf > config.threshold)
            best = candidates.argmax(-1, keepdim=True)  # at least one per sample per step
            reveal |= torch.zeros_like(hidden).scatter(1, best, True) & hidden
        else:
            k = torch.tensor(counts[step]).clamp(max=hidden.sum(1))  # (B,)
            order = candidates.argsort(-1, descending=True)  # (B, T)
            rank = order.argsort(-1)
            reveal = (rank < k[:, None].to(rank.device)) & hidden
        if last:
            reveal = hidden
        tokens = torch.where(reveal, predicted, tokens)
        if config.remask > 0 and not last:
            earlier = ~fixed & ~hidden  # revealed in an earlier step
            now_unlikely = probs.gather(-1, tokens[..., None])[..., 0] < config.remask  # (B, T)
            tokens = tokens.masked_fill(earlier & now_unlikely, mask_token_id)
        if config.record_history:
            history.append(tokens.clone())
            confidence.append(conf.detach().float().clone())
    if config.threshold is not None:  # threshold mode may need more rounds than `steps` allows
        while (tokens == mask_token_id).any():
            predicted, conf, _ = _pick(_constrain(logits_fn(tokens), allowed), config, generator)
            forwards += 1
            tokens = torch.where(tokens == mask_token_id, predicted, tokens)
            if config.record_history:
                history.append(tokens.clone())
                confidence.append(conf.detach().float().clone())
    return DecodeResult(tokens, forwards, history, confidence)


def decode_autoregressive(
    step_fn: Callable[[int, torch.Tensor | None], torch.Tensor],
    tokens: torch.Tensor,
    mask_token_id: int,
    config: DecodeConfig,
    allowed: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> DecodeResult:
    """Fill `tokens` (B, T) left to right. `step_fn(k, previous)` gets position k and the token just
    chosen at k-1 (None at k=0), and returns logits (B, V) for position k (one forward each, the
    caller keeping a KV cache). Fixed (non-mask) positions are kept and still fed forward."""
    tokens = tokens.clone()
    history, previous = [], None
    for k in range(tokens.shape[1]):
        allowed_k = None if allowed is None else allowed[..., k : k + 1, :]  # (1 or B, 1, V)
        logits = _constrain(step_fn(k, previous)[:, None], allowed_k)  # (B, 1, V)
        predicted = _pick(logits, config, generator)[0]
        hidden = tokens[:, k] == mask_token_id
        tokens[:, k] = torch.where(hidden, predicted[:, 0], tokens[:, k])
        previous = tokens[:, k]
        if config.record_history:
            history.append(tokens.clone())
    return DecodeResult(tokens, tokens.shape[1], history)
