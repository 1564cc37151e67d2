"""Auxiliary heads that read the simulator state (object and goal positions) in training only."""

from __future__ import annotations

import torch
from torch import nn

# Where the auxiliary head reads the simulator state from.
SIM_STATE_READS = ("vision", "state_token")


class VisionStateHead(nn.Module):
    """Image tokens of the present cameras -> simulator state (B, E), straight off the encoder.

    The tokens are kept apart (flattened, not averaged), so which cell sees a marker says where it
    is; the gradient reaches the vision encoder without passing through the backbone. Cameras absent
    from a batch (a co-training VQA camera in a robot batch) read as zeros.
    """

    def __init__(self, cameras: list[str], tokens_per_camera: int, width: int, out_dim: int):
        super().__init__()
        self.cameras = list(cameras)
        self.tokens_per_camera = tokens_per_camera
        self.norm = nn.LayerNorm(width)
        self.readout = nn.Linear(len(cameras) * tokens_per_camera * width, out_dim)

    def forward(self, image_tokens: torch.Tensor, present: list[str]) -> torch.Tensor:
        """image_tokens (B, len(present) * K, d), the present cameras in configured order -> (B, E)."""
        b, _, d = image_tokens.shape
        k = self.tokens_per_camera
        if image_tokens.shape[1] != len(present) * k:
            raise ValueError(f"{image_tokens.shape[1]} image tokens for cameras {present} at {k} each")
        grid = image_tokens.new_zeros(b, len(self.cameras), k, d)  # (B, n_cameras, K, d)
        for i, tokens in zip(present, image_tokens.split(k, dim=1), strict=True):
            grid[:, self.cameras.index(i)] = self.norm(tokens)
        return self.readout(grid.flatten(1))  # (B, E)


def parse_emphasis(spec: str) -> list[tuple[int, int, float]]:
    """Parse "36:39=30,4:7=10" into [(36, 39, 30.0), (4, 7, 10.0)]; "" -> []."""
    slices = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        try:
            span, weight = part.split("=")
            start, stop = (int(x) for x in span.split(":"))
            weight = float(weight)
        except ValueError:
            raise ValueError(
                f"sim_state_emphasis part {part!r} is not start:stop=weight (e.g. '36:39=30')"
            ) from None
        if not 0 <= start < stop or weight < 0:
            raise ValueError(f"sim_state_emphasis part {part!r} needs 0 <= start < stop and weight >= 0")
        slices.append((start, stop, weight))
    return slices


def emphasis_weights(spec: str, dim: int) -> torch.Tensor:
    """(dim,) per-dimension weights of the simulator-state error: 1, or the weight of a listed slice."""
    weights = torch.ones(dim)
    for start, stop, weight in parse_emphasis(spec):
        if stop > dim:
            raise ValueError(
                f"sim_state_emphasis slice {start}:{stop} is past the simulator state's {dim} dimensions"
            )
        weights[start:stop] = weight
    return weights


def weighted_mse(predicted: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """mean over batch and dimensions of weights[e] * (predicted - target)^2; (B, E), (B, E), (E,)."""
    return ((predicted.float() - target.float()).square() * weights).mean()
