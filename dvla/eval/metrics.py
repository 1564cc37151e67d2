"""Success-rate statistics shared by rollouts and benchmarks, and the smoothness of executed actions."""

from __future__ import annotations

import math

import numpy as np


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% for z=1.96); (0, 1) without trials."""
    if trials == 0:
        return 0.0, 1.0
    if not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, got {successes}/{trials}")
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_exact(first_only: int, second_only: int) -> float:
    """Two-sided exact McNemar p-value from the two discordant counts (a sign test at 1/2)."""
    if first_only < 0 or second_only < 0:
        raise ValueError(f"discordant counts must be >= 0, got {first_only} and {second_only}")
    n, k = first_only + second_only, min(first_only, second_only)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def episode_outcomes(report: dict) -> dict[tuple[str, int], bool]:
    """(task, seed) -> success for every episode of a `dvla rollout` report."""
    outcomes = {}
    for task, result in report["per_task"].items():
        solved = set(result["successful_seeds"])
        outcomes.update({(task, seed): seed in solved for seed in result["seeds"]})
    return outcomes


def paired_comparison(first: dict, second: dict) -> dict:
    """Two policies on the episodes (task, seed) both ran: who alone solved how many, and McNemar's p."""
    shared = first.keys() & second.keys()
    first_only = sum(first[e] and not second[e] for e in shared)
    second_only = sum(second[e] and not first[e] for e in shared)
    return {
        "episodes": len(shared),
        "first_only": first_only,
        "second_only": second_only,
        "p_value": mcnemar_exact(first_only, second_only),
    }


def switch_jerk(actions, sources) -> dict:
    """Sums of |second difference| of executed actions (T, D), averaged over dimensions, split by
    whether its three steps come from one chunk (`within`) or span a switch to the next (`switch`);
    `sources` (T,) names each action's chunk. Returns {within, within_n, switch, switch_n}."""
    actions, sources = np.asarray(actions, dtype=np.float64), np.asarray(sources)
    out = {"within": 0.0, "within_n": 0, "switch": 0.0, "switch_n": 0}
    if len(actions) < 3:
        return out
    second = np.abs(actions[2:] - 2 * actions[1:-1] + actions[:-2]).mean(-1)  # (T-2,)
    same = (sources[2:] == sources[1:-1]) & (sources[1:-1] == sources[:-2])  # (T-2,)
    out["within"], out["within_n"] = float(second[same].sum()), int(same.sum())
    out["switch"], out["switch_n"] = float(second[~same].sum()), int((~same).sum())
    return out


def jerk_ratio(episodes: list[dict]) -> dict | None:
    """Mean jerk across chunk switches over mean jerk within chunks, pooled over episodes that
    recorded `jerk` (switch_jerk's sums); None when either is missing."""
    parts = [e["jerk"] for e in episodes if e.get("jerk")]
    within_n, switch_n = sum(p["within_n"] for p in parts), sum(p["switch_n"] for p in parts)
    if not within_n or not switch_n:
        return None
    within = sum(p["within"] for p in parts) / within_n
    switch = sum(p["switch"] for p in parts) / switch_n
    return {"within": within, "switch": switch, "ratio": switch / within if within else None}
