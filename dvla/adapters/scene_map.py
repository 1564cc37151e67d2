"""The scene map: an auxiliary VQA target that teaches the encoder to see objects before answering.

Each image token of the scene camera predicts which colours, shapes, sizes and colour-shape pairs
have an object centred in its cell of the image (multi-hot, binary cross-entropy); with `positions`
it also regresses each such object's image column, row and depth in cell units (squared error), so
spatial questions can tell apart objects closer than one cell. The targets come from the scene's
ground truth (`dvla.sim.vqa_targets`); training only, never an input. Questions only.
Measured effect: docs/adapters.md#scene_map.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dvla.adapters.base import Adapter, Applies, CoreSpec, LossInputs, register_adapter


@dataclass
class SceneMapConfig:
    """The scene-map target (VQA scenes recorded by `dvla collect --suite vqa-scenes`)."""

    # Weight of its loss in the VQA loss.
    weight: float = 1.0
    # Also regress where each object is (column, row, depth in cells).
    positions: bool = False
    # Multi-hot and position channels per cell; null = the data's (`dvla train` sets them).
    channels: int | None = None
    position_channels: int | None = None

    def __post_init__(self):
        if self.weight <= 0:
            raise ValueError(f"adapters.scene_map.weight must be > 0 (null turns it off), got {self.weight}")

    def fit(self, facts: dict) -> SceneMapConfig:
        channels = facts.get("scene_map_channels")
        if channels is None:
            raise ValueError("model.adapters.scene_map needs VQA scenes to train on: set vqa.root")
        return SceneMapConfig(self.weight, self.positions, channels, facts["scene_map_position_channels"])


def square_grid(tokens_per_camera: int, what: str) -> int:
    """Side of the square grid of image tokens, or a clear error."""
    side = math.isqrt(tokens_per_camera)
    if side * side != tokens_per_camera:
        raise ValueError(
            f"{what} needs a square grid of image tokens; tokens_per_camera is {tokens_per_camera} "
            "(use 16, 64, ...)"
        )
    return side


@register_adapter("scene_map", SceneMapConfig)
class SceneMap(Adapter):
    applies_to = Applies.QUESTION

    def __init__(self, config: SceneMapConfig, core: CoreSpec):
        super().__init__(config, core)
        if config.channels is None or (config.positions and config.position_channels is None):
            raise ValueError("adapters.scene_map.channels is unset: `dvla train` sets it from the VQA data")
        self.grid = square_grid(core.tokens_per_camera, "adapters.scene_map")
        outputs = config.channels + (config.position_channels if config.positions else 0)
        self.head = nn.Sequential(nn.LayerNorm(core.width), nn.Linear(core.width, outputs))

    def vqa_targets(self) -> dict[str, dict]:
        return {"scene_map": {"grid": self.grid}}

    def aux_loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]] | None:
        scene_map = inputs.batch.targets.get("scene_map")
        if scene_map is None:
            return None
        return self.loss(inputs.prefix.encoded, scene_map)

    def loss(
        self, image_tokens: torch.Tensor, scene_map: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The map read off the first camera's grid tokens (I, N, d), one row per image (a VQA batch
        carries only the scene camera): mean binary cross-entropy of the multi-hot channels of
        scene_map (I, K, C + P), plus with positions the mean squared error of the positions present
        (the NaN-free entries)."""
        k, c = self.core.tokens_per_camera, self.config.channels
        if scene_map.shape[1] != k:
            raise ValueError(f"a scene map of {scene_map.shape[1]} cells for {k} image tokens per camera")
        out = self.head(image_tokens[:, :k]).float()  # (I, K, C [+ P])
        target = scene_map.float()
        loss = F.binary_cross_entropy_with_logits(out[..., :c], target[..., :c])
        metrics = {"bce": float(loss.detach())}
        if self.config.positions:
            present = target[..., c:].isfinite()  # (I, K, P)
            error = (out[..., c:] - target[..., c:].nan_to_num()).square()[present]
            mse = error.mean() if error.numel() else out[..., c:].sum() * 0.0
            metrics["position_mse"] = float(mse.detach())
            loss = loss + mse
        return loss, metrics
