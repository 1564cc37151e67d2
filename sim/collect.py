"""`dvla collect` for a simulated environment: scripted-expert demonstrations as a LeRobot dataset.

Work layout under --root while collecting (removed once the dataset is complete):
    .dvla_collect/state.json       what is being collected (checked on --resume)
    .dvla_collect/failures.jsonl   (task, seed) pairs whose expert episode failed, with the reason
    .dvla_collect/lock             held (flock) by every process of a running collection
    .dvla_collect/parts/part-*/    finished parts (see dvla.sim.recording)
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing as mp
import queue
import shutil
import signal
import time
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from dvla.sim.collect_worker import LOCK_FILE, CollectSpec, worker_main
from dvla.sim.recording import drop_unfinished_parts, finished_parts, merge_parts, write_json_atomic
from dvla.sim.seed_scheduler import SeedScheduler

__all__ = ["CollectSpec", "collect_demos", "prepare_root"]

WORK_DIR = ".dvla_collect"
REPORT_FILE = "dvla_collect_report.json"  # written into <root>/meta/ when the dataset is complete


def prepare_root(root: Path, resume: bool, overwrite: bool) -> bool:
    """Check --root against --resume/--overwrite. Returns True when an earlier run is resumed."""
    if resume and overwrite:
        raise ValueError("--resume and --overwrite exclude each other")
    if root.exists() and not root.is_dir():
        raise FileExistsError(f"--root {root} is a file, not a folder")
    if not root.exists() or not any(root.iterdir()):
        return False
    if overwrite:
        shutil.rmtree(root)
        return False
    if not resume:
        raise FileExistsError(
            f"{root} exists and is not empty. Pass --resume to continue an interrupted collection there, "
            "--overwrite to delete it and start again, or choose another --root."
        )
    return True


# Settings added after the first release, with the value that collections made before them had.
# A finished collection that differs only in KEEPABLE ones is kept as it is (it lacks sim.state).
KEEPABLE = {"sim_state"}
SPEC_DEFAULTS_BEFORE = {
    "sim_state": False,
    "kind": "demos",
    "scene_frames": 6,
    "scene_walk_steps": 8,
    "seed_start": 0,
    "action_noise": 0.0,
    "action_noise_steps": 8,
    "env": "metaworld",
}


def _check_same_spec(saved: dict, spec: CollectSpec, what: str, finished: bool = False) -> bool:
    """Raise unless `spec` matches the saved one. Returns True when a finished collection only lacks
    settings added after it was recorded: it is then kept as it is."""
    older = sorted(k for k in SPEC_DEFAULTS_BEFORE if k not in saved)
    saved = {**SPEC_DEFAULTS_BEFORE, **saved}
    now = json.loads(json.dumps(asdict(spec)))
    diff = {k: (saved.get(k), now.get(k)) for k in {**saved, **now} if saved.get(k) != now.get(k)}
    if not diff:
        return False
    if set(diff) <= set(older) & KEEPABLE:
        if finished:
            return True
        flags = " ".join(f"--{k} {str(saved[k]).lower()}" for k in diff)
        raise ValueError(
            f"the {what} was recorded before {sorted(diff)} existed: add `{flags}` to resume it, "
            "or use --overwrite to record it again with them"
        )
    raise ValueError(
        f"--resume with different settings than the {what} (saved, now): {diff}. "
        "Rerun with the original settings, or use --overwrite or another --root."
    )


def _load_state(work: Path, spec: CollectSpec) -> float:
    """Check a resumed collection matches `spec`; return the seconds already spent on it."""
    state_path = work / "state.json"
    if not state_path.exists():
        raise FileNotFoundError(
            f"{work.parent} is not a dvla collection that can be resumed (no {WORK_DIR}/state.json). "
            "Use --overwrite or another --root."
        )
    state = json.loads(state_path.read_text())
    _check_same_spec(state["spec"], spec, "interrupted run")
    return float(state.get("elapsed_s", 0.0))


def _lock_exclusively(work: Path):
    """Fail clearly if any process of another collection still works in `work`; else hold a lock."""
    lock = (work / LOCK_FILE).open("a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise FileExistsError(
            f"another `dvla collect` (or a worker of an interrupted one) is still writing to {work.parent}; "
            "wait for it to finish, then rerun with --resume."
        ) from None
    fcntl.flock(lock, fcntl.LOCK_SH)  # shared from now on, like the workers' locks
    return lock


def _read_failures(path: Path) -> list[dict]:
    """Failed episodes logged so far: {"task", "seed", "error"} (error is None for an expert failure)."""
    if not path.exists():
        return []
    failures = []
    for line in path.read_text().splitlines():
        try:
            failures.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash: that seed is simply tried again
    return failures


def collect_demos(
    root: Path,
    spec: CollectSpec,
    workers: int = 1,
    resume: bool = False,
    overwrite: bool = False,
    episodes_per_part: int = 10,
) -> dict:
    """Record `spec.episodes` successful expert episodes per task into a LeRobot dataset at `root`.

    Returns the collection report (also saved as <root>/meta/dvla_collect_report.json).
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if spec.episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {spec.episodes}")
    root = Path(root)
    work, parts_dir = root / WORK_DIR, root / WORK_DIR / "parts"
    resumed = prepare_root(root, resume, overwrite)
    shutil.rmtree(root / f"{WORK_DIR}.done", ignore_errors=True)  # left by a clean-up cut short
    report_path = root / "meta" / REPORT_FILE
    if resumed and not work.exists() and report_path.exists():
        report = json.loads(report_path.read_text())
        if _check_same_spec(report["spec"], spec, "finished collection", finished=True):
            print(
                f"note: {root} was recorded before sim.state existed and is kept without it "
                "(--overwrite records it again with sim.state)"
            )
        print(f"{root} is already a complete collection; nothing to do.")
        return report
    elapsed_before = _load_state(work, spec) if resumed else 0.0
    parts_dir.mkdir(parents=True, exist_ok=True)
    lock = _lock_exclusively(work)
    try:
        write_json_atomic(work / "state.json", {"spec": asdict(spec), "elapsed_s": elapsed_before})
        for leftover in root.iterdir():  # outputs of a merge that was cut short
            if leftover.name != WORK_DIR:
                shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
        drop_unfinished_parts(parts_dir)
        recorded = [e for _, episodes in finished_parts(parts_dir) for e in episodes]
        failed = {(f["task"], int(f["seed"])) for f in _read_failures(work / "failures.jsonl")}
        scheduler = SeedScheduler(spec.tasks, spec.episodes, recorded, failed, seed_start=spec.seed_start)
        start = time.perf_counter()

        def save_elapsed():
            elapsed = elapsed_before + time.perf_counter() - start
            write_json_atomic(work / "state.json", {"spec": asdict(spec), "elapsed_s": elapsed})

        previous_sigterm = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        try:
            _run_workers(spec, work, scheduler, workers, episodes_per_part, save_elapsed)
        except KeyboardInterrupt:
            save_elapsed()
            done = sum(len(e) for _, e in finished_parts(parts_dir))
            raise SystemExit(
                f"\ninterrupted: {done} finished episodes are kept in {work}. "
                "Rerun the same command with --resume to continue."
            ) from None
        finally:
            signal.signal(signal.SIGTERM, previous_sigterm)
        parts = finished_parts(parts_dir)
        if not parts:
            raise RuntimeError(
                f"no successful expert episode in {scheduler.max_attempts} attempts per task: is "
                f"--max_episode_steps ({spec.max_episode_steps}) too small? See {work / 'failures.jsonl'}"
            )
        failures = _read_failures(work / "failures.jsonl")
        report = _report(
            spec, scheduler, failures, len(recorded), elapsed_before + time.perf_counter() - start
        )
        _merge_into_root(root, work, [p for p, _ in parts])
        write_json_atomic(report_path, report)
    finally:
        lock.close()
    work.rename(root / f"{WORK_DIR}.done")  # one atomic step: the collection is complete
    shutil.rmtree(root / f"{WORK_DIR}.done")
    return report


