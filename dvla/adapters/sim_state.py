"""The simulator-state adapter: an auxiliary target that teaches the encoder where objects and goals are.

A head reads the simulator's full state (object and goal positions; MetaWorld's 39-D `sim.state`)
off the image tokens, straight off the encoder (`reads: vision`, default) or off the backbone's
robot-state token (`reads: state_token`, the first design). Its weighted squared error joins the
training loss; the simulator state is never an input. With `input: true` the head's reading (what
it sees of objects and goals, detached) also becomes one more prefix token after the state.
Measured effect and when to use it: docs/adapters.md#sim_state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import torch
from torch import nn

from dvla.adapters.base import Adapter, Applies, CoreSpec, LossInputs, PrefixInputs, Slot, register_adapter


class SimStateReads(StrEnum):
    VISION = "vision"  # the image tokens, straight off the encoder
    STATE_TOKEN = "state_token"  # the backbone's robot-state token


@dataclass
class SimStateConfig:
    """The simulator-state target (needs dataset.sim_state_key)."""

    # Size of the simulator state; null = the dataset's (dataset.sim_state_key).
    dim: int | None = None
    # Where the head reads: "vision" (image tokens) or "state_token" (the backbone's state token).
    reads: str = SimStateReads.VISION.value
    # Weight of the squared error (targets normalised to [-1, 1]) in the training loss.
    weight: float = 1.0
    # More weight on some dimensions: [start, stop, weight] triples; unlisted dimensions weigh 1.
    # MetaWorld keeps the goal in 36:39 and the first object in 4:7: [[36, 39, 40], [4, 7, 10]].
    emphasis: list[tuple[int, int, float]] = field(default_factory=list)
    # Also feed the head's reading to the backbone as a prefix token (needs reads: vision).
    input: bool = False

    def __post_init__(self):
        choices = [r.value for r in SimStateReads]
        if self.reads not in choices:  # a plain string, so configs dump to plain YAML
            raise ValueError(f"adapters.sim_state.reads must be one of {choices}, got {self.reads!r}")
        if self.dim is not None and self.dim < 1:
            raise ValueError(f"adapters.sim_state.dim must be >= 1 (or null: from the data), got {self.dim}")
        if self.weight < 0:
            raise ValueError(f"adapters.sim_state.weight must be >= 0, got {self.weight}")
        for start, stop, weight in self.emphasis:
            if not 0 <= start < stop or weight < 0:
                raise ValueError(
                    f"adapters.sim_state.emphasis entry [{start}, {stop}, {weight}] needs "
                    "0 <= start < stop and weight >= 0"
                )
        if self.input and self.reads != SimStateReads.VISION:
            raise ValueError(
                "adapters.sim_state.input feeds the image-token head's reading: set reads: vision"
            )

    def fit(self, facts: dict) -> SimStateConfig:
        """The data's simulator-state size (facts["sim_state_dim"], 0 when the data has none)."""
        dim = facts.get("sim_state_dim", 0)
        if not dim:
            raise ValueError(
                "model.adapters.sim_state needs a simulator state in the data: set "
                "dataset.sim_state_key (e.g. sim.state, recorded by `dvla collect`)"
            )
        if self.dim not in (None, dim):
            raise ValueError(
                f"adapters.sim_state.dim={self.dim} but the data's simulator state has {dim} dimensions; "
                "leave it unset"
            )
        return SimStateConfig(dim, self.reads, self.weight, list(self.emphasis), self.input)


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


