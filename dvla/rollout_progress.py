"""An interrupted `dvla rollout` keeps its finished episodes in `partial.json`; `--resume` runs the rest.

The file is rewritten atomically after every finished episode. It records the settings that decide
an episode's outcome (the protocol); a resumed rollout must use the same ones, so one report never
mixes episodes of two checkpoints or two decoding settings.
"""

from __future__ import annotations

import json
from pathlib import Path

import draccus

PARTIAL_FILE = "partial.json"


def rollout_protocol(config, checkpoint, image_size: int) -> dict:
    """What an episode's outcome depends on besides its task and seed."""
    return {
        "checkpoint": str(checkpoint),
        "max_steps": config.max_steps,
        "n_action_steps": config.n_action_steps,
        "decode": draccus.encode(config.decode),
        "image_size": image_size,
        "mixed_precision": config.mixed_precision,
    }


def save_partial(output: Path, protocol: dict, finished: dict, pending: int, stats, wall_s: float) -> None:
    """Write the episodes finished so far (and the planning timings behind them) atomically."""
    output.mkdir(parents=True, exist_ok=True)
    partial = {
        "complete": False,
        "pending_episodes": pending,
        "protocol": protocol,
        "episodes": finished,
        "plan_timing": {"ms": stats.ms, "chunks": stats.chunks, "forwards": stats.forwards},
        "wall_seconds": wall_s,
    }
    tmp = output / f".{PARTIAL_FILE}.tmp"
    tmp.write_text(json.dumps(partial))
    tmp.replace(output / PARTIAL_FILE)


def load_partial(output: Path, protocol: dict, resume: bool) -> dict | None:
    """The partial rollout in `output` to continue, None when there is none.

    Raises when one exists but `resume` is off (it would be overwritten) or when its protocol differs.
    """
    path = output / PARTIAL_FILE
    if not path.exists():
        if resume:
            print(f"rollout: nothing to resume in {output} (no {PARTIAL_FILE}); starting from the start")
        return None
    try:
        partial = json.loads(path.read_text())
        episodes = partial["episodes"]
    except (json.JSONDecodeError, KeyError) as error:
        raise ValueError(
            f"{path} is not a rollout progress file ({error}); delete it to start over"
        ) from None
    done = sum(len(v) for v in episodes.values())
    if not resume:
        raise ValueError(
            f"{output} holds an interrupted rollout ({done} episodes finished, {PARTIAL_FILE}); pass "
            f"--resume to continue it, or choose another --output_dir (or delete {path} to start over)"
        )
    saved = partial.get("protocol")
    if saved is None:
        raise ValueError(f"{path} was written by an older dvla without its settings; delete it to start over")
    differ = sorted(key for key in protocol if saved.get(key) != protocol[key])
    if differ:
        changes = ", ".join(f"{key}: {saved.get(key)!r} -> {protocol[key]!r}" for key in differ)
        raise ValueError(
            f"cannot resume the rollout in {output}: its settings differ ({changes}). Use the same "
            f"settings, or another --output_dir for a new rollout"
        )
    print(f"rollout: resuming {output}: {done} episodes already finished")
    return partial