def _merge_into_root(root: Path, work: Path, parts: list[Path]) -> None:
    merged = work / "merged"
    shutil.rmtree(merged, ignore_errors=True)
    print(f"merging {len(parts)} parts into {root} ...")
    merge_parts(parts, merged)
    for child in merged.iterdir():
        shutil.move(str(child), root / child.name)


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


def _run_workers(
    spec: CollectSpec, work: Path, scheduler: SeedScheduler, workers: int, per_part: int, on_episode
):
    """Run the episodes in worker processes; `on_episode()` after each (records the elapsed time, so
    a resume after a hard kill still counts the time spent before it)."""
    ctx = mp.get_context("spawn")  # a fresh process per worker: each owns its GL context
    jobs, results, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = []
    total = spec.episodes * len(spec.tasks)
    desc, unit = ("collect", "ep") if spec.kind == "demos" else ("scenes", "scene")
    bar = tqdm(total=total, initial=sum(scheduler.successes.values()), desc=desc, unit=unit)
    try:
        for _ in range(workers):
            procs.append(ctx.Process(target=worker_main, args=(spec, work, per_part, jobs, results, stop)))
            procs[-1].start()
        with (work / "failures.jsonl").open("a") as failures:
            while True:
                while scheduler.total_in_flight < 2 * workers and (job := scheduler.next_job()):
                    jobs.put(job)
                if scheduler.total_in_flight == 0:
                    break
                try:
                    message = results.get(timeout=5)
                except queue.Empty:
                    if not all(p.is_alive() for p in procs):
                        raise RuntimeError("a collection worker died; rerun with --resume") from None
                    continue
                if message[0] == "fatal":
                    raise RuntimeError(f"collection worker failed: {message[1]}; rerun with --resume")
                if message[0] != "episode":
                    continue
                _, task, seed, success, length, error = message
                scheduler.done(task, seed, success, length)
                on_episode()
                if success:
                    bar.update(1)
                else:
                    failures.write(json.dumps({"task": task, "seed": seed, "error": error}) + "\n")
                    failures.flush()
                tried = sum(scheduler.successes.values()) + sum(scheduler.failures.values())
                if spec.kind == "demos":
                    rate = sum(scheduler.successes.values()) / tried
                    bar.set_postfix(task=task, expert_success=f"{rate:.0%}")
        for _ in procs:
            jobs.put(None)
    except BaseException:
        stop.set()  # workers finish their episode, commit what they hold and exit
        raise
    finally:
        bar.close()
        deadline = time.monotonic() + 300
        for p in procs:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join()
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"collection worker exit codes {[p.exitcode for p in procs]}; rerun with --resume")


