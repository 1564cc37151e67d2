"""Non-finite values in a dataset's numeric features, found once when it is opened.

A NaN in the robot state or the actions trains to NaN weights without an error; found here, it is
named (key, episode, frame) before the first step, or its episodes are dropped on request
(`dataset.drop_nonfinite_episodes`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class NonFinite:
    """The frames of one feature that hold NaN or inf."""

    key: str
    episodes: np.ndarray  # (F,) episode index of each bad frame
    frames: np.ndarray  # (F,) frame index within its episode

    def describe(self, most: int = 3) -> str:
        shown = ", ".join(
            f"episode {e} frame {f}" for e, f in zip(self.episodes[:most], self.frames[:most], strict=True)
        )
        more = f" and {len(self.frames) - most} more" if len(self.frames) > most else ""
        return f"{self.key!r} is NaN or inf at {shown}{more} ({len(set(self.episodes.tolist()))} episode(s))"


def nonfinite_frames(hf_dataset, keys: list[str]) -> list[NonFinite]:
    """The features among `keys` with a non-finite value anywhere (one read of their columns)."""
    table = hf_dataset.select_columns([*keys, "episode_index", "frame_index"]).with_format("numpy")[:]
    found = []
    for key in keys:
        values = np.asarray(table[key], dtype=np.float64).reshape(len(table[key]), -1)  # (N, D)
        bad = ~np.isfinite(values).all(axis=1)  # (N,)
        if bad.any():
            episodes = np.asarray(table["episode_index"])[bad].astype(int)
            found.append(NonFinite(key, episodes, np.asarray(table["frame_index"])[bad].astype(int)))
    return found


def bad_episodes(found: list[NonFinite]) -> set[int]:
    return {int(e) for item in found for e in item.episodes}


def check_stats_finite(stats: dict[str, dict[str, np.ndarray]], where: str) -> None:
    """Statistics computed from finite data are finite; say which one is not, should that fail."""
    for key, feature in stats.items():
        for name, value in feature.items():
            if not np.isfinite(np.asarray(value, dtype=np.float64)).all():
                raise ValueError(f"{where}: the statistic {name} of {key!r} is not finite: {value}")
