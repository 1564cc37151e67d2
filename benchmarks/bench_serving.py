"""The policy server against in-process inference, over loopback: latency at batch 1 (p50/p99) and
throughput with several clients against one client at a time.

    python benchmarks/bench_serving.py --checkpoint outputs/train/aloha_transfer_cube

The server runs as `dvla serve` in its own process on 127.0.0.1; it stops when the benchmark ends.
Results: printed, and saved to outputs/bench/serving.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import torch

from dvla.checkpoint import checkpoint_info
from dvla.policy import DiffusionVLAPolicy
from dvla.serving.client import PolicyClient
from dvla.training.precision import autocast, resolve_precision


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def observation(meta: dict, shape: tuple[int, int], seed: int) -> dict:
    rng = np.random.default_rng(seed)
    images = {c: rng.integers(0, 256, (*shape, 3), dtype=np.uint8) for c in meta["cameras"]}
    return {
        "images": images,
        "state": rng.normal(size=meta["state_dim"]).astype(np.float32),
        "prompt": meta["prompt"],
    }


def percentiles(ms: list[float]) -> dict:
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "n": len(ms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--requests", type=int, default=200, help="requests per measurement")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--image_height", type=int, default=None, help="None = the model's input size")
    parser.add_argument("--mixed_precision", default="auto")
    parser.add_argument("--out", default="outputs/bench/serving.json")
    args = parser.parse_args()

    policy = DiffusionVLAPolicy.from_pretrained(args.checkpoint)
    vision = policy.model.config.vision
    shape = (args.image_height or vision.shape[0], vision.shape[1] if not args.image_height else
             round(args.image_height * vision.shape[1] / vision.shape[0]))  # fmt: skip
    tasks = checkpoint_info(args.checkpoint)
    meta = {"cameras": policy.action_cameras, "state_dim": policy.model.config.state_dim,
            "prompt": (tasks.get("tasks") or ["do the task"])[0]}  # fmt: skip
    precision = resolve_precision(args.mixed_precision, torch.device("cpu"))
    context = autocast(precision, torch.device("cpu"))

    def local(obs):
        images = {c: torch.from_numpy(image[None]) for c, image in obs["images"].items()}
        with context:
            return policy.predict_action_chunk(images, [obs["prompt"]], torch.from_numpy(obs["state"][None]))

    for seed in range(5):  # warm-up
        local(observation(meta, shape, seed))
    in_process = []
    for seed in range(args.requests):
        obs = observation(meta, shape, seed)
        start = time.perf_counter()
        local(obs)
        in_process.append((time.perf_counter() - start) * 1000)

    port = free_port()
    options = {"checkpoint": args.checkpoint, "port": port, "mixed_precision": args.mixed_precision,
               "batch_window_ms": 2, "max_batch": args.clients}  # fmt: skip
    command = [sys.executable, "-m", "dvla.cli", "serve", *(f"--{k}={v}" for k, v in options.items())]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(port, server)
        with PolicyClient("127.0.0.1", port) as client:
            for seed in range(5):
                client.infer(observation(meta, shape, seed))
            served, server_side = [], []
            for seed in range(args.requests):
                obs = observation(meta, shape, seed)
                start = time.perf_counter()
                reply = client.infer(obs)
                served.append((time.perf_counter() - start) * 1000)
                server_side.append(reply["server_timing"]["infer_ms"])
            start = time.perf_counter()
            for seed in range(args.requests):
                client.infer(observation(meta, shape, seed))
            sequential = args.requests / (time.perf_counter() - start)
        clients = [PolicyClient("127.0.0.1", port) for _ in range(args.clients)]
        batches: list[int] = []

        def work(i: int) -> None:
            for seed in range(args.requests // args.clients):
                batches.append(clients[i].infer(observation(meta, shape, seed))["server_timing"]["batch"])

        threads = [threading.Thread(target=work, args=(i,)) for i in range(args.clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        concurrent = len(batches) / (time.perf_counter() - start)
        for client in clients:
            client.close()
    finally:
        server.terminate()
        server.wait(30)

    local_stats, served_stats = percentiles(in_process), percentiles(served)
    results = {
        "checkpoint": args.checkpoint,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "precision": precision,
        "image_shape": list(shape),
        "in_process": local_stats,
        "served": served_stats,
        "server_infer": percentiles(server_side),
        "overhead_p50_ms": served_stats["p50_ms"] - local_stats["p50_ms"],
        "throughput": {
            "sequential_per_s": sequential,
            f"{args.clients}_clients_per_s": concurrent,
            "ratio": concurrent / sequential,
            "mean_batch": float(np.mean(batches)),
        },
    }
    print(json.dumps(results, indent=2))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"saved {out}")


def wait_healthy(port: int, server: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"dvla serve exited with code {server.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"dvla serve did not answer /healthz within {timeout} s")


if __name__ == "__main__":
    main()