def _report(spec, scheduler: SeedScheduler, failures: list[dict], at_start: int, elapsed_s: float) -> dict:
    per_task = {}
    for task in spec.tasks:
        ok, failed = scheduler.successes[task], scheduler.failures[task]
        lengths = scheduler.lengths[task]
        per_task[task] = {
            "episodes": ok,
            "expert_attempts": ok + failed,
            # scenes have no expert, so no success rate
            "expert_success_rate": ok / (ok + failed) if ok + failed and spec.kind == "demos" else None,
            "frames": sum(lengths),
            "mean_episode_length": sum(lengths) / len(lengths) if lengths else None,
            "seeds": sorted(scheduler.seeds[task]),
            "failures": sorted(
                ({"seed": f["seed"], "error": f.get("error")} for f in failures if f["task"] == task),
                key=lambda f: f["seed"],
            ),
        }
    short = scheduler.short_tasks()
    for task in short:
        print(
            f"warning: {task}: only {scheduler.successes[task]}/{spec.episodes} successful expert episodes "
            f"after {scheduler.max_attempts} attempts (see `failures` in the report)"
        )
    frames = sum(t["frames"] for t in per_task.values())
    return {
        "spec": asdict(spec),
        "per_task": per_task,
        "episodes": sum(t["episodes"] for t in per_task.values()),
        "episodes_at_start": at_start,
        "incomplete_tasks": short,
        "frames": frames,
        "elapsed_s": elapsed_s,
        "frames_per_s": frames / elapsed_s if elapsed_s else None,
    }
