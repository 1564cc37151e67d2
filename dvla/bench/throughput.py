"""Training throughput of the default config next to the machine's measured matmul rate.

FLOPs of one training step come from torch's FlopCounterMode (matmuls and convolutions, forward and
backward); the matmul rate from timing square matmuls in the same process, so the ratio holds on
any machine. Training runs in the run's precision (bf16 autocast where it is fast, else fp32) and is
compared with the matmul rate of that dtype.
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from dvla.model import DiffusionVLA, DiffusionVLAConfig, TextSpecials
from dvla.training.precision import autocast
from dvla.types import fake_action_batch
from dvla.vision import VisionConfig

CAMERAS = ["corner2", "gripperPOV"]  # the MetaWorld configs' cameras


def matmul_rate(dtype: torch.dtype, device: torch.device, size: int = 2048, seconds: float = 2.0) -> float:
    """Achieved FLOP/s of (size x size) @ (size x size) matmuls in `dtype`."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(2):  # warm-up
        a @ b
    _sync(device)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
        _sync(device)
    return 2 * size**3 * count / (time.perf_counter() - start)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def default_model(device: torch.device) -> DiffusionVLA:
    """The default model size with the MetaWorld configs' inputs (2 cameras at 128 px, H=16, D=4)."""
    config = DiffusionVLAConfig(
        vision=VisionConfig(cameras=CAMERAS, image_size=128), action_dim=4, state_dim=4
    )
    return DiffusionVLA(config, TextSpecials(vocab_size=1000, pad_id=0, eos_id=2)).to(device)


def training_throughput(batch_size: int, steps: int, device: torch.device, precision: str) -> dict:
    """Samples/s and FLOP/s of full training steps (forward, backward, AdamW); `precision` is a
    resolved "bf16" or "no"."""
    torch.manual_seed(0)
    model = default_model(device).train()
    config = model.config
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = fake_action_batch(batch_size, CAMERAS, 128, 12, 1000, 4, config.chunk_size, config.action_dim)
    batch = batch.to(device)

    def step(counter=None):
        with counter or contextlib.nullcontext():
            with autocast(precision, device):
                loss, _ = model(batch)
            loss.backward()
        opt.step()
        opt.zero_grad()

    counter = FlopCounterMode(display=False)
    step(counter)  # also the warm-up
    flops = counter.get_total_flops()
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    seconds = (time.perf_counter() - start) / steps
    return {
        "batch_size": batch_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "flops_per_step": flops,
        "seconds_per_step": seconds,
        "samples_per_s": batch_size / seconds,
        "flops_per_s": flops / seconds,
    }


def measure(device: torch.device, precision: str, batch_size: int = 32, steps: int = 10) -> dict:
    """Training throughput in `precision` ("bf16" or "no") and the matmul rate of that dtype, from
    one process."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    rate = matmul_rate(dtype, device)
    train = training_throughput(batch_size, steps, device, precision)
    return {
        **train,
        "precision": "bf16" if precision == "bf16" else "fp32",
        "matmul_flops_per_s": rate,
        "fraction_of_matmul": train["flops_per_s"] / rate,
    }
