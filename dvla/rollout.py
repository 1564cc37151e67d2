"""`dvla rollout`: closed-loop MuJoCo evaluation of a checkpoint with lerobot's MetaWorld protocol.

Episodes run in an `EnvPool` (one environment per worker process); the policy plans for every
episode whose action queue is empty in one batch, executes `n_action_steps` actions of each chunk
and re-plans (receding horizon). Success is `info["success"]` at any step within `max_steps`.
"""

from __future__ import annotations

import contextlib
import json
import time
import warnings
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import draccus
import numpy as np
import torch

from dvla.metrics import wilson_interval
from dvla.rollout_config import RolloutConfig

HOLD_SECONDS = 0.75  # the last frame of a video is held this long


@dataclass
class Episode:
    task: str
    instruction: str
    index: int  # within its task
    seed: int
    steps: int = 0
    success: bool = False
    queue: deque = field(default_factory=deque)
    frames: list | None = None  # captioned video frames, when this episode is filmed


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def check_trained_tasks(instructions: dict[str, str], info: dict, allow_unseen: bool) -> None:
    """Refuse tasks whose instruction the checkpoint was not trained on (unless allowed)."""
    trained = info.get("tasks")
    if not trained:
        warnings.warn("the checkpoint does not record its training tasks; not checking them", stacklevel=2)
        return
    unseen = {task: text for task, text in instructions.items() if text not in trained}
    if unseen and not allow_unseen:
        raise ValueError(
            f"the checkpoint was not trained on {sorted(unseen)} (instructions {sorted(unseen.values())}); "
            f"it knows {trained}. Pick trained tasks or pass --allow_unseen_tasks to try them zero-shot."
        )


def _caption(episode: Episode, done: bool) -> list[str]:
    status = "SUCCESS" if episode.success else ("failed" if done else "")
    return [episode.instruction, f"{episode.task}  seed {episode.seed}  step {episode.steps}  {status}"]


