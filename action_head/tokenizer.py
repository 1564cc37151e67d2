"""Actions <-> discrete tokens: per-dimension quantile normalisation to [-1, 1], then uniform bins."""

from __future__ import annotations

import torch


class ActionTokenizer:
    """Maps actions (..., D) to bin indices in [0, bins) and back to bin centres.

    low/high are per-dimension bounds, normally the dataset's q01/q99: values outside are clipped, so a
    few outliers do not waste resolution. Token id = offset + bin.
    """

    def __init__(self, low: torch.Tensor, high: torch.Tensor, bins: int = 256, offset: int = 0):
        low, high = torch.as_tensor(low, dtype=torch.float32), torch.as_tensor(high, dtype=torch.float32)
        if low.shape != high.shape or low.dim() != 1:
            raise ValueError(
                f"low and high must be 1-D of one shape, got {tuple(low.shape)} and {tuple(high.shape)}"
            )
        if bins < 2:
            raise ValueError(f"bins must be >= 2, got {bins}")
        # a constant dimension (high == low) maps to the middle bin and decodes back to its value
        self.low, self.span = low, (high - low).clamp(min=1e-8)
        self.bins, self.offset = bins, offset

    @property
    def action_dim(self) -> int:
        return self.low.numel()

    def normalize(self, actions: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., D) in [-1, 1]."""
        self._check(actions)
        x = (actions - self.low.to(actions.device)) / self.span.to(actions.device) * 2 - 1
        return x.clamp(-1, 1)

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x + 1) / 2 * self.span.to(x.device) + self.low.to(x.device)

    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        """(..., D) float -> (..., D) token ids."""
        x = self.normalize(actions)
        bins = ((x + 1) / 2 * self.bins).floor().long().clamp(0, self.bins - 1)
        return bins + self.offset

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """(..., D) token ids -> (..., D) actions at the bin centres."""
        bins = tokens - self.offset
        if bins.min() < 0 or bins.max() >= self.bins:
            raise ValueError(f"token ids outside the action bins [{self.offset}, {self.offset + self.bins})")
        centres = -1 + (bins.float() + 0.5) * 2 / self.bins
        return self.unnormalize(centres)

    def allowed_bins(self, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
        """(D, bins) bool: per dimension, the bins whose centre lies in [low, high] (D,). A range
        narrower than a bin keeps the one bin nearest its middle (the caller then clamps)."""
        d = self.action_dim
        ids = torch.arange(self.bins)[:, None].expand(-1, d) + self.offset  # (bins, D)
        centres = self.decode(ids)  # (bins, D)
        low, high = torch.as_tensor(low, dtype=torch.float32), torch.as_tensor(high, dtype=torch.float32)
        inside = (centres >= low) & (centres <= high)  # (bins, D)
        nearest = (centres - (low + high) / 2).abs().argmin(0)  # (D,)
        empty = ~inside.any(0)  # (D,)
        inside[nearest[empty], empty.nonzero()[:, 0]] = True
        return inside.T

    def bin_width(self) -> torch.Tensor:
        """Width of one bin in action units, per dimension (D,)."""
        return self.span / self.bins

    def _check(self, actions: torch.Tensor) -> None:
        if actions.shape[-1] != self.action_dim:
            raise ValueError(f"actions have {actions.shape[-1]} dimensions, the tokenizer {self.action_dim}")
        if not torch.isfinite(actions).all():
            raise ValueError("actions contain NaN or inf")
