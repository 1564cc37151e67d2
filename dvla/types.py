"""Typed model inputs, with shapes in the annotations, and fake ones for tests.

Observations and batches carry what the core model reads; what an adapter reads or is trained on
travels in the `adapter_inputs` / `targets` dicts, keyed by the adapter's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

VQA_CAMERA = "scene"  # the camera name of VQA scenes


def _to(value: Any, device: torch.device) -> Any:
    return value.to(device) if hasattr(value, "to") else value


@dataclass
class Observation:
    images: dict[str, torch.Tensor]  # camera -> (B, 3, H, W) float in [0, 1]
    text_ids: torch.Tensor  # (B, L) instruction or question tokens
    text_valid: torch.Tensor  # (B, L) bool, False for padding
    state: torch.Tensor | None = None  # (B, S) normalised to [-1, 1]; None for questions
    # (B,) which image row each sample reads when several questions share one image (the images
    # are then (I, 3, H, W), read once); None = one image row per sample
    image_index: torch.Tensor | None = None
    # run-time inputs of adapters, by adapter name (e.g. a held reading, set by a policy hook)
    adapter_inputs: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return self.text_ids.shape[0]

    @property
    def is_question(self) -> bool:
        return self.state is None

    def to(self, device: torch.device) -> Observation:
        return Observation(
            {c: img.to(device) for c, img in self.images.items()},
            self.text_ids.to(device),
            self.text_valid.to(device),
            None if self.state is None else self.state.to(device),
            None if self.image_index is None else self.image_index.to(device),
            {k: _to(v, device) for k, v in self.adapter_inputs.items()},
        )


@dataclass
class PerceptionFrames:
    """Frames that train only an image-side target (scenes recorded without an expert)."""

    images: dict[str, torch.Tensor]  # camera -> (P, 3, H, W) float in [0, 1]
    sim_state: torch.Tensor  # (P, E) normalised to [-1, 1]

    def to(self, device: torch.device) -> PerceptionFrames:
        images = {c: img.to(device) for c, img in self.images.items()}
        return PerceptionFrames(images, self.sim_state.to(device))


@dataclass
class ActionBatch:
    observation: Observation
    actions: torch.Tensor  # (B, H, D) normalised to [-1, 1]
    actions_is_pad: torch.Tensor  # (B, H) bool, True past the episode end
    # adapters' training targets: "sim_state" (B, E) in [-1, 1], "sim_state_frames" PerceptionFrames
    targets: dict[str, Any] = field(default_factory=dict)

    def to(self, device: torch.device) -> ActionBatch:
        targets = {k: _to(v, device) for k, v in self.targets.items()}
        return ActionBatch(
            self.observation.to(device), self.actions.to(device), self.actions_is_pad.to(device), targets
        )


@dataclass
class VQABatch:
    observation: Observation
    answer_ids: torch.Tensor  # (B, A) answer tokens padded with EOS
    # adapters' training targets: "scene_map" (I, G*G, C) per image, "referents" (B, 2, 4)
    targets: dict[str, Any] = field(default_factory=dict)


def fake_observation(
    batch: int,
    cameras: list[str],
    image_size: int | tuple[int, int],
    text_len: int,
    vocab: int,
    state_dim: int | None,
    seed: int = 0,
) -> Observation:
    """Random inputs; `image_size` is a side or (height, width)."""
    g = torch.Generator().manual_seed(seed)
    height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
    valid = torch.ones(batch, text_len, dtype=torch.bool)
    valid[0, text_len // 2 :] = False  # one shorter instruction
    return Observation(
        images={c: torch.rand(batch, 3, height, width, generator=g) for c in cameras},
        text_ids=torch.randint(4, vocab, (batch, text_len), generator=g),
        text_valid=valid,
        state=None if state_dim is None else torch.rand(batch, state_dim, generator=g) * 2 - 1,
    )


def fake_action_batch(batch, cameras, image_size, text_len, vocab, state_dim, chunk, action_dim, seed=0):
    g = torch.Generator().manual_seed(seed + 1)
    is_pad = torch.zeros(batch, chunk, dtype=torch.bool)
    is_pad[-1, chunk // 2 :] = True  # one chunk runs past its episode's end
    return ActionBatch(
        observation=fake_observation(batch, cameras, image_size, text_len, vocab, state_dim, seed),
        actions=torch.rand(batch, chunk, action_dim, generator=g) * 2 - 1,
        actions_is_pad=is_pad,
    )
