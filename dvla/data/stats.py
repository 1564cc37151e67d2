"""Normalisation statistics of a dataset's low-dimensional features (state, action, simulator state)."""

from __future__ import annotations

import numpy as np

from dvla.processor import ACTION_KEY, SIM_STATE_KEY, SIM_STATE_MIN_SPAN, STATE_KEY

STAT_QUANTILES = {"q01": 0.01, "q99": 0.99}


def low_dim_values(dataset, key: str) -> np.ndarray:
    """A low-dimensional feature of every selected frame: (N, D) float64."""
    column = dataset.hf_dataset.select_columns([key]).with_format("numpy")[:][key]
    return np.asarray(column, dtype=np.float64).reshape(len(column), -1)


def stats_of(values: np.ndarray) -> dict[str, np.ndarray]:
    """Exact mean/std/min/max/q01/q99 over the frames of (N, D) values."""
    return {
        "mean": values.mean(0),
        "std": values.std(0),
        "min": values.min(0),
        "max": values.max(0),
        **{name: np.quantile(values, q, axis=0) for name, q in STAT_QUANTILES.items()},
    }


def low_dim_stats(
    dataset, state_key: str, action_key: str, sim_state_key: str | None = None
) -> dict[str, dict[str, np.ndarray]]:
    """Stats of the state and action (and the simulator state, when given) under dvla's names
    (STATE_KEY, ACTION_KEY, SIM_STATE_KEY), whatever the dataset calls them.

    Recomputed from the data rather than read from meta/stats.json: lerobot's stats of a dataset
    merged from parts (as `dvla collect` writes) carry averaged, not exact, quantiles.
    """
    stats = {
        STATE_KEY: stats_of(low_dim_values(dataset, state_key)),
        ACTION_KEY: stats_of(low_dim_values(dataset, action_key)),
    }
    if sim_state_key:
        stats[SIM_STATE_KEY] = sim_state_stats(low_dim_values(dataset, sim_state_key))
    return stats


def sim_state_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """stats_of (N, E) simulator states, with q99 raised to at least q01 + SIM_STATE_MIN_SPAN: the
    checkpoint keeps the widened range, so the target is normalised the same way wherever it is read."""
    stats = stats_of(values)
    stats["q99"] = np.maximum(stats["q99"], stats["q01"] + SIM_STATE_MIN_SPAN)
    return stats
