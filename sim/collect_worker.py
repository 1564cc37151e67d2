"""The worker process of `dvla collect`: expert episodes in, finished LeRobot parts out."""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import queue
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dvla.sim.recording import SIM_STATE_KEY, FrameError, PartWriter, image_key, metaworld_features

LOCK_FILE = "lock"


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
    sim_state: bool = True


def run_expert_episode(env, expert, seed: int, sim_state: bool = True) -> tuple[list[dict], bool]:
    """Roll the scripted expert out from `reset(seed)` until the first success or the step limit.

    Returns the frames (observation, the action taken, the reward and success that followed) and
    whether the episode succeeded.
    """
    obs, _ = env.reset(seed=seed)
    frames = []
    for _ in range(env.config.max_episode_steps):
        raw_obs = env.raw_obs.astype(np.float32)
        action = expert(env.raw_obs)
        next_obs, reward, terminated, truncated, info = env.step(action)
        frame = {image_key(c): img for c, img in obs["images"].items()}
        frame["observation.state"] = obs["state"]
        if sim_state:
            frame[SIM_STATE_KEY] = raw_obs
        frame["action"] = action
        frame["next.reward"] = np.array([reward], np.float32)
        frame["next.success"] = np.array([info["success"]], bool)
        frame["task"] = obs["task"]
        frames.append(frame)
        if terminated or truncated:
            break
        obs = next_obs
    return frames, bool(frames[-1]["next.success"][0])


def _make_env(spec: MetaWorldCollectSpec, task: str):
    from dvla.sim.experts import ScriptedExpert
    from dvla.sim.metaworld_env import MetaWorldEnv, MetaWorldEnvConfig

    config = MetaWorldEnvConfig(
        task=task,
        cameras=spec.cameras,
        image_size=spec.image_size,
        shadow_size=spec.shadow_size,
        max_episode_steps=spec.max_episode_steps,
    )
    return MetaWorldEnv(config), ScriptedExpert(task)


def _quiet_libraries() -> None:
    import av
    import datasets

    datasets.disable_progress_bars()  # lerobot maps every saved episode through `datasets`
    av.logging.set_level(av.logging.ERROR)  # the mp4 muxer reports each file it rewrites


def worker_main(spec: MetaWorldCollectSpec, work_dir: Path, per_part: int, jobs, results, stop) -> None:
    """Run (task, seed) jobs; write successful episodes to this worker's own parts.

    Messages to the main process: ("episode", task, seed, success, length, error or None),
    ("fatal", reason) when recording itself fails, and ("exit",) last.
    """
    # Ctrl-C and SIGTERM reach the whole process group: the worker finishes its episode, commits its
    # part and leaves, so it never dies half-way through writing.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    _quiet_libraries()
    lock = (work_dir / LOCK_FILE).open("a")
    fcntl.flock(lock, fcntl.LOCK_SH)  # held until exit: a resume waits for every worker to be gone
    parent = mp.parent_process()
    features = metaworld_features(spec.cameras, spec.image_size, spec.use_videos, spec.sim_state)
    env, expert, part = None, None, None
    try:
        while not stop.is_set() and (parent is None or parent.is_alive()):
            try:
                job = jobs.get(timeout=0.5)
            except queue.Empty:
                continue
            if job is None:
                break
            task, seed = job
            error = None
            try:
                if env is None or env.task != task:
                    if env is not None:
                        env.close()
                    env, expert = _make_env(spec, task)
                frames, success = run_expert_episode(env, expert, seed, spec.sim_state)
            except Exception as exc:  # an unstable simulation or a failing expert: a failed episode
                frames, success, error = [], False, f"{type(exc).__name__}: {exc}"
            if success:
                if part is None:
                    name = f"part-{time.time_ns()}-{mp.current_process().pid}"
                    part = PartWriter(work_dir / "parts" / name, features, env.fps, spec.use_videos)
                try:
                    part.add_episode(frames, task, seed)
                except FrameError as exc:  # rejected before anything was written
                    success, error = False, f"FrameError: {exc}"
                if len(part.episodes) >= per_part:
                    part.commit()
                    part = None
            results.put(("episode", task, seed, success, len(frames), error))
        if part is not None:
            part.commit()
    except Exception as exc:  # the writer failed: its part is left unfinished and dropped on resume
        results.put(("fatal", f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        if env is not None:
            env.close()
        results.put(("exit",))
        lock.close()
