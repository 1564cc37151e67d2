"""Flow-matching action head (the alternative to discrete bins, as in Dream-VLA's released recipe).

H action-query tokens pass through the backbone once; this head integrates a rectified flow from
Gaussian noise to the (normalised) action chunk, conditioned on their hidden states, in a few Euler
steps. Only the small head runs per integration step, never the backbone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from dvla.action_head.base import ActionHead, HeadConfig, HeadSpec, TrainingTarget, register_head


@HeadConfig.register_subclass("flow")
@dataclass
class FlowHeadConfig(HeadConfig):
    """Size of the velocity network and how the flow is integrated."""

    RUN_FIELDS: ClassVar[tuple[str, ...]] = ("integration_steps",)

    # Width of the velocity MLP.
    hidden_size: int = 256
    # Residual MLP blocks.
    num_blocks: int = 3
    # Euler steps when sampling.
    integration_steps: int = 10

    def __post_init__(self):
        if self.hidden_size < 1 or self.num_blocks < 1 or self.integration_steps < 1:
            raise ValueError("hidden_size, num_blocks and integration_steps must all be >= 1")


def time_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of flow time t in [0, 1]: (B,) -> (B, dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(1000.0) * torch.arange(half, device=t.device) / half)
    angles = t[:, None] * 1000.0 * freqs  # (B, half)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class _Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


@register_head("flow")
class FlowHead(ActionHead):
    """H action queries through the backbone once; their hidden states cond (B, H, d) condition a
    velocity network integrated to actions (B, H, D) in normalised units."""

    def __init__(self, config: FlowHeadConfig, spec: HeadSpec):
        super().__init__(config, spec)
        action_dim, self.action_dim = spec.action_dim, spec.action_dim
        self.queries = nn.Parameter(torch.randn(spec.chunk_size, spec.width) * 0.02)  # fed to the backbone
        width = config.hidden_size
        self.action_in = nn.Linear(action_dim, width)
        self.cond_in = nn.Linear(spec.width, width)
        self.time_in = nn.Linear(width, width)
        self.blocks = nn.Sequential(*(_Block(width) for _ in range(config.num_blocks)))
        self.out = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, action_dim))

    @property
    def target_length(self) -> int:
        return self.spec.chunk_size

    def training_target(self, actions, is_pad, generator=None) -> TrainingTarget:
        return TrainingTarget(self.queries.expand(actions.shape[0], -1, -1), {})  # (B, H, d)

    def loss(self, hidden, target, actions, is_pad, generator=None):
        loss = self.flow_loss(hidden, actions, is_pad, generator)
        return loss, {"flow_mse": float(loss.detach())}

    def sample(self, backbone, decode, generator=None, use_cache=True, constraint=None):
        """Known steps by hard replacement: at every Euler step they are set to where the straight
        path from their noise to them is at that time (exact at the end), so the free steps flow
        alongside them. Bounds clamp the integrated chunk."""
        if not use_cache or decode.autoregressive:
            raise ValueError("the flow head decodes with the prefix cache in one pass; drop those options")
        if constraint is not None:
            constraint.check(backbone.batch_size, self.spec.chunk_size, self.action_dim)
        cond = backbone.target_hidden(self.queries.expand(backbone.batch_size, -1, -1))  # (B, H, d)
        known = None if constraint is None else constraint.known
        actions = self.integrate(cond, generator=generator, known=known)
        return (constraint.clamp(actions) if constraint else actions), 1

    def velocity(self, x_t: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """x_t (B, H, D), t (B,), cond (B, H, d) -> velocity (B, H, D)."""
        h = self.action_in(x_t) + self.cond_in(cond)  # (B, H, w)
        h = h + self.time_in(time_embedding(t, h.shape[-1]))[:, None]  # (B, H, w)
        return self.out(self.blocks(h))

    def flow_loss(
        self,
        cond: torch.Tensor,
        actions: torch.Tensor,
        is_pad: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Rectified-flow loss: x_t = (1 - t) noise + t actions, target velocity actions - noise."""
        b = actions.shape[0]
        noise = torch.randn(actions.shape, generator=generator).to(actions)
        t = torch.rand(b, generator=generator).to(actions)  # (B,)
        x_t = (1 - t)[:, None, None] * noise + t[:, None, None] * actions  # (B, H, D)
        err = (self.velocity(x_t, t, cond) - (actions - noise)).pow(2).mean(-1)  # (B, H)
        keep = torch.ones_like(err) if is_pad is None else (~is_pad).float()
        return (err * keep).sum() / keep.sum().clamp(min=1)

    @torch.no_grad()
    def integrate(self, cond: torch.Tensor, steps: int | None = None, generator=None, known=None):
        """Integrate from noise with Euler steps: (B, H, d) -> (B, H, D); `known` (B, K, D) fixes the
        first K steps (hard replacement on the noise-to-data path)."""
        steps = steps or self.config.integration_steps
        b, h, _ = cond.shape
        x = torch.randn((b, h, self.action_dim), generator=generator).to(cond)
        noise = x.clone()
        k = 0 if known is None else known.shape[1]
        if k:
            known = known.to(x)
        for i in range(steps):
            if k:
                x[:, :k] = (1 - i / steps) * noise[:, :k] + i / steps * known
            t = torch.full((b,), i / steps, device=cond.device, dtype=cond.dtype)
            x = x + self.velocity(x, t, cond) / steps
        if k:
            x[:, :k] = known
        return x
