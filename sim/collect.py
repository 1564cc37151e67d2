"""`dvla collect`: scripted-expert demonstrations on MetaWorld, recorded as a LeRobot dataset.

Work layout under --root while collecting (removed once the dataset is complete):
    .dvla_collect/state.json       what is being collected (checked on --resume)
    .dvla_collect/failures.jsonl   (task, seed) pairs whose expert episode failed
    .dvla_collect/parts/part-*/    finished parts (see dvla.sim.recording)
"""

from __future__ import annotations

import json
import multiprocessing as mp
import queue
import shutil
import signal
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from dvla.sim.recording import (
    PartWriter,
    finished_parts,
    image_key,
    merge_parts,
    metaworld_features,
    write_json_atomic,
)
from dvla.sim.tasks import TRAIN_SEED_LIMIT

WORK_DIR = ".dvla_collect"
REPORT_FILE = "dvla_collect_report.json"  # written into <root>/meta/ when the dataset is complete


@dataclass
class MetaWorldCollectSpec:
    """What a MetaWorld collection records; a resumed collection must match it exactly."""

    tasks: list[str]
    episodes: int
    cameras: list[str]
    image_size: int
    use_videos: bool
    shadow_size: int
    max_episode_steps: int


def run_expert_episode(env, expert, seed: int) -> tuple[list[dict], bool]:
    """Roll the scripted expert out from `reset(seed)` until the first success or the step limit.

    Returns the frames (observation, the action taken, the reward and success that followed) and
    whether the episode succeeded.
    """
    obs, _ = env.reset(seed=seed)
    frames = []
    for _ in range(env.config.max_episode_steps):
        action = expert(env.raw_obs)
        next_obs, reward, terminated, truncated, info = env.step(action)
        frame = {image_key(c): img for c, img in obs["images"].items()}
        frame["observation.state"] = obs["state"]
        frame["action"] = action
        frame["next.reward"] = np.array([reward], np.float32)
        frame["next.success"] = np.array([info["success"]], bool)
        frame["task"] = obs["task"]
        frames.append(frame)
        if terminated or truncated:
            break
        obs = next_obs
    return frames, bool(frames[-1]["next.success"][0])


def _worker(spec: MetaWorldCollectSpec, parts_dir: Path, episodes_per_part: int, jobs, results, stop):
    """Worker process: runs (task, seed) jobs, writes successful episodes to its own parts."""
    # Ctrl-C reaches the whole process group: the main process alone handles it and sets `stop`, so a
    # worker never dies half-way through writing a part.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import datasets

    datasets.disable_progress_bars()  # lerobot maps every saved episode through `datasets`
    parent = mp.parent_process()
    from dvla.sim.experts import ScriptedExpert
    from dvla.sim.metaworld_env import MetaWorldEnv, MetaWorldEnvConfig

    features = metaworld_features(spec.cameras, spec.image_size, spec.use_videos)
    env, expert, part = None, None, None
    try:
        while not stop.is_set():
            try:
                job = jobs.get(timeout=0.5)
            except queue.Empty:
                if parent is not None and not parent.is_alive():
                    break  # the main process was killed: commit what is finished and leave
                continue
            if job is None:
                break
            task, seed = job
            if env is None or env.task != task:
                if env is not None:
                    env.close()
                env = MetaWorldEnv(
                    MetaWorldEnvConfig(
                        task=task,
                        cameras=spec.cameras,
                        image_size=spec.image_size,
                        shadow_size=spec.shadow_size,
                        max_episode_steps=spec.max_episode_steps,
                    )
                )
                expert = ScriptedExpert(task)
            frames, success = run_expert_episode(env, expert, seed)
            if success:
                if part is None:
                    name = f"part-{time.time_ns()}-{mp.current_process().pid}"
                    part = PartWriter(parts_dir / name, features, env.fps, spec.use_videos)
                part.add_episode(frames, task, seed)
                if len(part.episodes) >= episodes_per_part:
                    part.commit()
                    part = None
            results.put(("episode", task, seed, success, len(frames)))
        if part is not None:
            part.commit()
    except Exception as exc:  # report to the main process, which stops the collection
        results.put(("error", repr(exc)))
        raise
    finally:
        if env is not None:
            env.close()
        results.put(("exit",))


