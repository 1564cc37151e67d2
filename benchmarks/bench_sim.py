"""Simulation throughput: rendered frames/s by resolution and shadow setting, and end-to-end
collection frames/s (expert rollout + rendering + LeRobot recording + merge) with 1 and 2 workers.

    python benchmarks/bench_sim.py [--quick] [--out outputs/bench/sim.json]

Prints a markdown table and saves the numbers as JSON. Ratios measured in one run are what to compare;
absolute rates depend on the machine and on what else it is doing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

from dvla.sim.collect import CollectSpec, collect_demos
from dvla.sim.metaworld_env import MetaWorldEnv, MetaWorldEnvConfig


def render_fps(image_size: int, shadow_size: int, frames: int, cameras=("corner2",)) -> float:
    env = MetaWorldEnv(
        MetaWorldEnvConfig(
            task="pick-place-v3", cameras=list(cameras), image_size=image_size, shadow_size=shadow_size
        )
    )
    env.reset(seed=0)
    renderer, data = env._renderer, env._env.data
    for _ in range(20):  # warm up the GL pipeline
        renderer.render(data)
    best = float("inf")
    for _ in range(3):  # best of three: the least disturbed by other work on the machine
        start = time.perf_counter()
        for _ in range(frames):
            renderer.render(data)
        best = min(best, time.perf_counter() - start)
    env.close()
    return frames * len(cameras) / best


def collection_fps(workers: int, episodes: int, tasks: list[str]) -> dict:
    root = Path(tempfile.mkdtemp(prefix="dvla-bench-")) / "ds"
    spec = CollectSpec(
        tasks=tasks,
        episodes=episodes,
        cameras=["corner2"],
        image_size=128,
        use_videos=True,
        shadow_size=0,
        max_episode_steps=500,
    )
    start = time.perf_counter()
    report = collect_demos(root, spec, workers=workers)
    elapsed = time.perf_counter() - start
    shutil.rmtree(root.parent)
    return {
        "workers": workers,
        "frames": report["frames"],
        "seconds": elapsed,
        "frames_per_s": report["frames"] / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer frames and episodes (smoke run)")
    parser.add_argument("--out", default="outputs/bench/sim.json", help="where to save the JSON results")
    args = parser.parse_args()
    frames = 30 if args.quick else 200
    episodes = 2 if args.quick else 10
    tasks = ["reach-v3", "door-open-v3"]

    render = []
    for size, shadow in [(64, 0), (128, 0), (224, 0), (128, 1024), (128, 4096)]:
        fps = render_fps(size, shadow, frames)
        render.append({"image_size": size, "shadow_size": shadow, "frames_per_s": fps})
        print(f"render {size}px shadow={shadow}: {fps:.1f} frames/s", flush=True)
    collect = [collection_fps(w, episodes, tasks) for w in (1, 2)]
    for row in collect:
        print(f"collect workers={row['workers']}: {row['frames_per_s']:.1f} frames/s", flush=True)

    results = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "mujoco_gl": os.environ["MUJOCO_GL"],
        },
        "render": render,
        "collect": {
            "tasks": tasks,
            "episodes_per_task": episodes,
            "image_size": 128,
            "cameras": ["corner2"],
            "runs": collect,
        },
        "command": "python benchmarks/bench_sim.py" + (" --quick" if args.quick else ""),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print("\n| what | setting | frames/s |\n| --- | --- | ---: |")
    for r in render:
        shadows = "off" if r["shadow_size"] == 0 else f"{r['shadow_size']} px shadow map"
        print(f"| render (1 camera) | {r['image_size']} px, {shadows} | {r['frames_per_s']:.1f} |")
    for r in collect:
        setting = f"{r['workers']} worker(s), 128 px, 1 camera: {r['frames']} frames in {r['seconds']:.0f} s"
        print(f"| collect end to end | {setting} | {r['frames_per_s']:.1f} |")
    print(f"\nsaved {out}")


if __name__ == "__main__":
    main()
