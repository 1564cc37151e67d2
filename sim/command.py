"""`dvla collect`: record scripted demonstrations (MetaWorld or ALOHA, LeRobot datasets) or VQA scenes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

VQA_SUITE = "vqa-scenes"


@dataclass
class CollectConfig:
    """Record scripted-expert demonstrations into a LeRobot dataset, or generate VQA scenes.

    Examples:
      dvla collect --tasks pick-place-v3,door-open-v3 --episodes 20 --root data/two_tasks
      dvla collect --env aloha --tasks transfer_cube --episodes 50 --workers 2 --root data/aloha_cube
      dvla collect --suite mt10 --episodes 50 --workers 2 --root data/mt10
      dvla collect --suite vqa-scenes --scenes 5000 --root data/vqa_scenes
      dvla collect --suite mt10 --kind scenes --episodes 600 --seed_start 100 --root data/mt10_scenes
    """

    # The simulator: metaworld (Sawyer arm, 50 tasks) or aloha (bimanual, transfer_cube and insertion).
    env: str = "metaworld"
    # Comma-separated task names, e.g. pick-place-v3,door-open-v3 or transfer_cube (or use --suite).
    tasks: str | None = None
    # A named suite instead of --tasks: mt10, mt50, easy, medium, hard, very_hard, vqa-scenes;
    # for aloha, all.
    suite: str | None = None
    # Output folder (the LeRobot dataset root, or the VQA dataset folder). Required.
    root: str | None = None
    # Successful expert episodes to record per task (failed ones are not kept); with --kind scenes,
    # scenes per task.
    episodes: int = 50
    # "demos": scripted-expert demonstrations. "scenes": no expert and no demonstrations: each
    # episode is one reset(seed) with the arm wandering at random, `scene_frames` frames of it,
    # recorded for the simulator-state target (`dvla train --perception.root`) so the vision encoder
    # sees many more object and goal placements than the demonstrations have.
    kind: str = "demos"
    scene_frames: int = 6
    # Steps of one random action between two recorded frames of a scene.
    scene_walk_steps: int = 8
    # First seed per task (training seeds are below 1000, where evaluation seeds start). Scenes
    # should start above the demonstrations' seeds, e.g. 100.
    seed_start: int = 0
    # Demonstrations with perturbations (DART): the hand moves by the expert's action plus a random
    # push of up to this size per axis (1 = the largest step), held for --action_noise_steps steps;
    # the recorded action is the expert's. The policy then sees how to get back to the path instead
    # of only the path itself. 0 = the plain expert.
    action_noise: float = 0.0
    action_noise_steps: int = 8
    # Number of VQA scenes for the i.i.d. train/val/test splits (--suite vqa-scenes).
    scenes: int = 1000
    # Image height in pixels; None = the environment's: 128 x 128 for MetaWorld, 480 x 640 for
    # ALOHA (lerobot's; a smaller height keeps its 3:4 aspect ratio).
    image_size: int | None = None
    # Comma-separated cameras; None = the environment's default (corner2 for MetaWorld, top for
    # ALOHA). MetaWorld: corner2 (lerobot's view), topview, behindGripper, gripperPOV, corner, corner3.
    cameras: str | None = None
    # Parallel worker processes (each renders with its own GL context).
    workers: int = 1
    # Continue an interrupted collection in --root (same settings required).
    resume: bool = False
    # Delete a non-empty --root and start again.
    overwrite: bool = False
    # Store camera streams as mp4 videos (lerobot's default) instead of PNG frames.
    videos: bool = True
    # Shadow map size; 0 = no shadows (4x faster rendering on a CPU).
    shadow_size: int = 0
    # Also record MetaWorld's full 39-D observation (object and goal positions) as `sim.state`: no
    # policy input, but a target dvla can learn to predict from the cameras (dvla train
    # --dataset.sim_state_key sim.state). None = on for MetaWorld, off for ALOHA (which has none).
    sim_state: bool | None = None
    # Step limit per expert episode; None = the environment's (MetaWorld 500, ALOHA 400: every
    # ALOHA episode is recorded to its end, like the hub's scripted datasets).
    max_episode_steps: int | None = None
    # Episodes a worker writes before it commits a part (smaller = less lost on a hard kill).
    episodes_per_part: int = 10
    # Seed of the VQA scene generator.
    seed: int = 0

    def __post_init__(self):
        if not self.root:
            raise ValueError("--root is required: the folder to write the dataset to")
        if self.suite != VQA_SUITE and self.episodes < 1:
            raise ValueError(f"--episodes must be >= 1, got {self.episodes}")
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        if self.episodes_per_part < 1:
            raise ValueError(f"--episodes_per_part must be >= 1, got {self.episodes_per_part}")


def run(config: CollectConfig) -> dict:
    root = Path(config.root)
    if config.suite == VQA_SUITE:
        if config.tasks:
            raise ValueError("--tasks does not apply to --suite vqa-scenes")
        from dvla.sim.vqa_dataset import build_vqa_dataset

        report = build_vqa_dataset(
            root,
            scenes=config.scenes,
            image_size=config.image_size or 128,
            seed=config.seed,
            resume=config.resume,
            overwrite=config.overwrite,
        )
    else:
        from dvla.sim.collect import CollectSpec, collect_demos
        from dvla.sim.environments import get_environment

        environment = get_environment(config.env)
        cameras = config.cameras or ",".join(environment.default_cameras)
        spec = CollectSpec(
            tasks=environment.resolve_tasks(config.tasks, config.suite),
            episodes=config.episodes,
            cameras=[c.strip() for c in cameras.split(",") if c.strip()],
            image_size=config.image_size or environment.image_shape(None)[0],
            use_videos=config.videos,
            shadow_size=config.shadow_size,
            max_episode_steps=config.max_episode_steps or environment.default_episode_steps,
            sim_state=config.sim_state if config.sim_state is not None else environment.name == "metaworld",
            kind=config.kind,
            scene_frames=config.scene_frames,
            scene_walk_steps=config.scene_walk_steps,
            seed_start=config.seed_start,
            action_noise=config.action_noise,
            action_noise_steps=config.action_noise_steps,
            env=environment.name,
        )
        check_spec(environment, spec)
        report = collect_demos(
            root,
            spec,
            workers=config.workers,
            resume=config.resume,
            overwrite=config.overwrite,
            episodes_per_part=config.episodes_per_part,
        )
        print(format_collect_report(report))
    print(json.dumps({k: v for k, v in report.items() if k not in ("per_task", "spec")}, indent=2))
    return report


def check_spec(environment, spec) -> None:
    """Refuse settings the environment cannot record, before any work starts."""
    environment.check_camera_names(spec.cameras)
    if not 1 <= spec.max_episode_steps <= environment.max_episode_steps:
        raise ValueError(
            f"--max_episode_steps must be in [1, {environment.max_episode_steps}] for {environment.name}, "
            f"got {spec.max_episode_steps}"
        )
    if spec.image_size < 16:
        raise ValueError(f"--image_size must be >= 16, got {spec.image_size}")
    shape = environment.image_shape(spec.image_size)
    environment.features(spec.cameras, shape, spec.use_videos, spec.sim_state)  # refuses what it cannot
    if environment.name != "metaworld" and (spec.kind != "demos" or spec.action_noise):
        raise ValueError(
            f"{environment.name} collects expert demonstrations only (no --kind scenes or --action_noise)"
        )
    environment.make(spec.tasks[0], spec.cameras, shape, spec.shadow_size, spec.max_episode_steps).close()


def format_collect_report(report: dict) -> str:
    """A markdown table of the expert's success rate and episode lengths per task."""
    lines = [
        "| task | episodes | expert success | mean length |",
        "| --- | ---: | ---: | ---: |",
    ]
    for task, row in report["per_task"].items():
        rate = "n/a" if row["expert_success_rate"] is None else f"{row['expert_success_rate']:.0%}"
        length = "n/a" if row["mean_episode_length"] is None else f"{row['mean_episode_length']:.0f}"
        lines.append(f"| {task} | {row['episodes']} | {rate} ({row['expert_attempts']} tried) | {length} |")
    return "\n".join(lines)