def prepare_root(root: Path, resume: bool, overwrite: bool) -> bool:
    """Check --root against --resume/--overwrite. Returns True when an earlier run is resumed."""
    if resume and overwrite:
        raise ValueError("--resume and --overwrite exclude each other")
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


def _load_state(work: Path, spec: MetaWorldCollectSpec) -> float:
    """Check a resumed collection matches `spec`; return the seconds already spent on it."""
    state_path = work / "state.json"
    if not state_path.exists():
        raise FileNotFoundError(
            f"{work.parent} has no {WORK_DIR}/state.json, so it is not a dvla collection that can be "
            "resumed (a finished one is complete already). Use --overwrite or another --root."
        )
    state = json.loads(state_path.read_text())
    if state["spec"] != json.loads(json.dumps(asdict(spec))):
        diff = {k: (v, asdict(spec)[k]) for k, v in state["spec"].items() if v != asdict(spec).get(k)}
        raise ValueError(
            f"--resume with different settings than the interrupted run (saved, now): {diff}. "
            "Rerun with the original settings, or use --overwrite."
        )
    return float(state.get("elapsed_s", 0.0))


def _read_failures(path: Path) -> set[tuple[str, int]]:
    if not path.exists():
        return set()
    failures = set()
    for line in path.read_text().splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a crash: that seed is simply tried again
        failures.add((item["task"], int(item["seed"])))
    return failures


def collect_metaworld(
    root: Path,
    spec: MetaWorldCollectSpec,
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
    if resumed and not work.exists() and (root / "meta" / REPORT_FILE).exists():
        print(f"{root} is already a complete collection; nothing to do.")
        return json.loads((root / "meta" / REPORT_FILE).read_text())
    elapsed_before = _load_state(work, spec) if resumed else 0.0
    parts_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(work / "state.json", {"spec": asdict(spec), "elapsed_s": elapsed_before})
    for leftover in root.iterdir():  # outputs of a merge that was cut short
        if leftover.name != WORK_DIR:
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()

    start = time.perf_counter()
    previous_sigterm = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    scheduler = _SeedScheduler(spec, finished_parts(parts_dir), _read_failures(work / "failures.jsonl"))
    try:
        _run_workers(spec, parts_dir, work / "failures.jsonl", scheduler, workers, episodes_per_part)
    except KeyboardInterrupt:
        elapsed = elapsed_before + time.perf_counter() - start
        write_json_atomic(work / "state.json", {"spec": asdict(spec), "elapsed_s": elapsed})
        done = sum(len(e) for _, e in finished_parts(parts_dir))
        raise SystemExit(
            f"\ninterrupted: {done} finished episodes are kept in {work}. "
            f"Rerun the same command with --resume to continue."
        ) from None
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)

    parts = finished_parts(parts_dir)
    merged = work / "merged"
    if merged.exists():
        shutil.rmtree(merged)
    if parts:
        print(f"merging {len(parts)} parts into {root} ...")
        merge_parts([p for p, _ in parts], merged)
        for child in merged.iterdir():
            shutil.move(str(child), root / child.name)
    report = _report(spec, parts, scheduler, elapsed_before + time.perf_counter() - start)
    if parts:
        write_json_atomic(root / "meta" / REPORT_FILE, report)
    shutil.rmtree(work)
    return report


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