def rollout(config: RolloutConfig) -> dict:
    from tqdm import tqdm

    from dvla.checkpoint import checkpoint_info, resolve_checkpoint
    from dvla.policy import DiffusionVLAPolicy, PolicyConfig
    from dvla.sim.env_pool import EnvPool
    from dvla.sim.metaworld_env import CAMERAS, MetaWorldEnvConfig
    from dvla.sim.tasks import resolve_tasks, task_description
    from dvla.video import compose_frame, write_mp4

    tasks = resolve_tasks(config.tasks, config.suite)
    checkpoint = resolve_checkpoint(config.checkpoint)
    info = checkpoint_info(checkpoint)
    instructions = {task: task_description(task) for task in tasks}
    check_trained_tasks(instructions, info, config.allow_unseen_tasks)
    device = _device(config.device)
    policy = DiffusionVLAPolicy.from_pretrained(
        checkpoint, PolicyConfig(config.n_action_steps, config.decode), device
    )
    model_config = policy.model.config
    cameras = policy.action_cameras  # a co-trained model also knows the VQA scene camera
    if any(c not in CAMERAS for c in cameras):
        raise ValueError(f"the checkpoint's cameras {cameras} are not all MetaWorld cameras {CAMERAS}")
    if model_config.action_dim != 4 or model_config.state_dim != 4:
        raise ValueError(
            f"MetaWorld has 4-D states and actions; the checkpoint has state/action dims "
            f"{model_config.state_dim}/{model_config.action_dim}"
        )
    env_config = MetaWorldEnvConfig(
        task=tasks[0],
        cameras=list(cameras),
        image_size=config.image_size or model_config.vision.image_size,
        max_episode_steps=config.max_steps,
    )
    output = Path(config.output_dir)
    video_dir = Path(config.video_dir) if config.video_dir else output / "videos"
    fps = int(info.get("fps") or 80)
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if config.mixed_precision == "bf16"
        else contextlib.nullcontext()
    )
    jobs = deque(
        (task, i, config.seed_start + i) for task in tasks for i in range(config.episodes)
    )  # task-major, so a worker rebuilds its environment rarely
    finished: dict[str, list[dict]] = {task: [] for task in tasks}
    plan_ms, plan_batches, forwards = [], [], []
    started = time.perf_counter()
    with (
        EnvPool(min(config.workers, len(jobs)), env_config) as pool,
        tqdm(total=len(jobs), desc="rollout", unit="episode") as bar,
    ):
        active: dict[int, Episode] = {}
        observations: dict[int, dict] = {}

        def start(slots) -> None:
            resets = {}
            for slot in slots:
                if not jobs:
                    break
                task, index, seed = jobs.popleft()
                film = index < config.videos_per_task
                active[slot] = Episode(task, instructions[task], index, seed, frames=[] if film else None)
                resets[slot] = (task, seed)
            observations.update(pool.reset(resets))
            for slot in resets:
                if active[slot].frames is not None:
                    active[slot].frames.append(
                        compose_frame(observations[slot]["images"], _caption(active[slot], False))
                    )

        start(range(pool.size))
        while active:
            planning = [slot for slot, ep in active.items() if not ep.queue]
            if planning:
                images = {
                    c: torch.from_numpy(np.stack([observations[s]["images"][c] for s in planning]))
                    for c in cameras
                }
                state = torch.from_numpy(np.stack([observations[s]["state"] for s in planning]))
                texts = [active[s].instruction for s in planning]
                tick = time.perf_counter()
                with autocast:
                    chunk = policy.predict_action_chunk(images, texts, state)  # (B, H, D)
                plan_ms.append((time.perf_counter() - tick) * 1000)
                plan_batches.append(len(planning))
                forwards.append(policy.last_forwards)
                for row, slot in enumerate(planning):
                    active[slot].queue.extend(
                        chunk[row, : policy.config.n_action_steps].float().cpu().numpy()
                    )
            results = pool.step({slot: ep.queue.popleft() for slot, ep in active.items()})
            done = []
            for slot, result in results.items():
                ep = active[slot]
                ep.steps += 1
                ep.success = ep.success or bool(result.info["success"])
                observations[slot] = result.observation
                over = ep.success or result.terminated or result.truncated
                if ep.frames is not None:
                    ep.frames.append(compose_frame(result.observation["images"], _caption(ep, over)))
                if over:
                    done.append(slot)
            for slot in done:
                ep = active.pop(slot)
                video = None
                if ep.frames is not None:
                    ep.frames += [ep.frames[-1]] * int(HOLD_SECONDS * fps)
                    name = f"{ep.task}_ep{ep.index:03d}_{'success' if ep.success else 'failure'}.mp4"
                    video = str(write_mp4(video_dir / name, ep.frames, fps))
                finished[ep.task].append(
                    {"seed": ep.seed, "success": ep.success, "steps": ep.steps, "video": video}
                )
                bar.update(1)
                _write_partial(output, finished, jobs, active)
                total = sum(len(v) for v in finished.values())
                bar.set_postfix(
                    success=f"{sum(e['success'] for v in finished.values() for e in v) / total:.0%}"
                )
            start(done)
    report = _report(
        config, checkpoint, finished, plan_ms, plan_batches, forwards, time.perf_counter() - started
    )
    output.mkdir(parents=True, exist_ok=True)
    (output / "report.json").write_text(json.dumps(report, indent=2))
    (output / "partial.json").unlink(missing_ok=True)
    (output / "report.md").write_text(format_report(report, relative_to=output))
    return report


def _write_partial(output: Path, finished: dict, jobs, active) -> None:
    """Episodes finished so far, rewritten after each one: an interrupted rollout keeps its results."""
    output.mkdir(parents=True, exist_ok=True)
    partial = {"complete": False, "pending_episodes": len(jobs) + len(active) - 1, "episodes": finished}
    tmp = output / ".partial.json.tmp"
    tmp.write_text(json.dumps(partial))
    tmp.rename(output / "partial.json")


