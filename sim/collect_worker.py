"""The worker process of `dvla collect`: expert episodes in, finished LeRobot parts out."""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import queue
import signal
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dvla.sim.environments import get_environment
from dvla.sim.recording import SIM_STATE_KEY, FrameError, PartWriter, image_key
from dvla.sim.tasks import TRAIN_SEED_LIMIT

LOCK_FILE = "lock"
# What a collection records: expert demonstrations, or scenes for the simulator-state target only.
COLLECTION_KINDS = ("demos", "scenes")


@dataclass
class CollectSpec:
    """What a collection records; a resumed collection must match it exactly."""

    tasks: list[str]
    episodes: int
    cameras: list[str]
    image_size: int
    use_videos: bool
    shadow_size: int
    max_episode_steps: int
    sim_state: bool = True
    # "demos": successful scripted-expert episodes. "scenes": no expert; each episode is one
    # reset(seed) and `scene_frames` frames of the arm wandering (see run_scene_walk), for the
    # simulator-state target only (`dvla train --perception.root`), never as demonstrations.
    kind: str = "demos"
    scene_frames: int = 6
    # Steps of one random action between two recorded frames of a scene.
    scene_walk_steps: int = 8
    # First seed tried per task (seeds below 1000; evaluation seeds start there).
    seed_start: int = 0
    # Demonstrations only: the executed hand motion is the expert's plus a random push of up to this
    # size per axis (in action units, 1 = the largest step), held for `action_noise_steps` steps, then
    # drawn again; the gripper is left alone. The recorded action stays the expert's own, so the
    # demonstrations visit states off the expert's straight path, labelled with how the expert gets
    # back (DART, Laskey et al. 2017). 0 = the expert alone.
    action_noise: float = 0.0
    action_noise_steps: int = 8
    # The simulator (dvla.sim.environments): metaworld or aloha.
    env: str = "metaworld"

    def __post_init__(self):
        if self.kind not in COLLECTION_KINDS:
            raise ValueError(f"kind must be one of {COLLECTION_KINDS}, got {self.kind!r}")
        if self.scene_frames < 1 or self.scene_walk_steps < 1:
            raise ValueError(
                "scene_frames and scene_walk_steps must be >= 1, "
                f"got {self.scene_frames} and {self.scene_walk_steps}"
            )
        if not 0 <= self.seed_start < TRAIN_SEED_LIMIT:
            raise ValueError(
                f"seed_start must be in [0, {TRAIN_SEED_LIMIT}) (evaluation seeds start at "
                f"{TRAIN_SEED_LIMIT}), got {self.seed_start}"
            )
        if not 0.0 <= self.action_noise <= 1.0 or self.action_noise_steps < 1:
            raise ValueError(
                "action_noise must be in [0, 1] and action_noise_steps >= 1, "
                f"got {self.action_noise} and {self.action_noise_steps}"
            )
        if self.kind == "scenes" and not self.sim_state:
            raise ValueError("scenes are recorded for their simulator state: they need sim_state true")
        if self.kind == "scenes" and self.scene_frames * self.scene_walk_steps > self.max_episode_steps:
            raise ValueError(
                f"scene_frames x scene_walk_steps ({self.scene_frames * self.scene_walk_steps}) exceeds "
                f"max_episode_steps ({self.max_episode_steps})"
            )


def episode_frame(obs: dict, raw_obs: np.ndarray | None, action, reward: float, success: bool) -> dict:
    """One recorded frame: the observation, then the action taken and what followed it."""
    frame = {image_key(c): img for c, img in obs["images"].items()}
    frame["observation.state"] = obs["state"]
    if raw_obs is not None:
        frame[SIM_STATE_KEY] = raw_obs
    frame["action"] = np.asarray(action, np.float32)
    frame["next.reward"] = np.array([reward], np.float32)
    frame["next.success"] = np.array([success], bool)
    frame["task"] = obs["task"]
    return frame


