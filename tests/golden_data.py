"""Synthetic data of the golden run (tests/test_golden.py): fixed batches in raw units, stats,
the tokenizer, and weights regenerated from a seed. Independent of dvla's model code."""

from __future__ import annotations

import numpy as np
import torch

TASKS = ["reach the goal", "push the puck to the goal", "open the drawer"]
QUESTIONS = [
    "what color is the cube?",
    "how many objects are there?",
    "is the red cube left of the blue sphere?",
    "is there a green sphere?",
]
ANSWERS = ["red", "two", "yes", "no"]
SIM_DIM = 12  # positions at 3:6 (an object) and 9:12 (a goal)


def stats(seed: int) -> dict:
    rng = np.random.default_rng(seed)

    def feature(dim, low, high):
        q01 = low + rng.uniform(0, 0.05, dim)
        q99 = high - rng.uniform(0, 0.05, dim)
        return {"q01": q01, "q99": q99, "mean": (q01 + q99) / 2, "std": (q99 - q01) / 4,
                "min": q01 - 0.1, "max": q99 + 0.1}  # fmt: skip

    return {
        "observation.state": feature(4, -0.5, 0.5),
        "action": feature(4, -1.0, 1.0),
        "sim.state": feature(SIM_DIM, -0.4, 0.6),
    }


def robot_sample(g: torch.Generator, batch: int, with_perception: bool) -> dict:
    """A collated LeRobotChunks batch (raw units), as the data loader gives it."""
    sample = {
        "images": {"corner2": torch.rand(batch, 3, 32, 32, generator=g)},
        "state": torch.rand(batch, 4, generator=g) - 0.5,
        "task": [TASKS[int(i)] for i in torch.randint(0, len(TASKS), (batch,), generator=g)],
        "actions": torch.rand(batch, 4, 4, generator=g) * 2 - 1,
        "actions_is_pad": torch.zeros(batch, 4, dtype=torch.bool),
        "sim_state": torch.rand(batch, SIM_DIM, generator=g) - 0.4,
    }
    sample["actions_is_pad"][-1, 2:] = True
    if with_perception:
        sample["perception"] = {
            "images": {"corner2": torch.rand(2, 3, 32, 32, generator=g)},
            "sim_state": torch.rand(2, SIM_DIM, generator=g) - 0.4,
        }
    return sample


def vqa_sample(g: torch.Generator, batch: int, scene_map: bool, referents: bool) -> dict:
    picks = torch.randint(0, len(QUESTIONS), (batch,), generator=g)
    sample = {
        "images": {"scene": torch.rand(batch, 3, 32, 32, generator=g)},
        "question": [QUESTIONS[int(i)] for i in picks],
        "answer": [ANSWERS[int(i)] for i in picks],
    }
    if scene_map:  # (B, 4 cells, 37 channels + 72 positions), NaN where no object is
        present = (torch.rand(batch, 4, 37, generator=g) < 0.2).float()
        positions = torch.rand(batch, 4, 72, generator=g) * 2
        positions[torch.rand(batch, 4, 72, generator=g) < 0.8] = float("nan")
        sample["scene_map"] = torch.cat([present, positions], dim=2)
    if referents:  # (B, 2, 4): cell, then column, row, depth; -1 / NaN for questions without a pair
        refs = torch.full((batch, 2, 4), float("nan"))
        refs[:, :, 0] = -1
        for row, i in enumerate(picks.tolist()):
            if i == 2:
                refs[row, :, 0] = torch.randint(0, 4, (2,), generator=g).float()
                refs[row, :, 1:] = torch.rand(2, 3, generator=g) * 2
        sample["referents"] = refs
    return sample


def tokenizer():
    from dvla.backbone.tokenizer import train_text_tokenizer

    return train_text_tokenizer([*TASKS, *QUESTIONS, *ANSWERS], vocab_size=200)


def seeded_state_dict(manifest: dict, seed: int) -> dict[str, torch.Tensor]:
    """Weights regenerated from a seed in manifest order (the test does the same)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (shape, dtype) in manifest.items():
        if dtype == "torch.int64":
            out[name] = torch.zeros(shape, dtype=torch.int64)
        elif name.endswith("running_var"):
            out[name] = torch.rand(shape, generator=g) + 0.5
        else:
            out[name] = torch.randn(shape, generator=g) * 0.2
    return out


def plain_stats(stats: dict) -> dict:
    return {k: {s: np.asarray(v).tolist() for s, v in f.items()} for k, f in stats.items()}
