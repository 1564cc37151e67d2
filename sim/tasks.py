"""MetaWorld task catalogue: task names, instructions and suites (mt10, mt50, difficulty groups).

Instructions and difficulty groups are read from lerobot's own MetaWorld config so that datasets
and checkpoints line up with `lerobot/metaworld_mt50` and `lerobot-eval`.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path

# lerobot's MetaWorld evaluation builds each task with MT1(task, seed=42) and evaluates from seed 1000.
MT1_SEED = 42
EVAL_SEED_START = 1000
TRAIN_SEED_LIMIT = EVAL_SEED_START  # training episodes use seeds [0, 1000) so they never meet eval seeds


@functools.cache
def _lerobot_metaworld_config() -> dict:
    spec = importlib.util.find_spec("lerobot")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("lerobot is not installed; install dvla with `pip install -e .`")
    path = Path(spec.submodule_search_locations[0]) / "envs" / "metaworld_config.json"
    return json.loads(path.read_text())


@functools.cache
def all_tasks() -> tuple[str, ...]:
    """Every MetaWorld v3 task name, in MetaWorld's MT50 order."""
    from metaworld.env_dict import MT50_V3

    return tuple(MT50_V3.keys())


def task_description(task: str) -> str:
    """The natural-language instruction lerobot uses for a MetaWorld task."""
    check_tasks([task])
    return _lerobot_metaworld_config()["TASK_DESCRIPTIONS"][task]


@functools.cache
def suites() -> dict[str, tuple[str, ...]]:
    """Named task suites: mt10, mt50 and lerobot's difficulty groups (easy, medium, hard)."""
    from metaworld.env_dict import MT10_V3

    groups = _lerobot_metaworld_config()["DIFFICULTY_TO_TASKS"]
    return {
        "mt10": tuple(MT10_V3.keys()),
        "mt50": all_tasks(),
        **{name: tuple(tasks) for name, tasks in groups.items()},
    }


def check_tasks(tasks: list[str]) -> None:
    """Raise a ValueError naming every unknown task and the valid ones."""
    valid = set(all_tasks())
    unknown = [t for t in tasks if t not in valid]
    if unknown:
        raise ValueError(
            f"unknown MetaWorld task(s) {unknown}. Valid tasks: {', '.join(all_tasks())}. "
            f"Or pass a suite: {', '.join(suites())}."
        )


def resolve_tasks(tasks: str | list[str] | None = None, suite: str | None = None) -> list[str]:
    """Turn `--tasks a,b` or `--suite NAME` into a list of task names (exactly one must be given)."""
    if isinstance(tasks, str):
        tasks = [t.strip() for t in tasks.split(",") if t.strip()]
    if bool(tasks) == bool(suite):
        raise ValueError("give exactly one of --tasks (comma-separated task names) or --suite (e.g. mt10)")
    if suite:
        if suite not in suites():
            raise ValueError(f"unknown suite {suite!r}. Valid suites: {', '.join(suites())}")
        return list(suites()[suite])
    if len(set(tasks)) != len(tasks):
        raise ValueError(f"duplicate task names in {tasks}")
    check_tasks(tasks)
    return list(tasks)
