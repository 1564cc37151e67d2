"""The adapter interface: one research option plugged into the core model, one module each.

An adapter is an `nn.Module` with a typed config, registered by name (`@register_adapter`), built
when `model.adapters.<name>` is set. The core calls its hooks in registry order, each optional:

- `draw`: per-sample random choices of a training batch, drawn before the head's noise;
- `prepare`: read the encoder's tokens before any adapter modulates them;
- `modulate_images`: rewrite the image tokens (e.g. condition them on the question);
- `state_token`: rewrite the robot-state token;
- `prefix_tokens`: more prefix tokens, placed at `slot` (after the images or after the state);
- `aux_loss`: an auxiliary loss with its metrics, added with the adapter's weight;
- `bind_stats`: take what it needs from the run's normalisation statistics;
- `vqa_targets`: the targets it asks the VQA data for (built in `dvla.sim.vqa_targets`).

`applies_to` says which observations it serves: robot observations (with a state), questions
(without one), or both. How to write one: docs/adapters.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

import torch
from torch import nn

from dvla.types import ActionBatch, Observation, VQABatch


class Applies(StrEnum):
    """Which observations an adapter serves."""

    ROBOT = "robot"  # robot observations (they have a state)
    QUESTION = "question"  # questions about an image (no state)
    BOTH = "both"


class Slot(StrEnum):
    """Where an adapter's prefix tokens go: [images | AFTER_IMAGES | text | state | AFTER_STATE]."""

    AFTER_IMAGES = "after_images"
    AFTER_STATE = "after_state"


@dataclass
class CoreSpec:
    """What an adapter may know of the core model when it is built."""

    width: int  # backbone hidden size d
    cameras: list[str]  # the encoder's cameras, in order
    tokens_per_camera: int  # grid tokens per camera (K)
    tokens_per_image: int  # all tokens per camera (K + keypoints)
    state_dim: int
    max_text_tokens: int
    adapters: Any  # every adapter's config (AdaptersConfig), for rules across adapters


@dataclass
class PrefixInputs:
    """What one prefix pass has computed so far; adapters read it and leave results in `found`."""

    obs: Observation
    encoded: torch.Tensor  # (I, N, d) the encoder's tokens, one row per image
    images: torch.Tensor  # (B, N', d) the image tokens each sample reads (modulated in turn)
    text: torch.Tensor  # (B, L, d) text embeddings
    train: bool
    adapters: dict[str, Adapter]  # every active adapter, by name
    draws: dict[str, Any] = field(default_factory=dict)  # `draw` results of this batch, by adapter
    found: dict[str, Any] = field(default_factory=dict)  # what adapters computed in this pass
    state_token: torch.Tensor | None = None  # (B, d) once built (robot observations)
    state_position: int | None = None  # its index in the prefix
    valid: torch.Tensor | None = None  # (B, P) the prefix's validity, once assembled

    @property
    def question(self) -> bool:
        return self.obs.state is None


@dataclass
class LossInputs:
    """What an auxiliary loss may read: the pass's prefix inputs, the backbone's hidden states of
    [prefix | target] (B, P + T, d), the batch with its targets and the core model."""

    prefix: PrefixInputs
    hidden: torch.Tensor
    target_length: int
    batch: ActionBatch | VQABatch
    model: nn.Module  # the core model (its vision encoder, its answer logits)


class Adapter(nn.Module):
    """Base class: every hook is optional and does nothing by default."""

    name: ClassVar[str]
    applies_to: ClassVar[Applies] = Applies.BOTH
    slot: ClassVar[Slot | None] = None
    # adapters that must be active too (their hooks run first: registry order)
    requires: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config, core: CoreSpec):
        super().__init__()
        self.config, self.core = config, core

    def serves(self, obs: Observation) -> bool:
        question = obs.state is None
        return self.applies_to == Applies.BOTH or (self.applies_to == Applies.QUESTION) == question

    @property
    def weight(self) -> float:
        """Weight of the auxiliary loss in the training loss."""
        return float(getattr(self.config, "weight", 1.0))

    def draw(self, batch_size: int, device: torch.device, generator=None) -> Any:
        return None

    def prepare(self, inputs: PrefixInputs) -> None:
        return None

    def modulate_images(self, inputs: PrefixInputs) -> torch.Tensor | None:
        return None

    def state_token(self, token: torch.Tensor, inputs: PrefixInputs) -> torch.Tensor:
        return token

    def prefix_tokens(self, inputs: PrefixInputs) -> torch.Tensor | None:
        return None

    def aux_loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]] | None:
        return None

    def bind_stats(self, stats: dict) -> None:
        return None

    def vqa_targets(self) -> dict[str, dict]:
        return {}


