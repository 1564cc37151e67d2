"""`dvla rollout`: closed-loop MuJoCo evaluation of a checkpoint with lerobot's protocol.

Episodes run in an `EnvPool` (one environment per worker process); the policy plans for every
episode whose action queue is empty in one batch, executes `n_action_steps` actions of each chunk
and re-plans (receding horizon). Success is `info["success"]` at any step within `max_steps`.
"""

from __future__ import annotations

import json
import time
import warnings
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

import draccus
import numpy as np
import torch

from dvla.eval.metrics import jerk_ratio, wilson_interval
from dvla.eval.progress import PARTIAL_FILE, load_partial, restore_timing, rollout_protocol, save_partial
from dvla.eval.rollout_config import RolloutConfig
from dvla.locks import exclusive_output
from dvla.training.precision import autocast as precision_autocast
from dvla.training.precision import resolve_precision

HOLD_SECONDS = 0.75  # the last frame of a video is held this long


@dataclass
class Episode:
    task: str
    instruction: str
    index: int  # within its task
    seed: int
    steps: int = 0
    success: bool = False
    frames: list | None = None  # captioned video frames, when this episode is filmed


def resolve_device(name: str) -> torch.device:
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


def resolve_environment(config: RolloutConfig, info: dict):
    """The environment to evaluate in: --env, else the one whose robot the checkpoint was trained
    on (checkpoints that do not record it were trained on MetaWorld); sets config.env and the
    environment's default step limit."""
    from dvla.sim.environments import get_environment

    config.env = environment_name(config.env, info)
    environment = get_environment(config.env)
    config.max_steps = config.max_steps or environment.default_episode_steps
    if config.max_steps > environment.max_episode_steps:
        raise ValueError(
            f"max_steps must be in [1, {environment.max_episode_steps}] for {environment.name}, "
            f"got {config.max_steps}"
        )
    return environment


def resolve_bounds(config: RolloutConfig, environment) -> tuple[list[float], list[float]] | None:
    """--action_bounds as (low, high) in robot units ("env": the environment's, the same for all
    of its tasks as far as dvla knows them)."""
    from dvla.eval.rollout_config import parse_bounds

    if config.action_bounds is None:
        return None
    if config.action_bounds == "env":
        tasks = environment.resolve_tasks(config.tasks, config.suite)
        return environment.action_bounds(tasks[0])
    low, high = parse_bounds(config.action_bounds)
    if len(low) != environment.action_dim:
        raise ValueError(
            f"action_bounds has {len(low)} values per side; {environment.name} actions have "
            f"{environment.action_dim} dimensions"
        )
    return low, high


def environment_name(env: str | None, info: dict) -> str:
    """`env`, else the environment whose robot a checkpoint (its `info`) was trained on; checkpoints
    that do not record their robot were trained on MetaWorld."""
    from dvla.sim.environments import environment_for_robot

    if env is not None:
        return env
    robot = info.get("robot_type")
    return environment_for_robot(robot) if robot else "metaworld"


def check_fits_environment(environment, state_dim: int, action_dim: int, cameras: list[str]) -> None:
    """Refuse a policy whose dimensions or cameras the environment does not have, naming both."""
    if (state_dim, action_dim) != (environment.state_dim, environment.action_dim):
        raise ValueError(
            f"{environment.name} has {environment.state_dim}-D states and "
            f"{environment.action_dim}-D actions; "
            f"the checkpoint has {state_dim}-D states and {action_dim}-D actions. Evaluate it in the "
            "environment it was trained for (--env)."
        )
    missing = [c for c in cameras if c not in environment.cameras]
    if missing:
        raise ValueError(
            f"the checkpoint reads camera(s) {missing}, which {environment.name} does not have "
            f"({', '.join(environment.cameras)})"
        )