class _SeedScheduler:
    """Hands out (task, seed) jobs so that each task ends with exactly `episodes` successes.

    Seeds are tried in increasing order from 0 (evaluation seeds start at 1000 and are never used);
    a task never has more jobs in flight than successes it still needs, so the recorded seeds are the
    first successful ones whatever the number of workers.
    """

    def __init__(self, spec: MetaWorldCollectSpec, parts, failures: set[tuple[str, int]]):
        self.spec = spec
        self.successes = Counter()
        self.lengths: dict[str, list[int]] = {t: [] for t in spec.tasks}
        self.seeds: dict[str, list[int]] = {t: [] for t in spec.tasks}
        self.tried = {t: set() for t in spec.tasks}
        for _, episodes in parts:
            for e in episodes:
                self.successes[e.task] += 1
                self.lengths[e.task].append(e.length)
                self.seeds[e.task].append(e.seed)
                self.tried[e.task].add(e.seed)
        self.failures = Counter()
        for task, seed in failures:
            if task in self.tried:
                self.failures[task] += 1
                self.tried[task].add(seed)
        self.in_flight = Counter()
        self.max_attempts = max(2 * spec.episodes, spec.episodes + 10)
        self._next = dict.fromkeys(spec.tasks, 0)

    def next_job(self) -> tuple[str, int] | None:
        for task in self.spec.tasks:
            attempts = self.successes[task] + self.failures[task] + self.in_flight[task]
            if self.successes[task] + self.in_flight[task] >= self.spec.episodes:
                continue
            if attempts >= self.max_attempts:
                continue
            seed = self._next[task]
            while seed in self.tried[task]:
                seed += 1
            if seed >= TRAIN_SEED_LIMIT:
                continue
            self._next[task] = seed + 1
            self.tried[task].add(seed)
            self.in_flight[task] += 1
            return task, seed
        return None

    def done(self, task: str, seed: int, success: bool, length: int) -> None:
        self.in_flight[task] -= 1
        if success:
            self.successes[task] += 1
            self.lengths[task].append(length)
            self.seeds[task].append(seed)
        else:
            self.failures[task] += 1

    @property
    def total_in_flight(self) -> int:
        return sum(self.in_flight.values())


def _run_workers(spec, parts_dir: Path, failures_path: Path, scheduler, workers: int, per_part: int):
    ctx = mp.get_context("spawn")  # a fresh process per worker: each owns its GL context
    jobs, results, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_worker, args=(spec, parts_dir, per_part, jobs, results, stop))
        for _ in range(workers)
    ]
    for p in procs:
        p.start()
    total = spec.episodes * len(spec.tasks)
    bar = tqdm(total=total, initial=sum(scheduler.successes.values()), desc="collect", unit="ep")
    exited = 0
    try:
        with failures_path.open("a") as failures:
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
                if message[0] == "error":
                    raise RuntimeError(f"collection worker failed: {message[1]}")
                if message[0] == "exit":
                    exited += 1
                    continue
                _, task, seed, success, length = message
                scheduler.done(task, seed, success, length)
                if success:
                    bar.update(1)
                else:
                    failures.write(json.dumps({"task": task, "seed": seed}) + "\n")
                    failures.flush()
                tried = sum(scheduler.successes.values()) + sum(scheduler.failures.values())
                bar.set_postfix(task=task, expert_success=f"{sum(scheduler.successes.values()) / tried:.0%}")
        for _ in procs:
            jobs.put(None)
    except BaseException:
        stop.set()  # workers commit what they finished and exit
        raise
    finally:
        bar.close()
        for p in procs:
            p.join(timeout=120)
            if p.is_alive():
                p.terminate()
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"collection worker exit codes {[p.exitcode for p in procs]}; rerun with --resume")


def _report(spec: MetaWorldCollectSpec, parts, scheduler: _SeedScheduler, elapsed_s: float) -> dict:
    per_task = {}
    for task in spec.tasks:
        ok, failed = scheduler.successes[task], scheduler.failures[task]
        lengths = scheduler.lengths[task]
        per_task[task] = {
            "episodes": ok,
            "expert_attempts": ok + failed,
            "expert_success_rate": ok / (ok + failed) if ok + failed else None,
            "frames": sum(lengths),
            "mean_episode_length": sum(lengths) / len(lengths) if lengths else None,
            "seeds": sorted(scheduler.seeds[task]),
        }
        if ok < spec.episodes:
            print(f"warning: {task}: only {ok}/{spec.episodes} successful expert episodes")
    frames = sum(t["frames"] for t in per_task.values())
    return {
        "spec": asdict(spec),
        "per_task": per_task,
        "episodes": sum(t["episodes"] for t in per_task.values()),
        "frames": frames,
        "elapsed_s": elapsed_s,
        "frames_per_s": frames / elapsed_s if elapsed_s else None,
    }
