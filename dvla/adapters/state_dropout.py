"""State dropout: in training, some robot samples act without their state (a learned token stands in).

The hand position mid-episode tells which way the arm has been moving, so with the state always
given a policy can learn to keep going and never read the goal off the images (measured by
experiments/input_use.py). Hiding the state of a fraction of the samples forces the images to be
read. Training only. Measured effect: docs/adapters.md#state_dropout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dvla.adapters.base import Adapter, Applies, CoreSpec, PrefixInputs, register_adapter


@dataclass
class StateDropoutConfig:
    """Hide the robot state of a fraction of the training samples."""

    fraction: float = 0.25

    def __post_init__(self):
        if not 0.0 < self.fraction < 1.0:
            raise ValueError(f"adapters.state_dropout.fraction must be in (0, 1), got {self.fraction}")


@register_adapter("state_dropout", StateDropoutConfig)
class StateDropout(Adapter):
    applies_to = Applies.ROBOT

    def __init__(self, config: StateDropoutConfig, core: CoreSpec):
        super().__init__(config, core)
        self.hidden_embed = nn.Parameter(torch.zeros(core.width))  # the "no state" token

    def draw(self, batch_size: int, device, generator=None) -> torch.Tensor:
        """(B,) bool: which samples act without their state."""
        return (torch.rand(batch_size, generator=generator) < self.config.fraction).to(device)

    def state_token(self, token: torch.Tensor, inputs: PrefixInputs) -> torch.Tensor:
        hide = inputs.draws.get(self.name)  # only training batches draw
        if hide is None:
            return token
        return torch.where(hide[:, None], self.hidden_embed.to(token), token)  # (B, d)
