"""The policy wrapper: raw observations in, robot actions out (normalisation, text, action queue).

Shaped like lerobot's PreTrainedPolicy (`reset`, `select_action`, `predict_action_chunk`) over the
pure model (`DiffusionVLA.compute_loss` / `sample_actions`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dvla.backbone.decoder import DecodeConfig, action_decode_config
from dvla.batch import ActionBatch, Observation, PerceptionFrames, VQABatch
from dvla.model import DiffusionVLA
from dvla.processor import (
    ACTION_KEY,
    SIM_STATE_KEY,
    STATE_KEY,
    QuantileNormalizer,
    decode_answers,
    encode_answers,
    encode_text,
)
from dvla.sim_state_head import parse_offsets

VQA_CAMERA = "scene"  # the camera name of VQA scenes (dvla.data.VQAScenes.CAMERA)


@dataclass
class PolicyConfig:
    """How the policy acts at run time."""

    # Actions executed from each predicted chunk before predicting again (receding horizon);
    # None = half the chunk.
    n_action_steps: int | None = None
    # How action chunks are decoded.
    decode: DecodeConfig = field(default_factory=action_decode_config)
    # How answers to questions are decoded.
    answer_decode: DecodeConfig = field(default_factory=DecodeConfig)
    # Slices of the simulator state ("36:39": MetaWorld's goal) whose reading is averaged over the
    # first `hold_reading_plans` re-plans of an episode and then held, for checkpoints that take the
    # reading as an input (sim_state_input or reading_offsets). For targets that do not move during
    # an episode: the live reading of a goal degrades once the arm leaves the demonstrated
    # paths (README, "Offsets from the hand"). Costs one more image-encoder pass per
    # chunk while the average forms. "" = always the live reading.
    hold_reading: str = ""
    hold_reading_plans: int = 3

    def __post_init__(self):
        parse_offsets(self.hold_reading)  # raises on a malformed spec
        if self.hold_reading_plans < 1:
            raise ValueError(f"hold_reading_plans must be >= 1, got {self.hold_reading_plans}")


class DiffusionVLAPolicy:
    def __init__(self, model: DiffusionVLA, tokenizer, stats: dict, config: PolicyConfig | None = None):
        self.model, self.tokenizer, self.stats = model, tokenizer, stats
        self.config = config or PolicyConfig()
        chunk, steps = model.config.chunk_size, self.config.n_action_steps
        if steps is None:
            steps = self.config.n_action_steps = max(1, chunk // 2)
        if not 1 <= steps <= chunk:
            raise ValueError(f"n_action_steps must be in [1, chunk_size={chunk}], got {steps}")
        # A VQA-only checkpoint has no robot stats and cannot act.
        self.acts = STATE_KEY in stats and ACTION_KEY in stats
        self.state_norm = (
            QuantileNormalizer(stats, STATE_KEY, clip=model.config.state_clip) if self.acts else None
        )
        self.action_norm = QuantileNormalizer(stats, ACTION_KEY) if self.acts else None
        self.sim_state_norm = QuantileNormalizer(stats, SIM_STATE_KEY) if SIM_STATE_KEY in stats else None
        if model.reading_offsets is not None:
            if self.sim_state_norm is None or self.state_norm is None:
                raise ValueError("reading_offsets needs the robot state's and the simulator state's stats")
            model.reading_offsets.set_units(
                self.state_norm.low, self.state_norm.span, self.sim_state_norm.low, self.sim_state_norm.span
            )
        self.action_cameras = [c for c in model.config.vision.cameras if c != VQA_CAMERA]
        self.held_reading = None
        if self.config.hold_reading:
            if model.sim_state_proj is None and model.offset_proj is None:
                raise ValueError(
                    "hold_reading needs a checkpoint that takes the head's reading as an input "
                    "(model.sim_state_input or model.reading_offsets)"
                )
            self.held_reading = HeldReading(self.config.hold_reading, self.config.hold_reading_plans)
        self._queue: deque[torch.Tensor] = deque()
        self.last_forwards = 0  # backbone forwards of the last chunk (prefix pass included)

    @classmethod
    def from_pretrained(cls, path: str | Path, config: PolicyConfig | None = None, device="cpu"):
        from dvla.checkpoint import load_checkpoint

        model, tokenizer, stats = load_checkpoint(path, device)
        return cls(model, tokenizer, stats, config)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def reset(self) -> None:
        """Forget queued actions and held readings (call at every episode start)."""
        self._queue.clear()
        if self.held_reading is not None:
            self.held_reading.clear()

    def observation(self, images: dict[str, torch.Tensor], texts: list[str], state: torch.Tensor | None):
        """images {camera: (B, 3, H, W) float in [0, 1] or (B, H, W, 3) uint8}, raw state (B, S)."""
        images = {name: _to_float_chw(img).to(self.device) for name, img in images.items()}
        if state is not None:
            if not self.acts:
                raise ValueError("this checkpoint was trained on VQA only (no robot data): it cannot act")
            missing = [c for c in self.action_cameras if c not in images]
            if missing:
                raise ValueError(f"missing camera(s) {missing}; the policy acts on {self.action_cameras}")
        ids, valid = encode_text(self.tokenizer, texts, self.model.config.max_text_tokens)
        if state is not None:
            state = self.state_norm.normalize(torch.as_tensor(state, dtype=torch.float32)).to(self.device)
        return Observation(images, ids.to(self.device), valid.to(self.device), state)

    def action_batch(self, sample: dict) -> ActionBatch:
        """A collated LeRobotChunks batch (dvla.data) -> the model's training batch."""
        obs = self.observation(sample["images"], sample["task"], sample["state"])
        actions = self.action_norm.normalize(sample["actions"].float()).to(self.device)
        sim_state = self._sim_state(sample) if "sim_state" in sample else None
        perception = None
        if "perception" in sample:  # scenes for the simulator-state target only
            frames = sample["perception"]
            images = {name: _to_float_chw(img).to(self.device) for name, img in frames["images"].items()}
            perception = PerceptionFrames(images, self._sim_state(frames))
        return ActionBatch(obs, actions, sample["actions_is_pad"].to(self.device), sim_state, perception)

    def _sim_state(self, sample: dict) -> torch.Tensor:
        """The sample's simulator state (B, E) normalised with the run's statistics."""
        if "sim_state" not in sample:
            raise ValueError("perception frames need a simulator state: set perception.sim_state_key")
        if self.sim_state_norm is None:
            raise ValueError("the batch has a simulator state but the checkpoint stats have none")
        return self.sim_state_norm.normalize(sample["sim_state"].float()).to(self.device)

    @torch.no_grad()
    def predict_sim_state(self, images, texts, state) -> torch.Tensor:
        """What the model sees of the simulator state (B, E), in the dataset's units (needs a
        checkpoint trained with dataset.sim_state_key)."""
        if self.sim_state_norm is None:
            raise ValueError("this checkpoint was trained without a simulator-state target")
        self.model.eval()
        obs = self.observation(images, texts, state)
        return self.sim_state_norm.unnormalize(self.model.predict_sim_state(obs).float())

    def vqa_batch(self, sample: dict) -> VQABatch:
        """A collated VQAScenes batch -> the model's VQA training batch."""
        obs = self.observation(sample["images"], sample["question"], None)
        if "image_index" in sample:  # questions grouped by image (VQAScenesByImage)
            obs.image_index = sample["image_index"].to(self.device)
        answers = encode_answers(self.tokenizer, sample["answer"], self.model.config.answer_tokens)
        scene_map = sample.get("scene_map")  # (I, G*G, C) per image, with the scene-map target
        if scene_map is not None:
            scene_map = scene_map.to(self.device)
        referents = sample.get("referents")  # (B, 2, 4) with the referent target
        referents = referents.to(self.device) if referents is not None else None
        return VQABatch(obs, answers.to(self.device), scene_map, referents)

    @torch.no_grad()
    def predict_action_chunk(self, images, texts, state, episodes: list | None = None) -> torch.Tensor:
        """A whole chunk (B, H, D) in robot units. With hold_reading, `episodes` names the episode
        of each row (any hashable; rows of a new episode after `forget(key)` or `reset()`)."""
        self.model.eval()
        obs = self.observation(images, texts, state)
        if self.held_reading is not None:
            if episodes is None or len(episodes) != obs.batch_size:
                raise ValueError("hold_reading needs the episode of every row: pass episodes=[...]")
            # the live reading costs an encoder pass: only while some row's average is still forming
            filling = self.held_reading.filling(episodes)
            live = self.model.predict_sim_state(obs).float() if filling else None  # (B, E) normalised
            obs.reading_override = self.held_reading.update(episodes, live)
        actions, self.last_forwards = self.model.sample_actions(obs, self.config.decode)
        return self.action_norm.unnormalize(actions.float())

    def forget(self, episode) -> None:
        """A new episode starts under the key `episode` (batched actors, see dvla.actors)."""
        if self.held_reading is not None:
            self.held_reading.forget(episode)

    @torch.no_grad()
    def select_action(self, images, texts, state) -> torch.Tensor:
        """The next action (B, D): from the queue, re-planned every n_action_steps."""
        if not self._queue:
            rows = list(range(torch.as_tensor(state).shape[0]))
            chunk = self.predict_action_chunk(images, texts, state, rows)  # (B, H, D)
            self._queue.extend(chunk[:, : self.config.n_action_steps].unbind(1))
        return self._queue.popleft()

    @torch.no_grad()
    def answer(self, images, questions: list[str], decode: DecodeConfig | None = None) -> list[str]:
        """Answers to questions about images (one question per image)."""
        self.model.eval()
        result = self.model.answer_ids(
            self.observation(images, questions, None), decode or self.config.answer_decode
        )
        return decode_answers(self.tokenizer, result.tokens)


