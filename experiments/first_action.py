"""Does the first action depend on where the goal is? The policy against the expert at reset.

    python experiments/first_action.py --checkpoint RUN [--task reach-v3] [--seeds 1000-1019] \
        [--out outputs/bench/first_action_<run>_<task>.json]

At the first frame of an episode the robot state is the same for every seed (the arm starts at
one place), so only the cameras can tell the policy where this seed's goal and objects are. For
each evaluation seed this resets the task, decodes one chunk (the checkpoint's default decoding)
and compares its first action with the scripted expert's in the same state. A policy that reads
the goal moves its first action with the expert's from seed to seed (spread and correlation per
axis); one that does not gives every seed the same action, the average over goals. The blind
baseline is that average: the expert's mean first action for every seed. Prints a table, saves JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from probe_sim_state import checkpoint_task_seeds_parser, default_out, parse_seeds

from dvla.policy import DiffusionVLAPolicy
from dvla.sim.experts import ScriptedExpert
from dvla.sim.metaworld_env import MetaWorldEnv, MetaWorldEnvConfig
from dvla.sim.tasks import check_tasks

AXES = ("x", "y", "z")


def first_actions(checkpoint: str, task: str, seeds: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(seeds, 4) first actions of the policy and of the expert at each seed's reset."""
    check_tasks([task])
    policy = DiffusionVLAPolicy.from_pretrained(checkpoint)
    image_size = policy.model.config.vision.image_size
    env = MetaWorldEnv(MetaWorldEnvConfig(task=task, cameras=policy.action_cameras, image_size=image_size))
    expert = ScriptedExpert(task)
    ours, theirs = [], []
    try:
        for seed in seeds:
            obs, _ = env.reset(seed=seed)
            images = {c: torch.from_numpy(image)[None] for c, image in obs["images"].items()}  # (1, H, W, 3)
            state = torch.from_numpy(obs["state"])[None]  # (1, S)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                chunk = policy.predict_action_chunk(images, [obs["task"]], state)  # (1, H, D)
            ours.append(chunk[0, 0].float().numpy())
            theirs.append(expert(env.raw_obs))
    finally:
        env.close()
    return np.stack(ours), np.stack(theirs)


def compare(ours: np.ndarray, theirs: np.ndarray) -> dict:
    """Per hand axis: spread across seeds, correlation with the expert, error against the blind mean."""
    result = {}
    for i, axis in enumerate(AXES):
        a, e = ours[:, i], theirs[:, i]
        both_vary = a.std() > 1e-6 and e.std() > 1e-6
        result[axis] = {
            "policy_spread": float(a.std()),
            "expert_spread": float(e.std()),
            "correlation": float(np.corrcoef(a, e)[0, 1]) if both_vary else 0.0,
            "policy_error": float(np.abs(a - e).mean()),
            "blind_error": float(np.abs(e.mean() - e).mean()),
        }
    return result


def main() -> None:
    parser = checkpoint_task_seeds_parser(__doc__)
    parser.add_argument(
        "--out", default=None, help="JSON output (default outputs/bench/first_action_<run>_<task>.json)"
    )
    args = parser.parse_args()
    seeds = parse_seeds(args.seeds)
    if len(seeds) < 2:
        parser.error("--seeds needs at least 2 seeds to compare across")
    ours, theirs = first_actions(args.checkpoint, args.task, seeds)
    result = compare(ours, theirs)
    print(f"{args.task}, first action at the reset of seeds {args.seeds}, {args.checkpoint}\n")
    print("| axis | policy spread | expert spread | correlation | policy error | blind error |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for axis, row in result.items():
        print(
            f"| {axis} | {row['policy_spread']:.3f} | {row['expert_spread']:.3f} | {row['correlation']:+.2f} "
            f"| {row['policy_error']:.3f} | {row['blind_error']:.3f} |"
        )
    out = Path(args.out) if args.out else default_out("first_action", args.checkpoint, args.task)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "checkpoint": args.checkpoint,
        "task": args.task,
        "seeds": seeds,
        "per_axis": result,
        "policy": ours.round(4).tolist(),
        "expert": theirs.round(4).tolist(),
    }
    out.write_text(json.dumps(report, indent=2))
    print(f"\nsaved {out}")


if __name__ == "__main__":
    main()