@dataclass
class Registered:
    adapter: type
    config: type


ADAPTERS: dict[str, Registered] = {}
HOOKS: dict[str, Registered] = {}


def _registrar(registry: dict[str, Registered], what: str, name: str, config: type):
    def register(cls: type) -> type:
        if name in registry:
            raise ValueError(f"{what} named {name!r} is already registered")
        if not dataclasses.is_dataclass(config):
            raise TypeError(f"the config of {what} {name!r} must be a dataclass")
        cls.name = name
        registry[name] = Registered(cls, config)
        return cls

    return register


def register_adapter(name: str, config: type):
    """Class decorator: `@register_adapter("text_film", TextFiLMConfig)` makes the adapter
    available as `model.adapters.text_film` with that config."""
    return _registrar(ADAPTERS, "an adapter", name, config)


def register_hook(name: str, config: type):
    """Class decorator: `@register_hook("hold_reading", HoldReadingConfig)` makes the policy hook
    available as the policy's `hooks.hold_reading` with that config."""
    return _registrar(HOOKS, "a policy hook", name, config)


def _options_class(class_name: str, registry: dict[str, Registered], doc: str) -> type:
    """A dataclass with one optional field per registered entry (None = off), in registry order."""
    fields = [(name, entry.config | None, field(default=None)) for name, entry in registry.items()]
    cls = dataclasses.make_dataclass(class_name, fields, namespace={"active": _active})
    cls.__doc__ = doc
    cls.__module__ = __name__
    return cls


def adapters_config_class() -> type:
    """`model.adapters` in configs and checkpoints."""
    return _options_class(
        "AdaptersConfig",
        ADAPTERS,
        "Research options on top of the core model; each is off (null) unless configured.",
    )


def _active(self) -> dict[str, Any]:
    """The configured entries {name: config} (adapters or hooks), in registry order."""
    return {
        f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None
    }


def build_adapters(configs, core: CoreSpec) -> nn.ModuleDict:
    """The active adapters, in registry order, after checking what each requires."""
    active = configs.active()
    for name in active:
        missing = [r for r in ADAPTERS[name].adapter.requires if r not in active]
        if missing:
            raise ValueError(f"model.adapters.{name} needs model.adapters.{missing[0]} too")
    return nn.ModuleDict({name: ADAPTERS[name].adapter(config, core) for name, config in active.items()})


def fit_to_data(configs, facts: dict[str, Any]):
    """A copy of `configs` with data-dependent values filled in by each adapter config's
    `fit(facts)` (e.g. the simulator state's size); facts come from the training data."""
    changes = {}
    for name, config in configs.active().items():
        fit = getattr(config, "fit", None)
        if fit is not None:
            changes[name] = fit(facts)
    return dataclasses.replace(configs, **changes)


class PolicyHook:
    """Run-time state an adapter keeps across the re-plans of an episode (e.g. a held reading).
    Registered by name (`@register_hook`) with a config, set under the policy's `hooks.<name>`."""

    name: ClassVar[str]

    def __init__(self, config, model):
        self.config = config

    def reset(self) -> None:
        """Every episode starts anew."""

    def forget(self, episode) -> None:
        """The episode under this key starts anew."""

    def before_plan(self, model, obs: Observation, episodes: list) -> None:
        """Called before each chunk is planned; may set obs.adapter_inputs."""


def hooks_config_class() -> type:
    """The policy's `hooks`."""
    return _options_class(
        "PolicyHooksConfig", HOOKS, "Run-time hooks of adapters; each is off (null) unless configured."
    )