class HeldReading:
    """Per episode, the mean of the head's first `plans` readings of some simulator-state slices;
    after that it stops changing. Gives the override the model reads instead of the live reading."""

    def __init__(self, spec: str, plans: int):
        self.slices, self.plans = parse_offsets(spec), plans
        self._reads: dict = {}  # episode -> [(E,) normalised readings]

    def clear(self) -> None:
        self._reads.clear()

    def forget(self, episode) -> None:
        self._reads.pop(episode, None)

    def filling(self, episodes: list) -> bool:
        """Whether some of these episodes still average readings (and so need the live one)."""
        return any(len(self._reads.get(episode, ())) < self.plans for episode in episodes)

    def update(self, episodes: list, live: torch.Tensor | None) -> torch.Tensor:
        """live (B, E), or None once no episode is `filling` -> override (B, E): the held mean on
        the slices, NaN (the model's live reading) elsewhere."""
        override = None
        for row, episode in enumerate(episodes):
            reads = self._reads.setdefault(episode, [])
            if len(reads) < self.plans:
                reads.append(live[row])
            if override is None:  # (B, E)
                override = torch.full((len(episodes), reads[0].numel()), float("nan"), device=reads[0].device)
            held = torch.stack(reads).mean(0)  # (E,)
            for a, b in self.slices:
                override[row, a:b] = held[a:b]
        return override


def _to_float_chw(image: torch.Tensor) -> torch.Tensor:
    image = torch.as_tensor(image)
    if image.dtype == torch.uint8:  # (B, H, W, 3) camera frames
        return image.permute(0, 3, 1, 2).float() / 255
    return image.float()
