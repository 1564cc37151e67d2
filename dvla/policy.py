"""The policy wrapper: raw observations in, robot actions out (normalisation, text, action queue).

Shaped like lerobot's PreTrainedPolicy (`reset`, `select_action`, `predict_action_chunk`) over the
pure model (`DiffusionVLA.compute_loss` / `sample_actions`). Inference only: training turns samples
into batches with `dvla.processor.Processor` directly.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from dvla.adapters import HOOKS, PolicyHooksConfig
from dvla.backbone.decoder import DecodeConfig, action_decode_config
from dvla.checkpoint import load_checkpoint
from dvla.model import DiffusionVLA
from dvla.processor import Processor
from dvla.types import VQA_CAMERA


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
    # Run-time hooks of adapters (e.g. hold_reading), each off unless set.
    hooks: PolicyHooksConfig = field(default_factory=PolicyHooksConfig)

    def __post_init__(self):
        if self.n_action_steps is not None and self.n_action_steps < 1:
            raise ValueError(f"n_action_steps must be >= 1, got {self.n_action_steps}")


class DiffusionVLAPolicy:
    def __init__(self, model: DiffusionVLA, tokenizer, stats: dict, config: PolicyConfig | None = None):
        self.model, self.tokenizer, self.stats = model, tokenizer, stats
        self.config = config or PolicyConfig()
        chunk = model.config.chunk_size
        self.n_action_steps = self.config.n_action_steps or max(1, chunk // 2)
        if self.n_action_steps > chunk:
            raise ValueError(f"n_action_steps must be in [1, chunk_size={chunk}], got {self.n_action_steps}")
        model.head.check_decode(self.config.decode)  # too many steps for a chunk is an error
        # an answer block fills in at most one step per token: the steps that really run
        answer = self.config.answer_decode
        self.answer_decode = replace(answer, steps=min(answer.steps, model.config.answer_tokens))
        self.processor = Processor(tokenizer, stats, model.config, self.device)
        model.bind_stats(stats)  # the units adapters read positions in are the policy's statistics
        self.acts = self.processor.acts  # a VQA-only checkpoint has no robot stats and cannot act
        self.action_cameras = [c for c in model.config.vision.cameras if c != VQA_CAMERA]
        self.hooks = [HOOKS[name].adapter(cfg, model) for name, cfg in self.config.hooks.active().items()]
        self._queue: deque[torch.Tensor] = deque()
        self.last_forwards = 0  # backbone forwards of the last chunk (prefix pass included)

    @classmethod
    def from_pretrained(cls, path: str | Path, config: PolicyConfig | None = None, device="cpu"):
        model, tokenizer, stats = load_checkpoint(path, device)
        return cls(model, tokenizer, stats, config)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def reset(self) -> None:
        """Forget queued actions and the hooks' per-episode state (call at every episode start)."""
        self._queue.clear()
        for hook in self.hooks:
            hook.reset()

    def forget(self, episode) -> None:
        """A new episode starts under the key `episode` (batched actors, see dvla.eval.actors)."""
        for hook in self.hooks:
            hook.forget(episode)

    def observation(self, images: dict, texts: list[str], state):
        """images {camera: (B, 3, H, W) float in [0, 1] or (B, H, W, 3) uint8}, raw state (B, S)."""
        if state is not None:
            missing = [c for c in self.action_cameras if c not in images]
            if self.acts and missing:
                raise ValueError(f"missing camera(s) {missing}; the policy acts on {self.action_cameras}")
        return self.processor.observation(images, texts, state)

    @torch.no_grad()
    def predict_sim_state(self, images, texts, state) -> torch.Tensor:
        """What the model sees of the simulator state (B, E), in the dataset's units (needs a
        checkpoint trained with the sim_state adapter)."""
        if "sim_state" not in self.model.adapters or self.processor.sim_state_norm is None:
            raise ValueError(
                "this checkpoint has no simulator-state head; train with model.adapters.sim_state "
                "and dataset.sim_state_key sim.state"
            )
        self.model.eval()
        obs = self.observation(images, texts, state)
        reading = self.model.adapters["sim_state"].predict(self.model, obs)
        return self.processor.sim_state_norm.unnormalize(reading.float())

    @torch.no_grad()
    def predict_action_chunk(self, images, texts, state, episodes: list | None = None) -> torch.Tensor:
        """A whole chunk (B, H, D) in robot units. With hooks that keep per-episode state,
        `episodes` names the episode of each row (any hashable)."""
        self.model.eval()
        obs = self.observation(images, texts, state)
        for hook in self.hooks:
            hook.before_plan(self.model, obs, episodes)
        actions, self.last_forwards = self.model.sample_actions(obs, self.config.decode)
        return self.processor.robot_actions(actions)

    @torch.no_grad()
    def select_action(self, images, texts, state) -> torch.Tensor:
        """The next action (B, D): from the queue, re-planned every n_action_steps."""
        if not self._queue:
            rows = list(range(torch.as_tensor(state).shape[0]))
            chunk = self.predict_action_chunk(images, texts, state, rows)  # (B, H, D)
            self._queue.extend(chunk[:, : self.n_action_steps].unbind(1))
        return self._queue.popleft()

    @torch.no_grad()
    def answer(self, images, questions: list[str], decode: DecodeConfig | None = None) -> list[str]:
        """Answers to questions about images (one question per image)."""
        self.model.eval()
        obs = self.observation(images, questions, None)
        return self.processor.answers(self.model.answer(obs, decode or self.answer_decode).tokens)
