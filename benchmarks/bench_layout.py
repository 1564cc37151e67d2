"""Token layouts for long action chunks: what a training step and a decoded chunk cost.

    python benchmarks/bench_layout.py [--chunk 50] [--quick] [--out outputs/bench/layout.json]

ALOHA's shapes: 14-D actions, one 96x128 camera, the default backbone (width 256, 4 layers),
random weights (cost does not depend on them). Layouts: the discrete head (one backbone token per
action value: H x 14 tokens) and the factored head with 1, 2, 7 or 14 values per token (14: one
token per time step). For each: training samples/s (batch 16, forward + backward) and the latency
of one chunk at batch 1 decoded in 1, 4 and 8 parallel steps, plus one value per forward (H x 14
forwards, the cost of left-to-right decoding with the same model). The precision is the one
`dvla train` picks here (`--mixed_precision` overrides). Prints a markdown table, saves JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from dvla.action_head import DiscreteHeadConfig, FactoredHeadConfig
from dvla.backbone.decoder import DecodeConfig
from dvla.bench.latency import median_ms
from dvla.model import DiffusionVLA, DiffusionVLAConfig, TextSpecials
from dvla.training.precision import PRECISIONS, autocast, resolve_precision
from dvla.types import fake_action_batch, fake_observation
from dvla.vision import VisionConfig

ACTION_DIM, STATE_DIM, HEIGHT, WIDTH = 14, 14, 96, 128
LAYOUTS = {
    "discrete (1 value per token)": DiscreteHeadConfig(),
    "factored, 1 value per token": FactoredHeadConfig(dims_per_token=1),
    "factored, 2 values per token": FactoredHeadConfig(dims_per_token=2),
    "factored, 7 values per token": FactoredHeadConfig(dims_per_token=7),
    "factored, 14 values per token (one per step)": FactoredHeadConfig(),
}


def build(head, chunk: int) -> DiffusionVLA:
    vision = VisionConfig(image_size=HEIGHT, image_width=WIDTH, tokens_per_camera=12, cameras=["top"])
    config = DiffusionVLAConfig(
        vision=vision, head=head, chunk_size=chunk, action_dim=ACTION_DIM, state_dim=STATE_DIM
    )
    return DiffusionVLA(config, TextSpecials(vocab_size=1000, pad_id=0, eos_id=2))


def train_rate(model, chunk: int, precision: str, steps: int) -> float:
    """Training samples/s: forward + backward + AdamW on batches of 16."""
    data = fake_action_batch(16, ["top"], HEIGHT, 16, 1000, STATE_DIM, chunk, ACTION_DIM)
    data.observation.images = {"top": torch.rand(16, 3, HEIGHT, WIDTH)}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()

    def step():
        with autocast(precision, torch.device("cpu")):
            loss, _ = model.compute_loss(data)
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return 16 * steps / (time.perf_counter() - start)


def chunk_ms(model, steps: int, precision: str, repeats: int) -> tuple[float, int]:
    obs = fake_observation(1, ["top"], HEIGHT, 16, 1000, STATE_DIM)
    obs.images = {"top": torch.rand(1, 3, HEIGHT, WIDTH)}
    model.eval()
    forwards = 0

    def chunk():
        nonlocal forwards
        with torch.no_grad(), autocast(precision, torch.device("cpu")):
            _, forwards = model.sample_actions(obs, DecodeConfig(steps=steps))

    return median_ms(chunk, repeats, torch.device("cpu")), forwards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunk", type=int, default=50, help="action chunk length H")
    parser.add_argument("--quick", action="store_true", help="fewer repeats, no one-value-per-forward row")
    parser.add_argument("--out", default="outputs/bench/layout.json")
    parser.add_argument("--mixed_precision", default="auto", choices=PRECISIONS, help="as for dvla train")
    args = parser.parse_args()
    precision = resolve_precision(args.mixed_precision, torch.device("cpu"))
    repeats, train_steps = (2, 1) if args.quick else (5, 4)
    values = args.chunk * ACTION_DIM
    rows = []
    for name, head in LAYOUTS.items():
        torch.manual_seed(0)
        model = build(head, args.chunk)
        row = {"layout": name, "tokens": model.head.target_length}
        row["train_samples_per_s"] = train_rate(model, args.chunk, precision, train_steps)
        for steps in (1, 4, 8):
            row[f"ms_{steps}_steps"], _ = chunk_ms(model, steps, precision, repeats)
        if not args.quick and name.startswith("factored, 14"):
            row["ms_one_value_per_forward"], row["forwards_one_value"] = chunk_ms(model, values, precision, 1)
        rows.append(row)
        print(row, flush=True)
    results = {
        "chunk": args.chunk,
        "action_dim": ACTION_DIM,
        "image": [HEIGHT, WIDTH],
        "precision": precision,
        "rows": rows,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
        "command": f"python benchmarks/bench_layout.py --chunk {args.chunk} --mixed_precision "
        f"{args.mixed_precision}" + (" --quick" if args.quick else ""),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nH = {args.chunk} x 14-D, one 96x128 camera, {precision}; {results['machine']['cpus']} CPUs")
    print("| layout | target tokens | train samples/s | ms/chunk 1 step | 4 steps | 8 steps |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['layout']} | {r['tokens']} | {r['train_samples_per_s']:.1f} | {r['ms_1_steps']:.1f} | "
            f"{r['ms_4_steps']:.1f} | {r['ms_8_steps']:.1f} |"
        )
    one = next((r for r in rows if "ms_one_value_per_forward" in r), None)
    if one:
        slow = one["ms_one_value_per_forward"]
        print(
            f"\none value per forward (factored, one token per step): {one['forwards_one_value']} "
            f"forwards, {slow:.0f} ms = {slow / one['ms_4_steps']:.0f}x the 4-step chunk"
        )
    print(f"saved {out}")


if __name__ == "__main__":
    main()