def weighted_mse(predicted: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """mean over batch and dimensions of weights[e] * (predicted - target)^2; (B, E), (B, E), (E,)."""
    return ((predicted.float() - target.float()).square() * weights).mean()


@register_adapter("sim_state", SimStateConfig)
class SimStateAdapter(Adapter):
    applies_to = Applies.ROBOT
    slot = Slot.AFTER_STATE

    def __init__(self, config: SimStateConfig, core: CoreSpec):
        super().__init__(config, core)
        if config.dim is None:
            raise ValueError(
                "adapters.sim_state.dim is unset: `dvla train` sets it from dataset.sim_state_key"
            )
        d = core.width
        if config.reads == SimStateReads.VISION:
            self.head = VisionStateHead(core.cameras, core.tokens_per_image, d, config.dim)
        else:
            self.head = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, config.dim))
        self.input_proj = (
            nn.Sequential(nn.Linear(config.dim, d), nn.GELU(), nn.Linear(d, d)) if config.input else None
        )
        weights = torch.ones(config.dim)  # (E,) per-dimension weights of the error
        for start, stop, weight in config.emphasis:
            if stop > config.dim:
                raise ValueError(
                    f"adapters.sim_state.emphasis [{start}, {stop}] is past the simulator state's "
                    f"{config.dim} dimensions"
                )
            weights[start:stop] = weight
        self.register_buffer("dim_weights", weights, persistent=False)

    def read_images(self, image_tokens: torch.Tensor, images: dict) -> torch.Tensor:
        """The vision-side head on image tokens (B, N, d) of the cameras in `images`: (B, E)."""
        present = [c for c in self.core.cameras if c in images]
        return self.head(image_tokens, present)

    def reading(self, inputs: PrefixInputs) -> torch.Tensor:
        """The head's reading (B, E) as a prefix input: detached (trained by its own loss only), with
        values held from earlier in the episode (obs.adapter_inputs["sim_state"], NaN = live)."""
        if "sim_state.reading" not in inputs.found:
            reading = self.read_images(inputs.encoded, inputs.obs.images).detach()  # (B, E)
            held = inputs.obs.adapter_inputs.get("sim_state")
            if held is not None:
                held = held.to(reading.dtype)
                reading = torch.where(torch.isnan(held), reading, held)
            inputs.found["sim_state.reading"] = reading
        return inputs.found["sim_state.reading"]

    def prefix_tokens(self, inputs: PrefixInputs) -> torch.Tensor | None:
        if self.input_proj is None:
            return None
        return self.input_proj(self.reading(inputs))[:, None]  # (B, 1, d)

    def aux_loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]] | None:
        """Weighted MSE of the simulator state read off the image tokens (and of the batch's
        perception frames, which share the same mean) or off the state token."""
        target = inputs.batch.targets.get("sim_state")  # (B, E)
        if target is None:
            return None
        frames = inputs.batch.targets.get("sim_state_frames")
        obs = inputs.prefix.obs
        if self.config.reads == SimStateReads.VISION:
            predicted = self.read_images(inputs.prefix.encoded, obs.images)  # (B, E)
            if frames is not None:
                tokens = inputs.model.vision(frames.images, train=True)  # (P, N, d)
                predicted = torch.cat([predicted, self.read_images(tokens, frames.images)])  # (B + P, E)
                target = torch.cat([target, frames.sim_state])  # (B + P, E)
        else:
            if frames is not None:
                raise ValueError(
                    "perception frames train the image-token head: set adapters.sim_state.reads vision"
                )
            predicted = self.head(inputs.hidden[:, inputs.prefix.state_position])  # (B, E)
        mse = weighted_mse(predicted, target, self.dim_weights)
        return mse, {"mse": float(mse.detach())}

    @torch.no_grad()
    def predict(self, model, obs) -> torch.Tensor:
        """What the model sees of the simulator state, (B, E) normalised to [-1, 1]. Off the state
        token: the prefix pass alone, which equals the training readout (the prefix never attends
        to the target)."""
        if obs.state is None:
            raise ValueError("the simulator state is read for robot observations; give the robot state")
        if self.config.reads == SimStateReads.VISION:
            return self.read_images(model.vision(obs.images), obs.images)
        out, inputs = model.prefix_pass(obs)
        return self.head(out.hidden_states[:, inputs.state_position])
