"""Reading offsets: where the simulator-state head reads some objects, relative to the hand, as a token.

The scripted experts act on exactly these offsets (reach: the goal minus the hand, clipped), which
the policy otherwise has to compute from two tokens in two different normalisations. The offsets are
taken in metres (x10) from the head's reading (`sim_state` adapter) and the robot state's first three
values (the hand), using the run's statistics (`bind_stats`, saved with the model as buffers).
Measured effect: docs/adapters.md#reading_offsets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from dvla.adapters.base import Adapter, Applies, CoreSpec, PrefixInputs, Slot, register_adapter
from dvla.processor import SIM_STATE_KEY, STATE_KEY, QuantileNormalizer


def check_positions(slices: list[tuple[int, int]], where: str) -> None:
    """Each slice must hold a 3-D position: [start, start + 3]."""
    for start, stop in slices:
        if start < 0 or stop - start != 3:
            raise ValueError(
                f"{where} entry [{start}, {stop}] must be a 3-D position: start >= 0, stop = start + 3"
            )


@dataclass
class ReadingOffsetsConfig:
    """Positions in the simulator state whose reading minus the hand becomes one prefix token."""

    # [start, stop] slices of 3-D positions in the simulator state: MetaWorld's first object and
    # goal are [[4, 7], [36, 39]].
    slices: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self):
        if not self.slices:
            raise ValueError(
                "adapters.reading_offsets.slices is empty: list [start, stop] pairs, e.g. [[36, 39]]"
            )
        check_positions(self.slices, "adapters.reading_offsets.slices")


@register_adapter("reading_offsets", ReadingOffsetsConfig)
class ReadingOffsetsAdapter(Adapter):
    applies_to = Applies.ROBOT
    slot = Slot.AFTER_STATE
    requires = ("sim_state",)

    def __init__(self, config: ReadingOffsetsConfig, core: CoreSpec):
        super().__init__(config, core)
        sim = core.adapters.sim_state
        if sim is None or sim.reads != "vision" or core.state_dim < 3:
            raise ValueError(
                "adapters.reading_offsets needs the image-token head's reading (adapters.sim_state with "
                f"reads: vision) and a robot state that starts with the hand's x, y, z (state_dim >= 3, "
                f"got {core.state_dim})"
            )
        if any(stop > sim.dim for _, stop in config.slices):
            raise ValueError(
                f"reading_offsets {config.slices} reach past the simulator state's {sim.dim} dims"
            )
        self._units_checked = False  # the NaN check syncs a GPU: once per module is enough
        for name, dim in (("state", core.state_dim), ("sim", sim.dim)):
            self.register_buffer(f"{name}_low", torch.full((dim,), float("nan")))
            self.register_buffer(f"{name}_span", torch.full((dim,), float("nan")))
        d = core.width
        self.proj = nn.Sequential(nn.Linear(3 * len(config.slices), d), nn.GELU(), nn.Linear(d, d))

    @torch.no_grad()
    def bind_stats(self, stats: dict) -> None:
        """The q01 and q99 - q01 of the robot state and of the simulator state."""
        missing = [k for k in (STATE_KEY, SIM_STATE_KEY) if k not in stats]
        if missing:
            raise ValueError(
                f"adapters.reading_offsets needs the statistics of {missing}; have {sorted(stats)}"
            )
        state, sim = QuantileNormalizer(stats, STATE_KEY), QuantileNormalizer(stats, SIM_STATE_KEY)
        for name, value in zip(
            ("state_low", "state_span", "sim_low", "sim_span"),
            (state.low, state.span, sim.low, sim.span),
            strict=True,
        ):
            getattr(self, name).copy_(torch.as_tensor(value, dtype=torch.float32))

    def offsets(self, reading: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """reading (B, E) and state (B, S), both normalised -> read positions minus the hand's, in
        decimetres (B, 3 * len(slices))."""
        if not self._units_checked:
            self._check_units()
        world = (reading.float() + 1) / 2 * self.sim_span + self.sim_low  # (B, E) metres
        hand = ((state.float() + 1) / 2 * self.state_span + self.state_low)[:, :3]  # (B, 3)
        return torch.cat([world[:, a:b] - hand for a, b in self.config.slices], dim=1) * 10  # (B, 3n)

    def prefix_tokens(self, inputs: PrefixInputs) -> torch.Tensor:
        reading = inputs.adapters["sim_state"].reading(inputs)  # (B, E)
        offsets = self.offsets(reading, inputs.obs.state)  # (B, 3n) decimetres
        return self.proj(offsets.to(inputs.state_token.dtype))[:, None]  # (B, 1, d)

    def _check_units(self) -> None:
        if torch.isnan(self.sim_low).any() or torch.isnan(self.state_low).any():
            raise RuntimeError(
                "adapters.reading_offsets has no units yet: load the model with dvla.checkpoint, or call "
                "model.bind_stats(stats) with the run's statistics"
            )
        self._units_checked = True
