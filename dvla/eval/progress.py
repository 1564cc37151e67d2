"""An interrupted `dvla rollout` keeps its finished episodes in `partial.json`; `--resume` runs the rest.

The file is rewritten atomically after every finished episode. It records the settings that decide
an episode's outcome (the protocol); a resumed rollout must use the same ones, so one report never
mixes episodes of two checkpoints, decoding settings or devices.
"""

from __future__ import annotations

import json
from pathlib import Path

import draccus

PARTIAL_FILE = "partial.json"


def rollout_protocol(config, checkpoint, image_size: int, device_type: str, precision: str) -> dict:
    """What an episode's outcome depends on besides its task and seed."""
    decode = draccus.encode(config.decode)
    decode.pop("record_history", None)  # bookkeeping only
    return {
        "checkpoint": str(Path(checkpoint).resolve()),
        "max_steps": config.max_steps,
        "n_action_steps": config.n_action_steps,
        "execution": draccus.encode(config.execution),
        "action_bounds": config.action_bounds,
        "decode": decode,
        "hooks": {name: draccus.encode(hook) for name, hook in config.hooks.active().items()},
        "image_size": image_size,
        "mixed_precision": precision,  # resolved: "bf16" or "no", never "auto"
        "device": device_type,
    }


def save_partial(output: Path, protocol: dict, finished: dict, pending: int, stats, wall_s: float) -> None:
    """Write the episodes finished so far (and the planning timings behind them) atomically."""
    output.mkdir(parents=True, exist_ok=True)
    partial = {
        "pending_episodes": pending,
        "protocol": protocol,
        "episodes": finished,
        "plan_timing": {"ms": stats.ms, "chunks": stats.chunks, "forwards": stats.forwards},
        "wall_seconds": wall_s,
    }
    tmp = output / f".{PARTIAL_FILE}.tmp"
    tmp.write_text(json.dumps(partial))
    tmp.replace(output / PARTIAL_FILE)


def load_partial(output: Path, protocol: dict, resume: bool, wanted: set[tuple[str, int]]) -> dict | None:
    """The partial rollout in `output` to continue, None when there is none.

    Raises when one exists but `resume` is off (it would be overwritten), when its protocol differs,
    or when it holds episodes outside `wanted` ((task, seed) pairs), which the report would drop.
    """
    path = output / PARTIAL_FILE
    if not path.exists():
        if resume:
            print(f"rollout: nothing to resume in {output} (no {PARTIAL_FILE}); starting from the start")
        return None
    try:
        partial = json.loads(path.read_text())
        saved = {(task, e["seed"]) for task, episodes in partial["episodes"].items() for e in episodes}
        missing = {"protocol", "plan_timing", "wall_seconds"} - partial.keys()
        if missing:
            raise KeyError(sorted(missing))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(
            f"{path} is not a progress file of this dvla version ({error!r}); delete it to start over"
        ) from None
    if not resume:
        raise ValueError(
            f"{output} holds an interrupted rollout ({len(saved)} episodes finished, {PARTIAL_FILE}); pass "
            f"--resume to continue it, or choose another --output_dir (or delete {path} to start over)"
        )
    differ = sorted(key for key in protocol if partial["protocol"].get(key) != protocol[key])
    if differ:
        changes = ", ".join(f"{key}: {partial['protocol'].get(key)!r} -> {protocol[key]!r}" for key in differ)
        raise ValueError(
            f"cannot resume the rollout in {output}: its settings differ ({changes}). Use the same "
            f"settings, or another --output_dir for a new rollout"
        )
    outside = sorted(saved - wanted)
    if outside:
        raise ValueError(
            f"cannot resume the rollout in {output}: it holds episodes this run does not ask for "
            f"({len(outside)}, e.g. {outside[:3]}). --tasks, --suite, --episodes and --seed_start may "
            f"only add episodes on resume"
        )
    print(f"rollout: resuming {output}: {len(saved)} episodes already finished")
    return partial


def restore_timing(partial: dict, stats) -> float:
    """Put the saved planning timings back into `stats`; returns the wall seconds already spent."""
    for name in ("ms", "chunks", "forwards"):
        getattr(stats, name).extend(partial["plan_timing"][name])
    return partial["wall_seconds"]