def _report(config, checkpoint, finished, plan_ms, plan_batches, forwards, wall_s) -> dict:
    per_task = {}
    for task, episodes in finished.items():
        episodes.sort(key=lambda e: e["seed"])
        wins = sum(e["success"] for e in episodes)
        low, high = wilson_interval(wins, len(episodes))
        lengths = [e["steps"] for e in episodes]
        per_task[task] = {
            "episodes": len(episodes),
            "successes": wins,
            "success_rate": wins / len(episodes),
            "wilson95": [low, high],
            "mean_length": float(np.mean(lengths)),
            "mean_success_length": float(np.mean([e["steps"] for e in episodes if e["success"]]))
            if wins
            else None,
            "seeds": [e["seed"] for e in episodes],
            "successful_seeds": [e["seed"] for e in episodes if e["success"]],
            "videos": [e["video"] for e in episodes if e["video"]],
        }
    wins = sum(t["successes"] for t in per_task.values())
    trials = sum(t["episodes"] for t in per_task.values())
    chunks = sum(plan_batches)
    return {
        "checkpoint": str(checkpoint),
        "average_success": float(np.mean([t["success_rate"] for t in per_task.values()])),
        "pooled": {"successes": wins, "episodes": trials, "wilson95": list(wilson_interval(wins, trials))},
        "decode": {
            "steps": config.decode.steps,
            "autoregressive": config.decode.autoregressive,
            "n_action_steps": config.n_action_steps,
            "forwards_per_chunk": float(np.mean(forwards)) if forwards else None,
            "plan_calls": len(plan_ms),
            "mean_batch": chunks / max(1, len(plan_ms)),
            "ms_per_plan_call": float(np.mean(plan_ms)) if plan_ms else None,
            "ms_per_chunk": float(np.sum(plan_ms) / max(1, chunks)),
        },
        "wall_seconds": wall_s,
        "per_task": per_task,
        "config": draccus.encode(config),
    }


def format_report(report: dict, relative_to: Path | None = None) -> str:
    """A markdown table of per-task success with Wilson intervals and video links."""
    decode = report["decode"]
    lines = [
        f"# Rollout of `{report['checkpoint']}`",
        "",
        f"Average success **{report['average_success']:.1%}** over {len(report['per_task'])} task(s), "
        f"{report['pooled']['episodes']} episodes (pooled 95% CI "
        f"{report['pooled']['wilson95'][0]:.1%}-{report['pooled']['wilson95'][1]:.1%}). "
        f"Decoding: {decode['steps']} step(s){' (autoregressive)' if decode['autoregressive'] else ''}, "
        f"{decode['forwards_per_chunk']:.1f} forwards and {decode['ms_per_chunk']:.1f} ms per chunk "
        f"(batched over {decode['mean_batch']:.1f} episodes on average). "
        f"Wall time {report['wall_seconds']:.0f} s.",
        "",
        "| task | success | 95% CI | episodes | mean length | videos |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for task, t in report["per_task"].items():
        videos = []
        for v in t["videos"]:
            path = Path(v)
            link = path.relative_to(relative_to) if relative_to and path.is_relative_to(relative_to) else path
            videos.append(f"[{path.stem.split('_')[-2]}]({link})")
        lines.append(
            f"| {task} | {t['success_rate']:.0%} | {t['wilson95'][0]:.0%}-{t['wilson95'][1]:.0%} | "
            f"{t['episodes']} | {t['mean_length']:.0f} | {' '.join(videos)} |"
        )
    return "\n".join(lines) + "\n"


def run(config: RolloutConfig) -> dict:
    report = rollout(config)
    print(format_report(report))
    print(f"report: {Path(config.output_dir) / 'report.json'}")
    return report
