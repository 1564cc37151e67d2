"""Can the vision encoder alone find a target? Regress its position from first frames.

    python experiments/probe_vision.py --task reach-v3 --part goal --train-seeds 50,500 \
        [--image-size 128] [--camera corner2] [--steps 1500] [--out outputs/bench/probe_vision.json]

Renders the first frame of MetaWorld seeds 0..N-1 (training) and 1000..1099 (evaluation), then
trains a fresh encoder (the model's default: resnet10t from scratch, 16 pooled tokens) with a
linear head to regress the target's xyz from one camera, and reports the held-out distance in cm
next to the best blind answer (the training mean). No language, no robot state, no actions: this
separates "the encoder cannot resolve the target" (no N helps) from "50 scenes are too few to
learn where it is" (a larger N helps). Frames are cached under outputs/bench/probe_vision/.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from dvla.sim.metaworld_env import MetaWorldEnv, MetaWorldEnvConfig
from dvla.vision.encoder import VisionConfig, VisionEncoder

# Slices of MetaWorld's 39-D observation (see dvla.sim.metaworld_env.SIM_STATE_DIM).
PARTS = {"first object": slice(4, 7), "goal": slice(36, 39)}
EVAL_SEEDS = range(1000, 1100)
CACHE = Path("outputs/bench/probe_vision")


def first_frames(task: str, camera: str, size: int, seeds: range) -> tuple[np.ndarray, np.ndarray]:
    """-> images uint8 (N, H, W, 3) and MetaWorld observations (N, 39), cached on disk."""
    path = CACHE / f"{task}_{camera}_{size}_{seeds.start}-{seeds.stop - 1}.npz"
    if path.exists():
        saved = np.load(path)
        return saved["images"], saved["obs"]
    env = MetaWorldEnv(MetaWorldEnvConfig(task=task, cameras=[camera], image_size=size))
    images, obs = [], []
    try:
        for seed in tqdm(seeds, desc=f"render {task} {size}px", leave=False):
            frame, _ = env.reset(seed=seed)
            images.append(frame["images"][camera])
            obs.append(env.raw_obs.copy())
    finally:
        env.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, images=np.stack(images), obs=np.stack(obs))
    return np.stack(images), np.stack(obs)


class Locator(nn.Module):
    """images (B, 3, H, W) in [0, 1] -> xyz (B, 3), through the policy's own encoder."""

    def __init__(self, config: VisionConfig, width: int = 128):
        super().__init__()
        self.camera = config.cameras[0]
        self.encoder = VisionEncoder(config, width)
        tokens = self.encoder.tokens_per_camera + config.keypoints
        # Flattened, not averaged: which token lights up is where the target is.
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Flatten(), nn.Linear(tokens * width, 3))

    def forward(self, images: torch.Tensor, train: bool) -> torch.Tensor:
        return self.head(self.encoder({self.camera: images}, train=train))  # (B, 3)


def to_pixels(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255  # (N, 3, H, W)


def fit_and_score(train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray], args) -> dict:
    """Trains a fresh locator on `train` (images, xyz) and returns held-out errors in cm."""
    torch.manual_seed(0)
    (x_train, y_train), (x_test, y_test) = train, test
    mean, std = y_train.mean(0), y_train.std(0) + 1e-3
    target = torch.from_numpy((y_train - mean) / std).float()  # (N, 3)
    pixels, test_pixels = to_pixels(x_train), to_pixels(x_test)
    config = VisionConfig(
        cameras=[args.camera],
        image_size=args.image_size,
        shift_fraction=args.shift,
        keypoints=args.keypoints,
        tokens_per_camera=args.tokens,
        timm_kwargs={"output_stride": args.output_stride} if args.output_stride else {},
    )
    model = Locator(config)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(optim, args.lr, total_steps=args.steps, pct_start=0.1)
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    bar = tqdm(range(args.steps), desc=f"fit on {len(x_train)} scenes", leave=False)
    for _ in bar:
        idx = torch.randint(len(pixels), (args.batch_size,), generator=generator)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(pixels[idx], train=True).float(), target[idx])
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        sched.step()
        bar.set_postfix(mse=f"{loss.item():.3f}")
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        read = torch.cat([model(chunk, train=False).float() for chunk in test_pixels.split(64)])
        read_train = torch.cat([model(chunk, train=False).float() for chunk in pixels.split(64)])
    read = read.numpy() * std + mean
    read_train = read_train.numpy() * std + mean
    cm = np.linalg.norm(read - y_test, axis=1) * 100
    return {
        "scenes": len(x_train),
        "held_out_cm": float(cm.mean()),
        "held_out_xy_cm": float(np.linalg.norm((read - y_test)[:, :2], axis=1).mean() * 100),
        "training_cm": float(np.linalg.norm(read_train - y_train, axis=1).mean() * 100),
        "blind_cm": float(np.linalg.norm(mean - y_test, axis=1).mean() * 100),
        "fit_seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", default="reach-v3")
    parser.add_argument("--part", default="goal", choices=sorted(PARTS))
    parser.add_argument("--train-seeds", default="50,500", help="comma list of training set sizes")
    parser.add_argument("--camera", default="corner2")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--shift", type=float, default=0.0, help="random-shift fraction in training")
    parser.add_argument("--keypoints", type=int, default=0, help="spatial-softmax keypoint tokens")
    parser.add_argument("--tokens", type=int, default=16, help="pooled cell tokens")
    parser.add_argument("--output-stride", type=int, default=0, help="e.g. 16 for a finer grid")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    sizes = [int(n) for n in args.train_seeds.split(",")]
    part = PARTS[args.part]
    images, obs = first_frames(args.task, args.camera, args.image_size, range(max(sizes)))
    test_images, test_obs = first_frames(args.task, args.camera, args.image_size, EVAL_SEEDS)
    rows = []
    for n in sizes:
        row = fit_and_score((images[:n], obs[:n, part]), (test_images, test_obs[:, part]), args)
        rows.append(row)
        print(
            f"{n:5d} scenes: held-out {row['held_out_cm']:.1f} cm (xy {row['held_out_xy_cm']:.1f}), "
            f"training {row['training_cm']:.1f} cm, blind {row['blind_cm']:.1f} cm "
            f"({row['fit_seconds']:.0f} s)",
            flush=True,
        )
    result = {"args": vars(args), "eval_seeds": f"{EVAL_SEEDS.start}-{EVAL_SEEDS.stop - 1}", "rows": rows}
    out = Path(args.out or f"outputs/bench/probe_vision_{args.task}_{args.part}_{args.image_size}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
