"""The policy wrapper: raw observations in, robot actions out (normalisation, text, execution).

Shaped like lerobot's PreTrainedPolicy (`reset`, `select_action`, `predict_action_chunk`) over the
pure model (`DiffusionVLA.compute_loss` / `sample_actions`). Inference only: training turns samples
into batches with `dvla.processor.Processor` directly. Each episode (a batch row, or any key in
`plan`/`pop`) gets its own stream of chunks (`dvla.execution`): receding horizon, inpainted
continuation or temporal ensembling, under a simulated inference delay.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from dvla.action_head.base import ChunkConstraint
from dvla.adapters import HOOKS, PolicyHooksConfig
from dvla.backbone.decoder import DecodeConfig, action_decode_config
from dvla.checkpoint import load_checkpoint
from dvla.execution import ChunkExecutor, ExecutionConfig
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
    # How chunks are executed: receding horizon, inpainted continuation or temporal ensembling,
    # under a simulated inference delay (dvla/execution.py).
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    # Per-dimension action limits in robot units, (low, high) of D values each: every decoded action
    # stays inside them by construction (allowed-bin masks; the flow head clamps). None = none.
    action_bounds: tuple[list[float], list[float]] | None = None
    # Real asynchronous execution: a pipelined chunk is computed in a background thread while the
    # robot runs the old chunk's last execution.inference_delay actions (the most control steps the
    # computation may take; a later result makes the robot wait). Needs a delay > 0.
    background: bool = False
    # How answers to questions are decoded.
    answer_decode: DecodeConfig = field(default_factory=DecodeConfig)
    # Run-time hooks of adapters (e.g. hold_reading), each off unless set.
    hooks: PolicyHooksConfig = field(default_factory=PolicyHooksConfig)

    def __post_init__(self):
        if self.n_action_steps is not None and self.n_action_steps < 1:
            raise ValueError(f"n_action_steps must be >= 1, got {self.n_action_steps}")
        if self.background and (self.execution.inference_delay == 0 or self.execution.mode == "ensemble"):
            raise ValueError(
                "background planning needs execution.inference_delay > 0 (the control steps a chunk "
                "may take to compute) and the receding or inpaint mode"
            )


class DiffusionVLAPolicy:
    def __init__(self, model: DiffusionVLA, tokenizer, stats: dict, config: PolicyConfig | None = None):
        self.model, self.tokenizer, self.stats = model, tokenizer, stats
        self.config = config or PolicyConfig()
        chunk = model.config.chunk_size
        self.n_action_steps = self.config.execution.window(chunk, self.config.n_action_steps)  # checks it
        model.head.check_decode(self.config.decode)  # too many steps for a chunk is an error
        # an answer block fills in at most one step per token: the steps that really run
        answer = self.config.answer_decode
        self.answer_decode = replace(answer, steps=min(answer.steps, model.config.answer_tokens))
        self.processor = Processor(tokenizer, stats, model.config, self.device)
        model.bind_stats(stats)  # the units adapters read positions in are the policy's statistics
        self.acts = self.processor.acts  # a VQA-only checkpoint has no robot stats and cannot act
        self.action_cameras = [c for c in model.config.vision.cameras if c != VQA_CAMERA]
        self.hooks = [HOOKS[name].adapter(cfg, model) for name, cfg in self.config.hooks.active().items()]
        self.bounds = self._normalised_bounds(self.config.action_bounds)  # (low, high) (D,) or None
        self._executors: dict = {}  # episode key -> ChunkExecutor
        # episode key -> how its last chunk formed (with decode.record_history): history, confidence
        # (per step, (H*D,) each) and the number of known steps
        self.traces: dict = {}
        self._lock = threading.Lock()  # one model call at a time (a background plan, or this thread)
        self._background = ThreadPoolExecutor(1) if self.config.background else None
        self._in_flight: list[tuple[Future, list, list[ChunkExecutor]]] = []  # (result, episodes, executors)
        self.last_forwards = 0  # backbone forwards of the last chunk (prefix pass included)

    @classmethod
    def from_pretrained(cls, path: str | Path, config: PolicyConfig | None = None, device="cpu"):
        model, tokenizer, stats = load_checkpoint(path, device)
        return cls(model, tokenizer, stats, config)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _normalised_bounds(self, bounds) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Robot-unit (low, high) -> the model's normalised units (not clipped to [-1, 1])."""
        if bounds is None:
            return None
        if not self.acts:
            raise ValueError("action_bounds: this checkpoint has no robot statistics and cannot act")
        norm = self.processor.action_norm
        low, high = (torch.as_tensor(b, dtype=torch.float32) for b in bounds)
        d = norm.low.numel()
        if low.shape != (d,) or high.shape != (d,):
            raise ValueError(
                f"action_bounds need {d} low and {d} high values, got {low.numel()} and {high.numel()}"
            )
        if (low > high).any():
            raise ValueError(
                f"action_bounds: a low value exceeds its high one ({low.tolist()} > {high.tolist()})"
            )
        return tuple((b - norm.low) / norm.span * 2 - 1 for b in (low, high))

    def reset(self) -> None:
        """Forget every episode's chunks and the hooks' per-episode state (call at episode start)."""
        self._executors.clear()
        self._in_flight.clear()  # a late result finds no executor of its own and is dropped
        for hook in self.hooks:
            hook.reset()

    def forget(self, episode) -> None:
        """A new episode starts under the key `episode` (batched actors, see dvla.eval.actors)."""
        self._executors.pop(episode, None)
        for hook in self.hooks:
            hook.forget(episode)

    def _executor(self, episode) -> ChunkExecutor:
        if episode not in self._executors:
            config = self.config
            self._executors[episode] = ChunkExecutor(config.execution, self.model.config.chunk_size,
                                                     config.n_action_steps)  # fmt: skip
        return self._executors[episode]

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
    def predict_action_chunk(self, images, texts, state, episodes: list | None = None, known=None):
        """A whole chunk (B, H, D) in robot units. With hooks that keep per-episode state,
        `episodes` names the episode of each row (any hashable). `known` (B, K, D): normalised
        actions the chunk must start with (inpainting)."""
        return self._chunk(images, texts, state, episodes, known)[1]

    @torch.no_grad()
    def _chunk(self, images, texts, state, episodes, known) -> tuple[torch.Tensor, torch.Tensor]:
        """(normalised, robot-unit) chunks (B, H, D) under the known steps and the bounds."""
        with self._lock:
            return self._chunk_locked(images, texts, state, episodes, known)

    def _chunk_locked(self, images, texts, state, episodes, known):
        self.model.eval()
        obs = self.observation(images, texts, state)
        for hook in self.hooks:
            hook.before_plan(self.model, obs, episodes)
        low, high = self.bounds or (None, None)
        constraint = None
        if known is not None or self.bounds is not None:
            constraint = ChunkConstraint(None if known is None else known.to(self.device), low, high)
        decode = self.config.decode
        actions, self.last_forwards = self.model.sample_actions(obs, decode, constraint=constraint)
        trace = getattr(self.model.head, "trace", None)
        if decode.record_history and trace is not None:
            k = 0 if known is None else known.shape[1]
            for i, episode in enumerate(episodes or range(len(texts))):
                self.traces[episode] = ([h[i] for h in trace.history], [c[i] for c in trace.confidence], k)
        return actions.float(), self.processor.robot_actions(actions)

    def planning(self, episodes: list) -> list:
        """Which of `episodes` need a new chunk at this control step."""
        return [e for e in episodes if self._executor(e).wants_plan()]

    @torch.no_grad()
    def plan(self, episodes: list, images, texts, state) -> None:
        """Plan a chunk for each of `episodes` (rows of the observation: images {camera: (B, ...)},
        texts, state (B, S)); rows that continue a chunk (inpaint) are batched by their known length."""
        groups: dict[int, list[int]] = {}
        for row, episode in enumerate(episodes):
            known = self._executor(episode).known()
            groups.setdefault(0 if known is None else len(known), []).append(row)
        pipelined = {episode: self._executor(episode).begin() for episode in episodes}
        for length, rows in groups.items():
            pick = rows if len(rows) < len(episodes) else slice(None)
            known = torch.stack([self._executor(episodes[r]).known() for r in rows]) if length else None
            mine = [episodes[r] for r in rows]
            inputs = ({c: image[pick] for c, image in images.items()}, [texts[r] for r in rows], state[pick],
                      mine, known)  # fmt: skip
            executors = [self._executor(e) for e in mine]
            if self._background and all(pipelined[e] for e in mine):  # the robot runs the old chunk meanwhile
                future = self._background.submit(_with_autocast_of_caller(self.device), self._chunk, *inputs)
                self._in_flight.append((future, mine, executors))
                continue
            normalised, robot = self._chunk(*inputs)
            for i, executor in enumerate(executors):
                executor.accept(normalised[i], robot[i])

    def plan_ahead(self, episode) -> tuple[torch.Tensor, int] | None:
        """The episode's latest chunk (H, D) in robot units and the index of the step its next
        action comes from (`ChunkExecutor.plan_ahead`), or None before its first chunk."""
        return self._executor(episode).plan_ahead()

    def source(self, episode) -> int | None:
        """The chunk index the episode's last action came from (None when chunks are ensembled)."""
        return self._executor(episode).source

    def pop(self, episodes: list) -> torch.Tensor:
        """This control step's action (B, D) of each of `episodes`, in robot units (waiting for a
        background chunk only when an episode has run out of actions without it)."""
        needed = {id(x) for x in map(self._executor, episodes) if x.waiting()}
        for entry in list(self._in_flight):
            future, mine, executors = entry
            if not future.done() and not needed & {id(x) for x in executors}:
                continue
            normalised, robot = future.result()
            self._in_flight.remove(entry)
            for i, (episode, executor) in enumerate(zip(mine, executors, strict=True)):
                if self._executors.get(episode) is executor:  # not an episode forgotten meanwhile
                    executor.accept(normalised[i], robot[i])
        return torch.stack([self._executor(e).pop() for e in episodes])

    @torch.no_grad()
    def select_action(self, images, texts, state) -> torch.Tensor:
        """The next action (B, D) of each row's episode (rows are episodes until `reset`)."""
        rows = list(range(torch.as_tensor(state).shape[0]))
        if self.planning(rows):
            self.plan(rows, images, texts, state)  # in lockstep, every row plans at the same steps
        return self.pop(rows)

    @torch.no_grad()
    def answer(self, images, questions: list[str], decode: DecodeConfig | None = None) -> list[str]:
        """Answers to questions about images (one question per image)."""
        self.model.eval()
        obs = self.observation(images, questions, None)
        return self.processor.answers(self.model.answer(obs, decode or self.answer_decode).tokens)


def _with_autocast_of_caller(device: torch.device):
    """A runner that calls a function under the calling thread's autocast state (autocast is
    thread-local: a background plan must run in the same precision as a synchronous one)."""
    enabled = torch.is_autocast_enabled(device.type)
    dtype = torch.get_autocast_dtype(device.type)

    def run(fn, *args):
        with torch.autocast(device.type, dtype=dtype, enabled=enabled):
            return fn(*args)

    return run
