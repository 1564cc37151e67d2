"""What does a policy read? Its first-step loss with one input swapped at a time.

    python experiments/input_use.py --checkpoint outputs/train/mt10 --dataset outputs/mt10 \
        [--episodes-per-task 5] [--offsets 0,30] [--tasks reach-v3,...] [--out outputs/bench/input_use.json]

For the first `--episodes-per-task` episodes of each task of a LeRobot dataset, takes the frame at
each offset from the episode start and measures the cross-entropy of the expert's action chunk with
the whole chunk hidden (`DiffusionVLA.first_step_nll`: what the first denoising step knows). Then
again with one input replaced:

- images of another episode of the same task (same offset): another goal and object placement;
- black images;
- the robot state of another episode of the same task (same offset);
- the robot state hidden behind the learned "no state" token (checkpoints trained with state_dropout);
- the instruction of another task.

An input the policy reads raises the loss when swapped; one it ignores leaves it where it was. On
MetaWorld, images of another episode should hurt: only the cameras tell where this episode's goal
is. Also prints how much the image tokens differ across samples (spread / scale of the vision
encoder's output tokens): near 0, the encoder gives every image about the same tokens.
Prints a markdown table and saves JSON. Needs a checkpoint with the discrete action head.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch
from torch.utils.data import default_collate

from dvla.data import LeRobotChunks, LeRobotDataConfig
from dvla.policy import DiffusionVLAPolicy
from dvla.processor import encode_text
from dvla.types import ActionBatch


def episode_frames(chunks: LeRobotChunks, per_task: int, offset: int, tasks: list[str] | None) -> list[int]:
    """Dataset indices of frame `offset` of the first `per_task` episodes of each task."""
    episodes = chunks.dataset.meta.episodes
    taken: dict[str, int] = {}
    indices = []
    for e in range(len(episodes)):
        row = episodes[e]
        task = row["tasks"][0]
        if (tasks and task not in tasks) or taken.get(task, 0) >= per_task or row["length"] <= offset:
            continue
        taken[task] = taken.get(task, 0) + 1
        indices.append(int(row["dataset_from_index"]) + offset)
    if not indices:
        raise SystemExit(f"no episode of the selected tasks is longer than offset {offset}")
    return indices


def partner_of(tasks: list[str]) -> torch.Tensor:
    """(B,) for each sample, another sample of the same task (the next one, cyclically)."""
    partner = list(range(len(tasks)))
    for task in dict.fromkeys(tasks):
        members = [i for i, t in enumerate(tasks) if t == task]
        for i, j in zip(members, members[1:] + members[:1], strict=True):
            partner[i] = j
    return torch.tensor(partner)


def swapped(batch: ActionBatch, **fields) -> ActionBatch:
    """The batch with some observation fields replaced (images, text_ids, text_valid, state)."""
    return replace(batch, observation=replace(batch.observation, **fields))


def first_step_nll(model, batch: ActionBatch, draws: dict | None = None) -> torch.Tensor:
    """(B,) cross-entropy of the true bins with the whole chunk hidden (the discrete head's first step)."""
    obs = batch.observation

    def hidden(embeds):  # the backbone pass of [prefix | target], target part
        return model.full_pass(obs, embeds, train=False, draws=draws)[0][:, -embeds.shape[1] :]

    return model.head.first_step_nll(hidden, batch.actions, batch.actions_is_pad)


@torch.no_grad()
def measure(policy: DiffusionVLAPolicy, samples: list[dict], precision: torch.dtype) -> dict:
    model = policy.model.eval()
    batch = policy.processor.action_batch(default_collate(samples))
    obs, tasks = batch.observation, [s["task"] for s in samples]
    partner = partner_of(tasks)
    if (partner == torch.arange(len(tasks))).any():
        raise SystemExit("every task needs at least 2 episodes here: raise --episodes-per-task")
    task_names = list(dict.fromkeys(tasks))
    if len(task_names) < 2:
        raise SystemExit("the instruction swap needs at least 2 tasks")
    other_task = [task_names[(task_names.index(t) + 1) % len(task_names)] for t in tasks]
    other_ids, other_valid = encode_text(policy.tokenizer, other_task, model.config.max_text_tokens)
    conditions = {
        "own inputs": batch,
        "images of another episode": swapped(batch, images={c: x[partner] for c, x in obs.images.items()}),
        "black images": swapped(batch, images={c: torch.zeros_like(x) for c, x in obs.images.items()}),
        "state of another episode": swapped(batch, state=obs.state[partner]),
        "instruction of another task": swapped(
            batch, text_ids=other_ids.to(obs.text_ids.device), text_valid=other_valid.to(obs.text_ids.device)
        ),
    }
    device = obs.state.device
    results = {}
    with torch.autocast(device.type, dtype=precision, enabled=precision != torch.float32):
        for name, data in conditions.items():
            results[name] = float(first_step_nll(model, data).mean())
        if "state_dropout" in model.adapters:
            hide = torch.ones(len(samples), dtype=torch.bool, device=device)
            draws = {"state_dropout": hide}
            results["state hidden (learned token)"] = float(first_step_nll(model, batch, draws).mean())
        tokens = model.vision(obs.images).float()  # (B, N, d)
    spread = (tokens - tokens.mean(0)).pow(2).sum(-1).mean().sqrt()  # across samples
    scale = tokens.pow(2).sum(-1).mean().sqrt()
    return {"first_step_ce": results, "image_token_spread_over_scale": float(spread / scale)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", required=True, help="a dvla checkpoint or run folder")
    parser.add_argument("--dataset", required=True, help="a local LeRobot dataset (e.g. outputs/mt10)")
    parser.add_argument("--episodes-per-task", type=int, default=5)
    parser.add_argument("--offsets", default="0,30", help="frames from the episode start, comma list")
    parser.add_argument("--tasks", default=None, help="comma list (default: every task of the dataset)")
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--out", default="outputs/bench/input_use.json")
    args = parser.parse_args()
    if args.episodes_per_task < 2:
        parser.error("--episodes-per-task must be >= 2 (swaps pair episodes of one task)")
    policy = DiffusionVLAPolicy.from_pretrained(args.checkpoint)
    config = policy.model.config
    chunks = LeRobotChunks(
        LeRobotDataConfig(
            root=args.dataset, chunk_size=config.chunk_size, image_size=config.vision.image_size
        )
    )
    tasks = args.tasks.split(",") if args.tasks else None
    precision = torch.bfloat16 if args.precision == "bf16" else torch.float32
    torch.manual_seed(0)
    report = {"checkpoint": args.checkpoint, "dataset": args.dataset, "per_offset": {}}
    for offset in (int(x) for x in args.offsets.split(",")):
        indices = episode_frames(chunks, args.episodes_per_task, offset, tasks)
        result = measure(policy, [chunks[i] for i in indices], precision)
        report["per_offset"][offset] = {"frames": len(indices), **result}
    offsets = list(report["per_offset"])
    print(f"{args.checkpoint} on {args.dataset}: first-step cross-entropy of the expert chunk\n")
    print("| input | " + " | ".join(f"frame {o}" for o in offsets) + " |")
    print("| --- |" + " ---: |" * len(offsets))
    names = report["per_offset"][offsets[0]]["first_step_ce"]
    for name in names:
        cells = []
        for o in offsets:
            ce = report["per_offset"][o]["first_step_ce"]
            delta = ce[name] - ce["own inputs"]
            cells.append(f"{ce[name]:.3f}" + ("" if name == "own inputs" else f" ({delta:+.3f})"))
        print(f"| {name} | " + " | ".join(cells) + " |")
    spreads = [report["per_offset"][o]["image_token_spread_over_scale"] for o in offsets]
    print(f"\nimage tokens, spread across samples / scale: {', '.join(f'{s:.3f}' for s in spreads)}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
