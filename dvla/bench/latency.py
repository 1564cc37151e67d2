"""Batch-1 latency per action chunk and per control step, in the run's precision (bf16 autocast where
it is fast, else fp32: `dvla.training.precision`).

dvla is timed through its own `sample_actions` (parallel decoding with and without the prefix KV
cache, left-to-right decoding with a KV cache, the flow head); LeRobot policies through
`select_action` right after `reset()`, which is when they predict a new chunk. Latency does not
depend on the weights, so untrained policies stand in where no trained one is given.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dvla.backbone.decoder import DecodeConfig
from dvla.training.precision import autocast
from dvla.types import fake_observation


@dataclass
class Timing:
    name: str
    ms_per_chunk: float
    forwards: int  # network forwards per chunk
    n_action_steps: int  # actions executed per chunk

    def row(self, **extra) -> dict:
        return {
            "policy": self.name,
            "ms_per_chunk": self.ms_per_chunk,
            "ms_per_control_step": self.ms_per_chunk / self.n_action_steps,
            "forwards": self.forwards,
            "n_action_steps": self.n_action_steps,
            **extra,
        }


def median_ms(fn: Callable[[], object], repeats: int, device: torch.device, warmup: int = 2) -> float:
    times = []
    for i in range(warmup + repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def dvla_observation(model, device: torch.device):
    """A batch-1 observation shaped like the model's inputs."""
    config = model.config
    cameras = [c for c in config.vision.cameras if c != "scene"]
    obs = fake_observation(1, cameras, config.vision.shape, 12, model.text.vocab_size, config.state_dim)
    return obs.to(device)


def time_dvla(
    model, decode: DecodeConfig, use_cache: bool, repeats: int, n_action_steps: int, precision: str
) -> Timing:
    """`precision`: a resolved "bf16" or "no"."""
    device = next(model.parameters()).device
    obs = dvla_observation(model, device)
    forwards = 0

    def chunk():
        nonlocal forwards
        with torch.no_grad(), autocast(precision, device):
            _, forwards = model.sample_actions(obs, decode, use_cache=use_cache)

    ms = median_ms(chunk, repeats, device)
    return Timing("dvla", ms, forwards, n_action_steps)


def time_lerobot(actor, repeats: int, device: torch.device, precision: str) -> Timing:
    """A LeRobot actor (`LeRobotActor`): `select_action` on a fresh episode predicts a chunk."""
    import numpy as np

    observation = {
        "images": {c: np.zeros((*actor.image_shape, 3), dtype=np.uint8) for c in actor.cameras},
        "state": np.zeros(actor.state_dim, dtype=np.float32),
    }
    batch = actor.batch(observation, "benchmark")
    policy = actor.policy

    def chunk():
        policy.reset()
        with torch.no_grad(), autocast(precision, device):
            policy.select_action(dict(batch))

    ms = median_ms(chunk, repeats, device)
    return Timing(actor.type, ms, actor.forwards_per_chunk, actor.n_action_steps)
