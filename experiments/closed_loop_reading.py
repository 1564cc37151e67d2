"""Where does the hand end up: at the goal, or at where the policy reads the goal? Closed loop.

    python experiments/closed_loop_reading.py --checkpoint RUN [--task reach-v3] [--seeds 1000-1019] \
        [--max-steps 300] [--out outputs/bench/closed_loop_<run>_<task>.json]

For a checkpoint trained with a simulator-state target: runs one episode per seed with the policy
(the checkpoint's default decoding and chunk execution), and at every re-plan also takes the
head's reading of the goal; it counts the steps whose robot state lies outside the training data's
range (where the state is clipped at model.state_clip). At the end of each episode it reports how
far the hand is from the true goal and from the goal as read at the last re-plan, and how far off
the reading was over the episode. A hand that ends at the read goal but away from the true one
fails for want of a sharper reading; a hand far from both fails for another reason (how it acts on
what it reads). Meaningful for reach, where the hand itself must reach the goal; for push and
pick-place, how close the hand came to the puck and how far the puck moved say whether the policy
went for it at all. Prints a table per seed, saves JSON.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from probe_sim_state import checkpoint_task_seeds_parser, default_out, parse_seeds

from dvla.adapters import PolicyHooksConfig
from dvla.adapters.held_reading import HoldReadingConfig
from dvla.policy import DiffusionVLAPolicy, PolicyConfig
from dvla.processor import STATE_KEY, QuantileNormalizer
from dvla.sim.metaworld_env import MetaWorldEnv, MetaWorldEnvConfig
from dvla.sim.tasks import check_tasks

HAND, OBJECT, GOAL = slice(0, 3), slice(4, 7), slice(36, 39)  # in MetaWorld's 39-D observation


def episode(policy: DiffusionVLAPolicy, env: MetaWorldEnv, seed: int, max_steps: int) -> dict:
    """One closed-loop episode: success, where the hand ends, and the goal as read at each re-plan."""
    unclipped = QuantileNormalizer(policy.stats, STATE_KEY, clip=math.inf)  # data's q01..q99 -> [-1, 1]
    obs, _ = env.reset(seed=seed)
    policy.reset()
    object_start = env.raw_obs[OBJECT].copy()
    reads, success, steps, outside, hand_to_object = [], False, 0, [], []
    for steps in range(1, max_steps + 1):
        images = {c: torch.from_numpy(image)[None] for c, image in obs["images"].items()}  # (1, H, W, 3)
        state = torch.from_numpy(obs["state"])[None]  # (1, S)
        outside.append((unclipped.normalize(state.float())[0].abs() > 1).numpy())  # (S,)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if (steps - 1) % policy.n_action_steps == 0:  # a re-plan: read the goal too
                reads.append(policy.predict_sim_state(images, [obs["task"]], state)[0, GOAL].float().numpy())
            action = policy.select_action(images, [obs["task"]], state)[0].float().numpy()
        obs, _, terminated, truncated, info = env.step(action)
        hand_to_object.append(np.linalg.norm(env.raw_obs[HAND] - env.raw_obs[OBJECT]) * 100)
        if info.get("success"):
            success = True
            break
        if terminated or truncated:
            break
    goal, hand = env.raw_obs[GOAL].copy(), env.raw_obs[HAND].copy()
    read_errors = [np.linalg.norm(read - goal) * 100 for read in reads]
    outside = np.stack(outside)  # (steps, S) bool
    first = outside.any(1).nonzero()[0]
    return {
        "seed": seed,
        "success": success,
        "steps": steps,
        "hand_to_goal_cm": float(np.linalg.norm(hand - goal) * 100),
        "hand_to_last_read_cm": float(np.linalg.norm(hand - reads[-1]) * 100),
        # did the hand go for the first object (puck, button, handle), and did the object move
        "hand_to_object_min_cm": float(min(hand_to_object)),
        "object_moved_cm": float(np.linalg.norm(env.raw_obs[OBJECT] - object_start) * 100),
        "read_error_first_cm": float(read_errors[0]),
        "read_error_last_cm": float(read_errors[-1]),
        "read_error_mean_cm": float(np.mean(read_errors)),
        # steps whose robot state lies outside the training data's q01..q99 (where it is clipped
        # at model.state_clip): in any dimension, and per dimension; the first such step (None: never)
        "steps_outside_state_range": int(outside.any(1).sum()),
        "steps_outside_per_dim": outside.sum(0).tolist(),
        "first_step_outside": int(first[0]) + 1 if len(first) else None,
        "hand_end": hand.round(3).tolist(),
        "state_end": np.round(obs["state"], 3).tolist(),  # the robot state the policy saw last
        "goal": goal.round(3).tolist(),
    }


def summarise(label: str, rows: list[dict]) -> None:
    """One line of means over a group of episodes."""
    if not rows:
        return
    mean = {
        k: np.mean([r[k] for r in rows])
        for k in ("hand_to_goal_cm", "hand_to_last_read_cm", "read_error_last_cm")
    }
    print(
        f"{label} ({len(rows)}): hand to goal {mean['hand_to_goal_cm']:.1f} cm, to its last reading "
        f"{mean['hand_to_last_read_cm']:.1f} cm; last reading off by {mean['read_error_last_cm']:.1f} cm"
    )


def main() -> None:
    parser = checkpoint_task_seeds_parser(__doc__)
    parser.add_argument("--max-steps", type=int, default=300, help="steps per episode (MetaWorld: 500)")
    parser.add_argument(
        "--hold-reading", default="", help='held reading slices as JSON, e.g. "[[36, 39]]" (the goal)'
    )
    parser.add_argument("--hold-reading-plans", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    check_tasks([args.task])
    hooks = PolicyHooksConfig()
    if args.hold_reading:
        hooks.hold_reading = HoldReadingConfig(json.loads(args.hold_reading), args.hold_reading_plans)
    config = PolicyConfig(hooks=hooks)
    policy = DiffusionVLAPolicy.from_pretrained(args.checkpoint, config)
    if policy.processor.sim_state_norm is None:
        raise SystemExit(f"{args.checkpoint} was trained without --dataset.sim_state_key: no reading")
    size = policy.model.config.vision.image_size
    env = MetaWorldEnv(MetaWorldEnvConfig(task=args.task, cameras=policy.action_cameras, image_size=size))
    try:
        rows = [episode(policy, env, seed, args.max_steps) for seed in parse_seeds(args.seeds)]
    finally:
        env.close()
    held = (
        f", reading of {args.hold_reading} held after {args.hold_reading_plans} plans"
        if args.hold_reading
        else ""
    )
    print(f"{args.task}, {args.checkpoint}, at most {args.max_steps} steps{held}\n")
    print(
        "| seed | success | hand to goal | hand to last reading | reading error: first / last / mean "
        "| closest to the object | object moved | steps outside the state range (first) "
        "| per state dimension |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['seed']} | {'yes' if r['success'] else 'no'} | {r['hand_to_goal_cm']:.1f} cm "
            f"| {r['hand_to_last_read_cm']:.1f} cm | {r['read_error_first_cm']:.1f} / "
            f"{r['read_error_last_cm']:.1f} / {r['read_error_mean_cm']:.1f} cm "
            f"| {r['hand_to_object_min_cm']:.1f} cm | {r['object_moved_cm']:.1f} cm "
            f"| {r['steps_outside_state_range']} ({r['first_step_outside'] or '-'}) "
            f"| {' / '.join(map(str, r['steps_outside_per_dim']))} |"
        )
    for label, solved in (("solved", True), ("failed", False)):
        summarise(label, [r for r in rows if r["success"] == solved])
    name = "closed_loop_held" if args.hold_reading else "closed_loop"
    out = Path(args.out) if args.out else default_out(name, args.checkpoint, args.task)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "checkpoint": args.checkpoint,
                "task": args.task,
                "hold_reading": args.hold_reading,
                "hold_reading_plans": args.hold_reading_plans,
                "episodes": rows,
            },
            indent=2,
        )
    )
    print(f"\nsaved {out}")


if __name__ == "__main__":
    main()
