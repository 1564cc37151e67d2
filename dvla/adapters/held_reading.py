"""The held reading: a policy hook that averages the simulator-state head's first readings of an
episode and then holds them, for targets that do not move during an episode (a goal).

The live reading of a goal degrades once the arm leaves the demonstrated paths; holding the mean of
the first `plans` re-plans' readings keeps it where it was read best. Needs a checkpoint that takes
the reading as an input (adapters.sim_state with input: true, or adapters.reading_offsets). Costs one
more image-encoder pass per chunk while the average forms. Measured effect: docs/adapters.md#held_reading.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dvla.adapters.base import PolicyHook, register_hook
from dvla.adapters.reading_offsets import check_positions


@dataclass
class HoldReadingConfig:
    """Which simulator-state slices are held, after averaging how many re-plans."""

    # [start, stop] slices of 3-D positions ([[36, 39]]: MetaWorld's goal).
    slices: list[tuple[int, int]] = field(default_factory=list)
    plans: int = 3

    def __post_init__(self):
        if not self.slices:
            raise ValueError("hooks.hold_reading.slices is empty: list [start, stop] pairs, e.g. [[36, 39]]")
        check_positions(self.slices, "hooks.hold_reading.slices")
        if self.plans < 1:
            raise ValueError(f"hooks.hold_reading.plans must be >= 1, got {self.plans}")


@register_hook("hold_reading", HoldReadingConfig)
class HeldReading(PolicyHook):
    """Per episode, the mean of the head's first `plans` readings of the slices; after that it stops
    changing. Sets the override the sim_state adapter reads instead of its live reading."""

    def __init__(self, config: HoldReadingConfig, model):
        super().__init__(config, model)
        adapters = model.adapters
        sim = adapters["sim_state"] if "sim_state" in adapters else None  # noqa: SIM401 (ModuleDict has no get)
        if sim is None or (sim.input_proj is None and "reading_offsets" not in adapters):
            raise ValueError(
                "hooks.hold_reading needs a checkpoint that takes the head's reading as an input "
                "(adapters.sim_state with input: true, or adapters.reading_offsets)"
            )
        self._reads: dict = {}  # episode -> [(E,) normalised readings]

    def reset(self) -> None:
        self._reads.clear()

    def forget(self, episode) -> None:
        self._reads.pop(episode, None)

    def filling(self, episodes: list) -> bool:
        """Whether some of these episodes still average readings (and so need the live one)."""
        return any(len(self._reads.get(episode, ())) < self.config.plans for episode in episodes)

    def before_plan(self, model, obs, episodes: list) -> None:
        if episodes is None or len(episodes) != obs.batch_size:
            raise ValueError("hooks.hold_reading needs the episode of every row: pass episodes=[...]")
        # the live reading costs an encoder pass: only while some row's average is still forming
        live = model.adapters["sim_state"].predict(model, obs).float() if self.filling(episodes) else None
        obs.adapter_inputs["sim_state"] = self.update(episodes, live)

    def update(self, episodes: list, live: torch.Tensor | None) -> torch.Tensor:
        """live (B, E), or None once no episode is `filling` -> override (B, E): the held mean on
        the slices, NaN (the model's live reading) elsewhere."""
        override = None
        for row, episode in enumerate(episodes):
            reads = self._reads.setdefault(episode, [])
            if len(reads) < self.config.plans:
                reads.append(live[row])
            if override is None:  # (B, E)
                override = torch.full((len(episodes), reads[0].numel()), float("nan"), device=reads[0].device)
            held = torch.stack(reads).mean(0)  # (E,)
            for a, b in self.config.slices:
                override[row, a:b] = held[a:b]
        return override