def make_actor(config: RolloutConfig, device: torch.device, precision: str):
    """The policy to evaluate (a dvla checkpoint or a LeRobot policy folder), its path, what it was
    trained on, and the image height to render at (None = the environment's own), on `device` under
    the resolved `precision` ("bf16" or "no")."""
    from dvla.checkpoint import checkpoint_info, resolve_checkpoint
    from dvla.eval.actors import DVLAActor, LeRobotActor, resolve_lerobot_policy
    from dvla.policy import DiffusionVLAPolicy, PolicyConfig

    autocast = precision_autocast(precision, device)
    lerobot_path = resolve_lerobot_policy(config.checkpoint)
    if lerobot_path is not None:
        if config.show_plan:
            raise ValueError("--show_plan draws a dvla policy's chunks; a LeRobot policy keeps its own")
        actor = LeRobotActor(lerobot_path, device, autocast)
        resolve_environment(config, {})
        # rendered at the size it was trained on: a LeRobot policy does not resize its input
        return actor, lerobot_path, {"tasks": actor.trained_tasks}, actor.image_shape[0]
    checkpoint = resolve_checkpoint(config.checkpoint)
    environment = resolve_environment(config, checkpoint_info(checkpoint))
    bounds = resolve_bounds(config, environment)
    decode = replace(config.decode, record_history=config.show_denoising > 0)
    policy_config = PolicyConfig(config.n_action_steps, decode, hooks=config.hooks,
                                 execution=config.execution, action_bounds=bounds)  # fmt: skip
    policy = DiffusionVLAPolicy.from_pretrained(checkpoint, policy_config, device)
    model_config = policy.model.config
    if config.show_denoising and not hasattr(policy.model.head, "tokens"):
        raise ValueError(
            f"--show_denoising draws the tokens of a discrete or factored head; {checkpoint} has the "
            f"{model_config.head.type!r} head"
        )
    dims = (model_config.state_dim, model_config.action_dim)
    check_fits_environment(environment, *dims, policy.action_cameras)
    figures = Path(config.output_dir) / "denoising"
    actor = DVLAActor(policy, autocast, config.show_denoising, figures)
    # dvla resizes what it is given: MetaWorld renders at the policy's size, as its datasets are
    # recorded; other environments at their own size, which the policy downscales as in training
    height = model_config.vision.image_size if environment.name == "metaworld" else None
    return actor, checkpoint, checkpoint_info(checkpoint), height


def rollout(config: RolloutConfig) -> dict:
    """Run the episodes, holding output_dir for this run (one report and one videos/ per folder)."""
    with exclusive_output(config.output_dir, "dvla rollout"):
        return _rollout(config)


def _rollout(config: RolloutConfig) -> dict:
    from dvla.sim.environments import get_environment

    device = resolve_device(config.device)
    precision = resolve_precision(config.mixed_precision, device)  # "auto" -> what the episodes run in
    actor, checkpoint, info, image_size = make_actor(config, device, precision)
    environment = get_environment(config.env)
    tasks = environment.resolve_tasks(config.tasks, config.suite)
    instructions = {task: environment.instruction(task) for task in tasks}
    check_trained_tasks(instructions, info, config.allow_unseen_tasks)
    output = Path(config.output_dir)
    image_size = config.image_size or image_size
    protocol = rollout_protocol(config, checkpoint, image_size, device.type, precision)
    wanted = {(task, config.seed_start + i) for task in tasks for i in range(config.episodes)}
    partial = load_partial(output, protocol, config.resume, wanted)
    earlier_wall = restore_timing(partial, actor.stats) if partial else 0.0
    started = time.perf_counter()

    def save_progress(finished: dict, pending: int) -> None:
        wall = earlier_wall + time.perf_counter() - started
        save_partial(output, protocol, finished, pending, actor.stats, wall)

    finished = run_episodes(
        actor,
        instructions,
        config,
        image_size=image_size,
        fps=int(info.get("fps") or environment.fps),
        kept=partial["episodes"] if partial else None,
        on_episode=save_progress,
    )
    policy = getattr(actor, "type", "dvla")
    wall = earlier_wall + time.perf_counter() - started
    report = _report(config, checkpoint, policy, finished, actor.stats.summary(), wall)
    output.mkdir(parents=True, exist_ok=True)
    (output / "report.json").write_text(json.dumps(report, indent=2))
    (output / PARTIAL_FILE).unlink(missing_ok=True)
    (output / "report.md").write_text(format_report(report, relative_to=output))
    return report


