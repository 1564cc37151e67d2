"""How predicted chunks become executed actions, one stream per episode, under an inference delay.

A robot keeps moving while the next chunk is computed. With an inference delay of d control steps
the next chunk is planned from the observation d steps before the current window ends; the robot
executes those last d actions of the old chunk meanwhile and switches to the new chunk at its step
d. The delay is simulated: planning runs synchronously, the environment only ever sees actions the
robot would have executed. Modes:

- `receding`: the next chunk is decoded from scratch (d = 0: today's receding horizon; d > 0: naive
  asynchronous execution, whose first d steps may disagree with what the robot did meanwhile).
- `inpaint`: the next chunk is decoded with its first d steps fixed to the d actions executed
  meanwhile (real-time chunking by inpainting: a masked-diffusion decoder conditions the rest of
  the chunk on them at no extra forward).
- `ensemble`: ACT's temporal ensembling: a chunk is planned every step and each action is the
  weighted mean of every available chunk's prediction for that step (weights exp(-coeff * i),
  i = 0 for the oldest); a chunk planned at t is available from t + d.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import torch

EXECUTION_MODES = ("receding", "inpaint", "ensemble")


@dataclass
class ExecutionConfig:
    """How chunks are executed (`dvla rollout --execution.mode inpaint --execution.inference_delay 4`)."""

    # receding, inpaint or ensemble (see dvla/execution.py).
    mode: str = "receding"
    # Control steps the robot executes while the next chunk is computed (simulated; 0 = none).
    inference_delay: int = 0
    # Temporal-ensembling weight decay (ACT's default), for mode ensemble.
    ensemble_coeff: float = 0.01

    def __post_init__(self):
        if self.mode not in EXECUTION_MODES:
            raise ValueError(f"execution.mode must be one of {EXECUTION_MODES}, got {self.mode!r}")
        if self.inference_delay < 0:
            raise ValueError(f"inference_delay must be >= 0, got {self.inference_delay}")
        if self.ensemble_coeff < 0:
            raise ValueError(f"ensemble_coeff must be >= 0, got {self.ensemble_coeff}")

    def window(self, chunk: int, n_action_steps: int | None) -> int:
        """Actions executed per chunk of `chunk` steps (`n_action_steps`, None = half the chunk; 1
        when ensembling); refuses what does not fit."""
        steps = n_action_steps or max(1, chunk // 2)
        d = self.inference_delay
        if self.mode == "ensemble":
            if d >= chunk:
                raise ValueError(f"inference_delay {d} must be below the chunk's {chunk} steps")
            return 1
        if steps > chunk:
            raise ValueError(f"n_action_steps must be in [1, chunk_size={chunk}], got {steps}")
        if d > steps or d + steps > chunk:
            raise ValueError(
                f"inference_delay {d} with n_action_steps {steps} does not fit a chunk of {chunk}: the "
                f"next chunk starts d steps before the window ends and must hold d + n_action_steps "
                f"actions (d <= n_action_steps, d + n_action_steps <= {chunk})"
            )
        return steps


class ChunkExecutor:
    """One episode's actions from its chunks. Each control step: if `wants_plan()`, `begin()` a plan
    (with `known()` as its fixed first steps) and `accept` the chunk; then `pop()` the action to
    execute. A pipelined plan (one made while actions are left) may be accepted later, from a
    background thread's result, as long as it is accepted before `waiting()` holds at a `pop`."""

    def __init__(self, config: ExecutionConfig, chunk: int, n_action_steps: int | None = None):
        self.config, self.chunk = config, chunk
        self.window = config.window(chunk, n_action_steps)
        self.delay = config.inference_delay
        self.t = 0  # control steps executed
        self.queue: deque[tuple] = deque()  # (normalised, robot, chunk index) per action
        self.pending: list[tuple] | None = None
        self.planned = 0  # chunks accepted
        self.source: int | None = None  # the chunk the last popped action came from (None: ensembled)
        self.chunks: list[tuple[int, int, torch.Tensor]] = []  # ensemble: (planned at, usable from, robot)
        self.in_flight: str | None = None  # a begun plan: "now" (executed from its step 0) or "next"
        self.begun_at = 0  # the control step the begun plan observed
        self.latest: tuple[int, torch.Tensor] | None = None  # (step 0 at, last chunk (H, D) robot units)

    def wants_plan(self) -> bool:
        if self.in_flight:
            return False
        if self.config.mode == "ensemble":
            return True
        if not self.queue and self.pending is None:  # the episode's start, or no delay
            return True
        return self.delay > 0 and self.pending is None and len(self.queue) == self.delay

    def begin(self) -> bool:
        """A plan starts from this step's observation; True when it is pipelined (the robot runs the
        d actions left meanwhile), False when the robot waits for it."""
        pipelined = self.config.mode != "ensemble" and bool(self.queue)
        self.in_flight = "next" if pipelined else "now"
        self.begun_at = self.t
        return pipelined

    def waiting(self) -> bool:
        """Whether the next `pop` needs the pipelined chunk still in flight."""
        return self.in_flight == "next" and not self.queue

    def known(self) -> torch.Tensor | None:
        """(d, D) normalised actions the next chunk must start with (inpaint), else None."""
        if self.config.mode != "inpaint" or not self.queue or self.delay == 0:
            return None
        return torch.stack([step[0] for step in list(self.queue)[: self.delay]])

    def accept(self, normalised: torch.Tensor, robot: torch.Tensor) -> None:
        """The chunk (H, D) of the begun plan, in both units."""
        if self.in_flight is None:  # planned and accepted within this step
            self.begin()
        kind, self.in_flight = self.in_flight, None
        self.latest = (self.begun_at, robot)
        if self.config.mode == "ensemble":
            self.planned += 1
            usable = self.t + (self.delay if self.chunks else 0)  # the first one: the robot waits
            self.chunks.append((self.t, usable, robot))
            return
        index = self.planned
        self.planned += 1
        steps = [(n, r, index) for n, r in zip(normalised.unbind(0), robot.unbind(0), strict=True)]
        if kind == "now":  # the robot waited for it: executed from its first step
            self.queue.extend(steps[: self.window])
        elif self.queue:  # executed from step d, once the d actions left of the old chunk have run
            self.pending = steps[self.delay : self.delay + self.window]
        else:  # a pipelined chunk that arrived after the old one ran out
            self.queue.extend(steps[self.delay : self.delay + self.window])

    def plan_ahead(self) -> tuple[torch.Tensor, int] | None:
        """The latest chunk (H, D) in robot units and the index of its step that the next `pop`
        executes (how far the robot has got along it; beyond H when it has run out), or None."""
        if self.latest is None:
            return None
        start, robot = self.latest
        return robot, self.t - start

    def pop(self) -> torch.Tensor:
        """The robot action (D,) of this control step."""
        if self.waiting():
            raise RuntimeError("the pipelined chunk must be accepted before the old one runs out")
        if self.config.mode == "ensemble":
            action = self._ensembled()
        else:
            _, action, self.source = self.queue.popleft()
            if not self.queue and self.pending is not None:
                self.queue.extend(self.pending)
                self.pending = None
        self.t += 1
        return action

    def _ensembled(self) -> torch.Tensor:
        t = self.t
        self.chunks = [c for c in self.chunks if t < c[0] + self.chunk]  # still covering this step
        usable = [(start, robot) for start, ready, robot in self.chunks if ready <= t]
        weights = [math.exp(-self.config.ensemble_coeff * i) for i in range(len(usable))]  # oldest first
        total = sum(w * robot[t - start] for w, (start, robot) in zip(weights, usable, strict=True))
        return total / sum(weights)