def run_expert_episode(
    env, expert, seed: int, sim_state: bool = True, noise: float = 0.0, noise_steps: int = 8
) -> tuple[list[dict], bool]:
    """Roll the scripted expert out from `reset(seed)` until the first success or the step limit.

    With `noise`, the hand moves by the expert's action plus a push drawn from (task, seed) in
    [-noise, noise]^3 and held for `noise_steps` steps; the frames record the expert's action.
    Returns the frames (observation, the expert's action, the reward and success that followed) and
    whether the episode succeeded.
    """
    rng = np.random.default_rng((seed, zlib.crc32(env.task.encode()), 1))
    obs, _ = env.reset(seed=seed)
    frames, push = [], np.zeros(4, np.float32)
    for step in range(env.config.max_episode_steps):
        raw_obs = env.raw_obs.astype(np.float32) if sim_state else None
        action = expert(env.raw_obs)
        if noise > 0 and step % noise_steps == 0:
            push[:3] = rng.uniform(-noise, noise, 3)
        next_obs, reward, terminated, truncated, info = env.step(np.clip(action + push, -1.0, 1.0))
        frames.append(episode_frame(obs, raw_obs, action, reward, info["success"]))
        if terminated or truncated:
            break
        obs = next_obs
    return frames, bool(frames[-1]["next.success"][0])


def run_scene_walk(env, seed: int, n_frames: int, walk_steps: int) -> list[dict]:
    """Frames of one scene without an expert: `reset(seed)` places objects and goal, then the arm
    wanders. Each recorded frame is followed by `walk_steps` steps of one random action (a direction
    in [-1, 1]^3 and an open or closed gripper, drawn from (task, seed)); only the recorded frames
    are rendered. The simulator state is always recorded: it is what these frames are for."""
    rng = np.random.default_rng((seed, zlib.crc32(env.task.encode())))
    obs, _ = env.reset(seed=seed)
    frames = []
    for i in range(n_frames):
        action = np.append(rng.uniform(-1.0, 1.0, 3), rng.choice([-1.0, 1.0])).astype(np.float32)
        raw_obs, seen = env.raw_obs.astype(np.float32), obs
        success = False  # the last frame's action is drawn but never taken
        if i < n_frames - 1:
            for _ in range(walk_steps - 1):
                success |= env.step_unrendered(action)
            obs, _, step_success, _, _ = env.step(action)
            success |= step_success
        frames.append(episode_frame(seen, raw_obs, action, 0.0, success))  # no reward is recorded for scenes
    return frames


def _make_env(spec: CollectSpec, task: str):
    from dvla.sim.environments import get_environment

    environment = get_environment(spec.env)
    shape = environment.image_shape(spec.image_size)
    env = environment.make(task, spec.cameras, shape, spec.shadow_size, spec.max_episode_steps)
    return env, environment.make_expert(task)


def _quiet_libraries() -> None:
    import av
    import datasets

    datasets.disable_progress_bars()  # lerobot maps every saved episode through `datasets`
    av.logging.set_level(av.logging.ERROR)  # the mp4 muxer reports each file it rewrites


def worker_main(spec: CollectSpec, work_dir: Path, per_part: int, jobs, results, stop) -> None:
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
    environment = get_environment(spec.env)
    shape = environment.image_shape(spec.image_size)
    features = environment.features(spec.cameras, shape, spec.use_videos, spec.sim_state)
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
                frames, success = environment.record_demo(env, expert, seed, spec)
            except Exception as exc:  # an unstable simulation or a failing expert: a failed episode
                frames, success, error = [], False, f"{type(exc).__name__}: {exc}"
            if success:
                if part is None:
                    name = f"part-{time.time_ns()}-{mp.current_process().pid}"
                    part = PartWriter(
                        work_dir / "parts" / name, features, env.fps, spec.use_videos, environment.robot_type
                    )
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
