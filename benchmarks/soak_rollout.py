"""Soak test of `dvla rollout`: many short episodes in one run, with the memory of the process and
its environment workers sampled throughout, and no worker left behind afterwards.

    python benchmarks/soak_rollout.py --checkpoint outputs/demo/train [--episodes 500] [--max_steps 20]

Prints the resident memory (main process + workers) early and late in the run and its growth, and
saves the samples as JSON. Growth is measured from the end of the first tenth of the episodes
(imports, models and environments are in memory by then) to the last tenth.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path

import psutil

os.environ.setdefault("MUJOCO_GL", "egl")

from dvla.eval.rollout import rollout
from dvla.eval.rollout_config import RolloutConfig


def tree_rss_mb(process: psutil.Process) -> float:
    """Resident memory of a process and all its children, in MB."""
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # a worker may exit meanwhile
            total += child.memory_info().rss
    return total / 2**20


class Sampler(threading.Thread):
    """(seconds since start, MB) every `period` seconds until stopped."""

    def __init__(self, period: float):
        super().__init__(daemon=True)
        self.period, self.samples, self.done = period, [], threading.Event()
        self.process, self.start_time = psutil.Process(), time.perf_counter()

    def run(self) -> None:
        while not self.done.wait(self.period):
            self.samples.append((time.perf_counter() - self.start_time, tree_rss_mb(self.process)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--task", default="drawer-close-v3")
    parser.add_argument("--episodes", type=int, default=500)
    parser.add_argument("--max_steps", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="outputs/bench/soak_rollout.json")
    args = parser.parse_args()
    sampler = Sampler(period=1.0)
    sampler.start()
    with tempfile.TemporaryDirectory() as folder:
        config = RolloutConfig(
            checkpoint=args.checkpoint, tasks=args.task, episodes=args.episodes, max_steps=args.max_steps,
            workers=args.workers, videos_per_task=0, output_dir=folder,
        )  # fmt: skip
        report = rollout(config)
    sampler.done.set()
    sampler.join()
    time.sleep(2)  # workers have been asked to exit; give them a moment
    # Python's own resource tracker (started by multiprocessing) lives until this process exits
    children = [(p.pid, " ".join(p.cmdline())) for p in psutil.Process().children(recursive=True)]
    leftover = [f"{pid}: {cmd[:120]}" for pid, cmd in children if "resource_tracker" not in cmd]
    samples = sampler.samples
    tenth = max(1, len(samples) // 10)
    early = statistics.median(mb for _, mb in samples[tenth : 2 * tenth])
    late = statistics.median(mb for _, mb in samples[-tenth:])
    result = {
        "machine": f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()})",
        "episodes": report["pooled"]["episodes"],
        "success": report["pooled"]["successes"] / report["pooled"]["episodes"],
        "max_steps": args.max_steps,
        "wall_s": samples[-1][0] if samples else None,
        "rss_mb_early": early,
        "rss_mb_late": late,
        "growth": late / early - 1,
        "leftover_processes": leftover,
        "samples": samples,
    }
    print(
        f"{args.episodes} episodes of at most {args.max_steps} steps in {result['wall_s']:.0f} s: "
        f"memory {early:.0f} MB -> {late:.0f} MB ({result['growth']:+.1%}); "
        f"leftover processes: {leftover or 'none'}"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
