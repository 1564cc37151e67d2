"""Does the model see where the goal is? The simulator-state head's reading at the first frame.

    python experiments/probe_sim_state.py --checkpoint outputs/train/mt3_sim --task reach-v3 \
        [--seeds 1000-1019] [--out outputs/bench/probe_<run>_<task>.json]

For a checkpoint trained with `--dataset.sim_state_key sim.state`: resets the task at each seed,
renders the first frame, and compares the head's reading of the goal and the first object with the
simulator's (distance in cm), next to the best blind answer: one constant for every seed, the mean
of the true positions over the probed seeds. A head that does not beat it sees nothing of the
target. At the first frame the arm has not moved, so the hand position gives nothing away: the goal
can only come from the cameras. Prints a markdown table and saves JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from dvla.policy import DiffusionVLAPolicy
from dvla.sim.metaworld_env import MetaWorldEnv, MetaWorldEnvConfig
from dvla.sim.tasks import check_tasks

# Slices of MetaWorld's 39-D observation (see dvla.sim.metaworld_env.SIM_STATE_DIM).
PARTS = {"first object": slice(4, 7), "goal": slice(36, 39)}


def parse_seeds(text: str) -> list[int]:
    """'1000-1019' or '3,5,8' -> seeds."""
    if "-" in text:
        first, last = (int(x) for x in text.split("-"))
        if last < first:
            raise ValueError(f"--seeds {text}: the range ends before it starts")
        return list(range(first, last + 1))
    return [int(x) for x in text.split(",")]


def probe(checkpoint: str, task: str, seeds: list[int], settle: int = 0) -> dict:
    check_tasks([task])
    policy = DiffusionVLAPolicy.from_pretrained(checkpoint)
    if policy.processor.sim_state_norm is None:
        raise SystemExit(f"{checkpoint} was trained without --dataset.sim_state_key: nothing to probe")
    cameras = policy.action_cameras
    env = MetaWorldEnv(
        MetaWorldEnvConfig(task=task, cameras=cameras, image_size=policy.model.config.vision.image_size)
    )
    read, true = [], []
    try:
        for seed in seeds:
            obs, _ = env.reset(seed=seed)
            for _ in range(settle):  # still arm: the hand holds its place under a zero action
                obs, *_ = env.step(np.zeros(4, np.float32))
            images = {c: torch.from_numpy(image)[None] for c, image in obs["images"].items()}  # (1, H, W, 3)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                reading = policy.predict_sim_state(
                    images, [obs["task"]], torch.from_numpy(obs["state"])[None]
                )
            read.append(reading[0].numpy())  # (39,)
            true.append(env.raw_obs.copy())
    finally:
        env.close()
    read, true = np.stack(read), np.stack(true)  # (seeds, 39)
    errors = {part: np.linalg.norm(read[:, d] - true[:, d], axis=1) * 100 for part, d in PARTS.items()}
    blind = {part: np.linalg.norm(true[:, d].mean(0) - true[:, d], axis=1) * 100 for part, d in PARTS.items()}
    return {
        "checkpoint": checkpoint,
        "task": task,
        "seeds": seeds,
        "settle_steps": settle,
        "cm": {
            part: {
                "head_mean": float(errors[part].mean()),
                "head_median": float(np.median(errors[part])),
                "blind_constant": float(blind[part].mean()),
                "per_seed": errors[part].round(2).tolist(),
            }
            for part in PARTS
        },
    }


def checkpoint_task_seeds_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments every per-seed probe of a checkpoint on one task takes."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a dvla checkpoint or run folder")
    parser.add_argument("--task", default="reach-v3")
    parser.add_argument("--seeds", default="1000-1019", help="a range a-b or a comma list")
    return parser


def default_out(kind: str, checkpoint: str, task: str) -> Path:
    """outputs/bench/<kind>_<run>_<task>.json: probes of two runs never overwrite each other."""
    path = Path(checkpoint).resolve()
    run = path.parent.parent.name if path.parent.name == "checkpoints" else path.name
    return Path(f"outputs/bench/{kind}_{run}_{task}.json")


def main() -> None:
    parser = checkpoint_task_seeds_parser(__doc__)
    parser.add_argument(
        "--settle", type=int, default=0, help="zero-action steps before the reading (default 0: first frame)"
    )
    parser.add_argument(
        "--out", default=None, help="JSON output (default outputs/bench/probe_<run>_<task>.json)"
    )
    args = parser.parse_args()
    result = probe(args.checkpoint, args.task, parse_seeds(args.seeds), args.settle)
    print(f"{args.task}, first frame of seeds {args.seeds}, {args.checkpoint}\n")
    print("| part | head: mean error | head: median | blind: one constant for all seeds |")
    print("| --- | ---: | ---: | ---: |")
    for part, row in result["cm"].items():
        print(
            f"| {part} | {row['head_mean']:.1f} cm | {row['head_median']:.1f} cm "
            f"| {row['blind_constant']:.1f} cm |"
        )
    out = Path(args.out) if args.out else default_out("probe", args.checkpoint, args.task)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"\nsaved {out}")


if __name__ == "__main__":
    main()
