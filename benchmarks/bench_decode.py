"""Inference latency of one action chunk: parallel diffusion decoding vs left-to-right decoding.

    python benchmarks/bench_decode.py [--quick] [--out outputs/bench/decode.json]

For the latency of a trained checkpoint next to AR decoding and LeRobot peers, use
`dvla bench --sections [latency]`; this script sweeps model sizes with random weights. One realistic
CPU configuration (2 cameras at 128 px, H = 16, D = 4, the default model size), batch 1,
a randomly initialised model (latency does not depend on the weights), in the precision `dvla train`
would pick here (bf16 autocast where the CPU runs it natively, else fp32; `--mixed_precision` overrides).
Prints a markdown table and saves JSON. Ratios in one run are what to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
from pathlib import Path

import torch

from dvla.action_head import DiscreteHeadConfig, FlowHeadConfig
from dvla.backbone.decoder import DecodeConfig
from dvla.bench.latency import median_ms
from dvla.model import BackboneSize, DiffusionVLA, DiffusionVLAConfig, TextSpecials
from dvla.training.precision import PRECISIONS, autocast, resolve_precision
from dvla.types import fake_observation
from dvla.vision import VisionConfig

CAMERAS = ["corner2", "gripperPOV"]


def build(action_head: str = "discrete", hidden: int = 256, layers: int = 4) -> DiffusionVLA:
    config = DiffusionVLAConfig(
        vision=VisionConfig(cameras=CAMERAS, image_size=128),
        backbone=BackboneSize(hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers),
        head=FlowHeadConfig() if action_head == "flow" else DiscreteHeadConfig(),
        chunk_size=16,
        action_dim=4,
        state_dim=4,
    )
    return DiffusionVLA(config, TextSpecials(vocab_size=1000, pad_id=0, eos_id=2)).eval()


def time_chunk(
    model, obs, decode: DecodeConfig, use_cache: bool, repeats: int, precision: str
) -> tuple[float, int]:
    """Median milliseconds per chunk and backbone forwards (dvla.bench.latency's timing)."""
    forwards = 0

    def chunk():
        nonlocal forwards
        with torch.no_grad(), autocast(precision, torch.device("cpu")):
            _, forwards = model.sample_actions(obs, decode, use_cache=use_cache)

    return median_ms(chunk, repeats, torch.device("cpu")), forwards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    parser.add_argument("--out", default="outputs/bench/decode.json")
    parser.add_argument("--hidden", type=int, default=256, help="backbone width (default model: 256)")
    parser.add_argument("--layers", type=int, default=4, help="backbone layers (default model: 4)")
    parser.add_argument("--mixed_precision", default="auto", choices=PRECISIONS, help="as for dvla train")
    args = parser.parse_args()
    precision = resolve_precision(args.mixed_precision, torch.device("cpu"))
    repeats = 2 if args.quick else 10
    torch.manual_seed(0)
    model = build(hidden=args.hidden, layers=args.layers)
    obs = fake_observation(1, CAMERAS, 128, 12, 1000, 4)
    tokens = model.config.chunk_size * model.config.action_dim
    rows = []
    for steps in [1, 2, 4, 8, tokens]:
        for use_cache in (True, False):
            ms, forwards = time_chunk(model, obs, DecodeConfig(steps=steps), use_cache, repeats, precision)
            rows.append(
                {
                    "mode": "parallel",
                    "steps": steps,
                    "prefix_cache": use_cache,
                    "ms": ms,
                    "forwards": forwards,
                }
            )
            print(rows[-1], flush=True)
    ms, forwards = time_chunk(
        model, obs, DecodeConfig(autoregressive=True), True, max(2, repeats // 3), precision
    )
    rows.append(
        {
            "mode": "autoregressive (KV cache)",
            "steps": tokens,
            "prefix_cache": True,
            "ms": ms,
            "forwards": forwards,
        }
    )
    print(rows[-1], flush=True)
    flow = build("flow", args.hidden, args.layers)
    ms, forwards = time_chunk(flow, obs, DecodeConfig(), True, repeats, precision)
    rows.append(
        {
            "mode": "flow head (10 Euler steps)",
            "steps": 1,
            "prefix_cache": True,
            "ms": ms,
            "forwards": forwards,
        }
    )

    params = sum(p.numel() for p in model.parameters())
    vision = sum(p.numel() for p in model.vision.parameters())
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ar = rows[-2]["ms"]
    four = next(r for r in rows if r["steps"] == 4 and r["prefix_cache"])
    results = {
        "config": {
            "cameras": CAMERAS,
            "image_size": 128,
            "chunk_size": 16,
            "action_dim": 4,
            "batch": 1,
            "dtype": "bf16" if precision == "bf16" else "fp32",
        },
        "parameters": params,
        "vision_parameters": vision,
        "peak_rss_mb": peak_mb,
        "rows": rows,
        "speedup_4_steps_vs_ar": ar / four["ms"],
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
        "command": f"python benchmarks/bench_decode.py --hidden {args.hidden} --layers {args.layers} "
        f"--mixed_precision {args.mixed_precision}" + (" --quick" if args.quick else ""),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nparameters {params / 1e6:.1f} M (vision {vision / 1e6:.1f} M), peak RSS {peak_mb:.0f} MB")
    print("\n| decoding | steps | prefix cache | backbone forwards | ms / chunk |")
    print("| --- | ---: | --- | ---: | ---: |")
    for r in rows:
        cache = "yes" if r["prefix_cache"] else "no"
        print(f"| {r['mode']} | {r['steps']} | {cache} | {r['forwards']} | {r['ms']:.1f} |")
    print(f"\n4-step parallel decoding is {results['speedup_4_steps_vs_ar']:.1f}x faster than AR decoding")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