def run_episodes(
    actor,
    instructions: dict[str, str],
    config: RolloutConfig,
    image_size: int | None,
    fps: int,
    kept: dict[str, list[dict]] | None = None,
    on_episode=None,
):
    """Run `config.episodes` episodes of every task with `actor`; {task: [episode results]}.

    Episodes in `kept` (a resumed rollout's, {task: [results]}) are kept and not run again;
    `on_episode(finished, pending)` is called after each episode ends.
    """
    from tqdm import tqdm

    from dvla.eval.video import compose_frame, write_mp4
    from dvla.sim.env_pool import EnvPool, PoolEnvConfig
    from dvla.sim.environments import get_environment

    tasks = list(instructions)
    environment = get_environment(config.env or "metaworld")
    environment.check_camera_names(list(actor.cameras))
    shape = environment.image_shape(image_size)
    env_config = PoolEnvConfig(environment.name, list(actor.cameras), shape, config.max_steps)
    environment.make(tasks[0], env_config.cameras, shape, 0, config.max_steps).close()  # checks it all
    video_dir = Path(config.video_dir) if config.video_dir else Path(config.output_dir) / "videos"
    overlays: dict[str, object] = {}  # task -> PlanOverlay, built when first filmed

    def plans(slot: int, task: str) -> dict | None:
        """{camera: (pixels, next step)} of the slot's latest chunk, for --show_plan."""
        plan = actor.plan_ahead(slot) if config.show_plan else None
        if plan is None:
            return None
        if task not in overlays:
            overlays[task] = environment.plan_overlay(task, list(actor.cameras), shape)
            if not overlays[task].cameras:
                raise ValueError(
                    f"--show_plan draws on fixed cameras; {', '.join(actor.cameras)} move with the robot"
                )
        state, chunk, index = plan
        return {camera: (xy, index) for camera, xy in overlays[task].pixels(state, chunk).items()}

    seeds = [config.seed_start + i for i in range(config.episodes)]
    finished: dict[str, list[dict]] = {task: list((kept or {}).get(task, [])) for task in tasks}
    ran = {(task, e["seed"]) for task, episodes in finished.items() for e in episodes}
    jobs = deque(
        (task, i, seed) for task in tasks for i, seed in enumerate(seeds) if (task, seed) not in ran
    )  # task-major, so a worker rebuilds its environment rarely
    if not jobs:
        return finished
    with (
        EnvPool(min(config.workers, len(jobs)), env_config) as pool,
        tqdm(total=len(jobs) + len(ran), initial=len(ran), desc="rollout", unit="episode") as bar,
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
                first = active[slot].index == 0
                actor.start(slot, f"{active[slot].task}_ep000" if first else None)
                if active[slot].frames is not None:
                    active[slot].frames.append(
                        compose_frame(observations[slot]["images"], _caption(active[slot], False))
                    )

        start(range(pool.size))
        while active:
            texts = {slot: ep.instruction for slot, ep in active.items()}
            actions = actor.act(list(active), observations, texts)
            results = pool.step(actions)
            done = []
            for slot, result in results.items():
                ep = active[slot]
                ep.steps += 1
                ep.success = ep.success or bool(result.info["success"])
                observations[slot] = result.observation
                over = ep.success or result.terminated or result.truncated
                if ep.frames is not None:
                    shown = plans(slot, ep.task)
                    ep.frames.append(compose_frame(result.observation["images"], _caption(ep, over), shown))
                if over:
                    done.append(slot)
            for slot in done:
                ep = active.pop(slot)
                video = None
                if ep.frames is not None:
                    ep.frames += [ep.frames[-1]] * int(HOLD_SECONDS * fps)
                    name = f"{ep.task}_ep{ep.index:03d}_{'success' if ep.success else 'failure'}.mp4"
                    video = str(write_mp4(video_dir / name, ep.frames, fps))
                record = {"seed": ep.seed, "success": ep.success, "steps": ep.steps, "video": video}
                jerk = actor.jerk(slot) if hasattr(actor, "jerk") else None
                if jerk:
                    record["jerk"] = jerk
                finished[ep.task].append(record)
                bar.update(1)
                if on_episode:
                    on_episode(finished, len(jobs) + len(active))
                total = sum(len(v) for v in finished.values())
                bar.set_postfix(
                    success=f"{sum(e['success'] for v in finished.values() for e in v) / total:.0%}"
                )
            start(done)
    return finished


def _report(config, checkpoint, policy: str, finished, timing: dict, wall_s: float) -> dict:
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
    return {
        "checkpoint": str(checkpoint),
        "policy": policy,
        "average_success": float(np.mean([t["success_rate"] for t in per_task.values()])),
        "pooled": {"successes": wins, "episodes": trials, "wilson95": list(wilson_interval(wins, trials))},
        "decode": {
            "steps": config.decode.steps,
            "autoregressive": config.decode.autoregressive,
            "n_action_steps": config.n_action_steps,
            **timing,
        },
        "execution": {
            **draccus.encode(config.execution),
            "action_bounds": config.action_bounds,
            # mean |second difference| of executed actions across chunk switches / within chunks
            "jerk": jerk_ratio([e for episodes in finished.values() for e in episodes]),
        },
        "wall_seconds": wall_s,
        "per_task": per_task,
        "config": draccus.encode(config),
    }


def _execution(execution: dict | None) -> list[str]:
    """The execution mode, delay, bounds and jerk ratio in one line (none for older reports)."""
    if not execution:
        return []
    text = f"Execution: {execution['mode']}, inference delay {execution['inference_delay']} steps"
    if execution.get("action_bounds"):
        text += f", action bounds {execution['action_bounds']}"
    jerk = execution.get("jerk")
    if jerk and jerk["ratio"] is not None:
        text += (
            f"; jerk across chunk switches {jerk['ratio']:.2f}x the jerk within chunks "
            f"({jerk['switch']:.4g} vs {jerk['within']:.4g})"
        )
    return [text + ".", ""]


def format_report(report: dict, relative_to: Path | None = None) -> str:
    """A markdown table of per-task success with Wilson intervals and video links."""
    decode = report["decode"]
    lines = [
        f"# Rollout of `{report['checkpoint']}`",
        "",
        f"Average success **{report['average_success']:.1%}** over {len(report['per_task'])} task(s), "
        f"{report['pooled']['episodes']} episodes (pooled 95% CI "
        f"{report['pooled']['wilson95'][0]:.1%}-{report['pooled']['wilson95'][1]:.1%}). "
        f"{_decoding(report)}, "
        f"{decode['forwards_per_chunk'] or 0:.1f} forwards and {decode['ms_per_chunk']:.1f} ms per chunk "
        f"(batched over {decode['mean_batch']:.1f} episodes on average). "
        f"Wall time {report['wall_seconds']:.0f} s.",
        "",
        *_execution(report.get("execution")),
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


def _decoding(report: dict) -> str:
    decode, policy = report["decode"], report.get("policy", "dvla")
    if policy != "dvla":
        return f"LeRobot {policy} policy"
    return f"Decoding: {decode['steps']} step(s){' (autoregressive)' if decode['autoregressive'] else ''}"


def run(config: RolloutConfig) -> dict:
    report = rollout(config)
    print(format_report(report))
    print(f"report: {Path(config.output_dir) / 'report.json'}")
    return report
