"""Simulated environments in worker processes, stepped together (a small vectorised env).

Unlike gymnasium's vector envs, each slot can switch task between episodes, so one pool runs a
whole suite: the caller resets slot i to (task, seed) whenever its episode ends. Each worker owns
its GL context and keeps one environment (rebuilt when the task changes).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import traceback
from dataclasses import dataclass

import numpy as np


@dataclass
class StepResult:
    observation: dict
    reward: float
    terminated: bool
    truncated: bool
    info: dict


@dataclass
class PoolEnvConfig:
    """What every environment of a pool shares: `dvla.sim.environments` name and `make` arguments."""

    env: str
    cameras: list[str]
    image_shape: tuple[int, int]
    max_episode_steps: int
    shadow_size: int = 0


def _worker(conn, base: PoolEnvConfig) -> None:
    from dvla.sim.environments import get_environment

    environment = get_environment(base.env)

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and closes the pool
    env = None
    try:
        while True:
            command, payload = conn.recv()
            if command == "close":
                break
            try:
                if command == "reset":
                    task, seed = payload
                    if env is None or env.task != task:
                        if env is not None:
                            env.close()
                        env = environment.make(
                            task, base.cameras, base.image_shape, base.shadow_size, base.max_episode_steps
                        )
                    conn.send(("ok", env.reset(seed=seed)[0]))
                elif command == "step":
                    conn.send(("ok", StepResult(*env.step(payload))))
                else:
                    raise ValueError(f"unknown command {command!r}")
            except Exception:
                conn.send(("error", traceback.format_exc()))
    finally:
        if env is not None:
            env.close()
        conn.close()


class EnvPool:
    """`size` worker processes; `reset({slot: (task, seed)})` and `step({slot: action})` run in parallel."""

    def __init__(self, size: int, env_config: PoolEnvConfig):
        if size < 1:
            raise ValueError(f"the pool needs at least one worker, got {size}")
        context = mp.get_context("spawn")
        self._conns, self._procs = [], []
        for _ in range(size):
            parent, child = context.Pipe()
            proc = context.Process(target=_worker, args=(child, env_config), daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)

    @property
    def size(self) -> int:
        return len(self._conns)

    def _call(self, command: str, payloads: dict[int, object]) -> dict[int, object]:
        for slot, payload in payloads.items():
            self._conns[slot].send((command, payload))
        results, errors = {}, []
        for slot in payloads:
            status, value = self._conns[slot].recv()
            if status == "error":
                errors.append(f"slot {slot}:\n{value}")
            results[slot] = value
        if errors:
            raise RuntimeError("environment worker failed:\n" + "\n".join(errors))
        return results

    def reset(self, episodes: dict[int, tuple[str, int]]) -> dict[int, dict]:
        """{slot: (task, seed)} -> {slot: first observation}."""
        return self._call("reset", episodes)

    def step(self, actions: dict[int, np.ndarray]) -> dict[int, StepResult]:
        return self._call("step", {slot: np.asarray(a, dtype=np.float32) for slot, a in actions.items()})

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(BrokenPipeError, OSError):  # the worker may be gone already
                conn.send(("close", None))
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
        self._conns, self._procs = [], []

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
