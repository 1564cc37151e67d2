"""Chunk execution under an inference delay: receding horizon, naive asynchronous execution,
inpainted continuation and temporal ensembling, with and without action bounds, on the same seeds.

    python benchmarks/bench_closed_loop.py --checkpoint outputs/train/aloha_transfer_cube \\
        --tasks transfer_cube --episodes 50 [--delays 4,8] [--out outputs/bench/closed_loop]

Every setting is one `dvla rollout` (same harness, seeds and success rule; reused when it already
ran with the same settings, so an interrupted run resumes). Prints and saves a markdown table:
success with its Wilson interval, the paired comparison with the undelayed receding horizon
(exact McNemar), forwards and milliseconds per chunk, chunks per episode, and the jerk of the
executed actions across chunk switches against within chunks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import draccus

from dvla.eval.metrics import episode_outcomes, paired_comparison
from dvla.eval.rollout import rollout
from dvla.eval.rollout_config import RolloutConfig
from dvla.execution import ExecutionConfig


def settings(delays: list[int], bounds: bool) -> list[tuple[str, ExecutionConfig, str | None]]:
    """(name, execution, action bounds) of every setting; the first is the baseline."""
    rows = [("receding, no delay", ExecutionConfig(), None)]
    for d in delays:
        rows.append((f"naive async, d={d}", ExecutionConfig("receding", d), None))
        rows.append((f"inpaint, d={d}", ExecutionConfig("inpaint", d), None))
    if delays:
        d = delays[0]
        rows.append((f"temporal ensemble, d={d}", ExecutionConfig("ensemble", d), None))
    if bounds:
        rows.append(("receding, no delay, bounds env", ExecutionConfig(), "env"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--tasks", required=True)
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--delays", default="4,8", help="comma-separated inference delays (control steps)")
    parser.add_argument("--no_bounds", action="store_true", help="skip the bounded setting")
    parser.add_argument("--max_steps", type=int, default=None)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="outputs/bench/closed_loop")
    args = parser.parse_args()
    delays = [int(d) for d in args.delays.split(",") if d.strip()]
    out = Path(args.out)
    rows, baseline = [], None
    for name, execution, bounds in settings(delays, not args.no_bounds):
        folder = out / name.replace(", ", "_").replace(" ", "_").replace("=", "")
        config = RolloutConfig(checkpoint=args.checkpoint, tasks=args.tasks, episodes=args.episodes,
                               max_steps=args.max_steps, workers=args.workers, execution=execution,
                               action_bounds=bounds, videos_per_task=0, output_dir=str(folder),
                               resume=True)  # fmt: skip
        saved = folder / "report.json"
        report = json.loads(saved.read_text()) if saved.exists() else None
        if report is None or _settings(report["config"]) != _settings(draccus.encode(config)):
            report = rollout(config)  # not run yet, or run with other settings
        outcomes = episode_outcomes(report)
        baseline = baseline or outcomes
        pooled, decode = report["pooled"], report["decode"]
        jerk = report["execution"]["jerk"]
        episodes = pooled["episodes"]
        rows.append({
            "setting": name,
            "success": pooled["successes"] / episodes,
            "successes": pooled["successes"],
            "episodes": episodes,
            "wilson95": pooled["wilson95"],
            "paired_vs_baseline": paired_comparison(outcomes, baseline),
            "forwards_per_chunk": decode["forwards_per_chunk"],
            "ms_per_chunk": decode["ms_per_chunk"],
            "chunks_per_episode": decode["plan_calls"] * decode["mean_batch"] / episodes,
            "jerk": jerk,
        })  # fmt: skip
        print(f"{name}: {rows[-1]['success']:.0%}")
    lines = [
        "| setting | success | 95% CI | vs no delay (only this / only baseline, p) | forwards / chunk | "
        "ms / chunk | chunks / episode | jerk at switches / within |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        p = r["paired_vs_baseline"]
        jerk = r["jerk"]
        ratio = f"{jerk['ratio']:.2f}x" if jerk and jerk["ratio"] is not None else "n/a"
        lines.append(
            f"| {r['setting']} | {r['success']:.0%} ({r['successes']}/{r['episodes']}) | "
            f"{r['wilson95'][0]:.0%}-{r['wilson95'][1]:.0%} | {p['first_only']} / {p['second_only']}, "
            f"p = {p['p_value']:.2g} | {r['forwards_per_chunk']:.1f} | {r['ms_per_chunk']:.1f} | "
            f"{r['chunks_per_episode']:.1f} | {ratio} |"
        )
    table = "\n".join(lines)
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    machine = f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()})"
    results = {"command": " ".join(["python", *sys.argv]), "machine": machine, "rows": rows}
    (out / "closed_loop.json").write_text(json.dumps(results, indent=2))
    (out / "closed_loop.md").write_text(table + "\n")
    print(f"saved {out / 'closed_loop.json'} and closed_loop.md")


def _settings(encoded: dict) -> dict:
    return {key: value for key, value in encoded.items() if key != "resume"}


if __name__ == "__main__":
    main()
