"""Success-rate statistics shared by rollouts and benchmarks."""

from __future__ import annotations

import math


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
