"""Typed model inputs, with shapes in the annotations, and fake ones for tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Observation:
    images: dict[str, torch.Tensor]  # camera -> (B, 3, H, W) float in [0, 1]
    text_ids: torch.Tensor  # (B, L) instruction or question tokens
    text_valid: torch.Tensor  # (B, L) bool, False for padding
    state: torch.Tensor | None = None  # (B, S) normalised to [-1, 1]; None for VQA
    # (B,) which image row each sample reads when several questions share one image (the images
    # are then (I, 3, H, W), read once); None = one image row per sample
    image_index: torch.Tensor | None = None
    # (B, E) normalised simulator-state values that replace the head's live reading where not NaN
    # (a reading held from earlier in the episode; see PolicyConfig.hold_reading); None = live
    reading_override: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.text_ids.shape[0]

    def to(self, device: torch.device) -> Observation:
        state = None if self.state is None else self.state.to(device)
        images = {c: img.to(device) for c, img in self.images.items()}
        index = None if self.image_index is None else self.image_index.to(device)
        override = None if self.reading_override is None else self.reading_override.to(device)
        return Observation(
            images, self.text_ids.to(device), self.text_valid.to(device), state, index, override
        )


@dataclass
class PerceptionFrames:
    """Frames that train only the simulator-state target (scenes recorded without an expert)."""

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
    sim_state: torch.Tensor | None = None  # (B, E) auxiliary target in [-1, 1]; training only
    # more frames for the simulator-state target alone (no actions, no backbone pass); training only
    perception: PerceptionFrames | None = None

    def to(self, device: torch.device) -> ActionBatch:
        obs = self.observation.to(device)
        sim_state = None if self.sim_state is None else self.sim_state.to(device)
        perception = None if self.perception is None else self.perception.to(device)
        actions, is_pad = self.actions.to(device), self.actions_is_pad.to(device)
        return ActionBatch(obs, actions, is_pad, sim_state, perception)


@dataclass
class VQABatch:
    observation: Observation
    answer_ids: torch.Tensor  # (B, A) answer tokens padded with EOS
    # (I, G*G, C) auxiliary multi-hot target per image (I = B without image_index); training only
    scene_map: torch.Tensor | None = None
    # (B, 2, 4) the cell (-1 for none) and place of the two objects a spatial question names
    # (`dvla.sim.vqa_scene_map.referent_targets`); training only
    referents: torch.Tensor | None = None


def fake_observation(
    batch: int,
    cameras: list[str],
    image_size: int,
    text_len: int,
    vocab: int,
    state_dim: int | None,
    seed: int = 0,
) -> Observation:
    g = torch.Generator().manual_seed(seed)
    valid = torch.ones(batch, text_len, dtype=torch.bool)
    valid[0, text_len // 2 :] = False  # one shorter instruction
    return Observation(
        images={c: torch.rand(batch, 3, image_size, image_size, generator=g) for c in cameras},
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
