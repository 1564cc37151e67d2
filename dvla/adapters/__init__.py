"""dvla.adapters: research options on top of the core model, one module each.

Importing this package registers the modules of `REGISTERED`, in that order: the order their hooks
run, their prefix tokens appear and their losses add up. Adding an adapter: write its module and
append its name here (docs/adapters.md).
"""

from importlib import import_module

REGISTERED = (
    "state_dropout",
    "sim_state",
    "reading_offsets",
    "scene_map",
    "text_film",
    "relation_token",
    "referent_pointers",
    "held_reading",
)
for _module in REGISTERED:
    import_module(f"dvla.adapters.{_module}")

from dvla.adapters.base import (  # noqa: E402
    ADAPTERS,
    HOOKS,
    Adapter,
    PolicyHook,
    adapters_config_class,
    hooks_config_class,
    register_adapter,
    register_hook,
)

AdaptersConfig = adapters_config_class()
PolicyHooksConfig = hooks_config_class()

__all__ = [
    "ADAPTERS",
    "HOOKS",
    "Adapter",
    "AdaptersConfig",
    "PolicyHook",
    "PolicyHooksConfig",
    "register_adapter",
    "register_hook",
]
