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


def parse_offsets(spec: str) -> list[tuple[int, int]]:
    """Parse "4:7,36:39" (slices of 3-D positions in the simulator state) into [(4, 7), (36, 39)]."""
    slices = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        try:
            start, stop = (int(x) for x in part.split(":"))
        except ValueError:
            hint = (
                " (YAML reads a lone 36:39 as the base-60 number 2199: on the command line write "
                "'36:39,' with a trailing comma)"
                if part.isdigit()
                else ""
            )
            raise ValueError(f"slice {part!r} is not start:stop (e.g. '36:39'){hint}") from None
        if start < 0 or stop - start != 3:
            raise ValueError(f"slice {part!r} must be a 3-D position: start >= 0, stop = start + 3")
        slices.append((start, stop))
    return slices


class ReadingOffsets(nn.Module):
    """The head's reading (normalised, (B, E)) and the robot state (normalised, (B, S)) -> the read
    positions minus the hand's, in decimetres (B, 3 * len(slices)). The normalisations' q01 and
    span come from the run's statistics (`set_units`); they are buffers, saved with the model."""

    def __init__(self, slices: list[tuple[int, int]], state_dim: int, sim_state_dim: int):
        super().__init__()
        if any(stop > sim_state_dim for _, stop in slices):
            raise ValueError(
                f"reading_offsets {slices} reach past the simulator state's {sim_state_dim} dims"
            )
        self.slices = slices
        self._units_checked = False  # the NaN check syncs a GPU: once per module is enough
        for name, dim in (("state", state_dim), ("sim", sim_state_dim)):
            self.register_buffer(f"{name}_low", torch.full((dim,), float("nan")))
            self.register_buffer(f"{name}_span", torch.full((dim,), float("nan")))

    @property
    def out_dim(self) -> int:
        return 3 * len(self.slices)

    @torch.no_grad()
    def set_units(self, state_low, state_span, sim_low, sim_span) -> None:
        """The q01 and q99 - q01 of the robot state and of the simulator state (1-D tensors)."""
        for name, value in zip(
            ("state_low", "state_span", "sim_low", "sim_span"),
            (state_low, state_span, sim_low, sim_span),
            strict=True,
        ):
            getattr(self, name).copy_(torch.as_tensor(value, dtype=torch.float32))

    def forward(self, reading: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        if not self._units_checked:
            self._check_units()
        world = (reading.float() + 1) / 2 * self.sim_span + self.sim_low  # (B, E) metres
        hand = ((state.float() + 1) / 2 * self.state_span + self.state_low)[:, :3]  # (B, 3)
        return torch.cat([world[:, a:b] - hand for a, b in self.slices], dim=1) * 10  # (B, 3n)

    def _check_units(self) -> None:
        if torch.isnan(self.sim_low).any() or torch.isnan(self.state_low).any():
            raise RuntimeError(
                "reading_offsets has no units yet: build the model through DiffusionVLAPolicy (or call "
                "model.reading_offsets.set_units with the run's statistics)"
            )
        self._units_checked = True


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
