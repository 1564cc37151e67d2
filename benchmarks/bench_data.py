"""Reading a foreign LeRobot dataset: lerobot's per-item path (what dvla used before) against dvla's.

    python benchmarks/bench_data.py [--quick] [--out outputs/bench/data.json]

Writes three ALOHA-shaped datasets (one 480x640 camera, 14-D state and action, 50 fps) under
outputs/bench/data/: PNG image features; video as lerobot encodes it (AV1, a keyframe every 2
frames, so a random access decodes at most 2 frames); video with a keyframe every 50 frames (1 s,
as many cameras and converters write). On each it times, in one process:

- lerobot `LeRobotDataset.__getitem__` with the action chunk as `delta_timestamps` (dvla's sample
  path and frame-cache path before): frames/s;
- the same without the chunk (what one row's images cost);
- dvla's uncached sample (`LeRobotChunks[i]`, chunk from the in-memory action column);
- dvla's cache fill, one process (`FrameReader.window` over every window) and as training runs it
  (`cache_frames: true`, worker processes).

Prints a markdown table and the speed-ups of the cache and the uncached path over the old path;
saves JSON. Ratios inside one run are what to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from dvla.data import LeRobotChunks, LeRobotDataConfig
from dvla.sim.recording import VIDEO_BACKEND

HEIGHT, WIDTH, DIM, FPS = 480, 640, 14, 50
KEY = "observation.images.top"


def scene(t: int, episode: int) -> np.ndarray:
    """A smooth 480x640 frame with a moving block (compresses like a rendered scene, not like noise)."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    frame = np.stack([(x // 3 + episode * 20) % 256, (y // 2) % 256, np.full_like(x, 90)], -1)
    top, left = 100 + (t * 3) % 250, 80 + (t * 7) % 450
    frame[top : top + 60, left : left + 90] = (200, 40, 40)
    return frame.astype(np.uint8)


def write_dataset(root: Path, gop: int | None, episodes: int, length: int) -> Path:
    """gop None: PNG image features; 2: video as lerobot encodes it (AV1, a keyframe every 2
    frames); else H.264 video with a keyframe every `gop` frames."""
    from lerobot.configs.video import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    if (root / "meta" / "info.json").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    videos = gop is not None
    dtype = "video" if videos else "image"
    features = {
        KEY: {"dtype": dtype, "shape": (HEIGHT, WIDTH, 3), "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": (DIM,), "names": None},
        "action": {"dtype": "float32", "shape": (DIM,), "names": None},
    }
    encoder = None if gop in (None, 2) else RGBEncoderConfig(vcodec="h264", g=gop, crf=23)
    data = LeRobotDataset.create(
        f"bench/{root.name}", fps=FPS, features=features, root=root, use_videos=videos, rgb_encoder=encoder
    )
    rng = np.random.default_rng(0)
    for episode in range(episodes):
        for t in range(length):
            state = rng.normal(size=DIM).astype(np.float32)
            data.add_frame(
                {KEY: scene(t, episode), "observation.state": state, "action": state, "task": "transfer"}
            )
        data.save_episode()
    data.finalize()
    return root


def rate(fn, indices) -> float:
    """Items per second of fn(i) over indices (after one warm-up call)."""
    fn(indices[0])
    start = time.perf_counter()
    for i in indices:
        fn(i)
    return len(indices) / (time.perf_counter() - start)


def measure(root: Path, chunk: int, size: int, samples: int) -> dict:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    repo = f"bench/{root.name}"
    delta = {"action": [i / FPS for i in range(chunk)]}
    with_chunk = LeRobotDataset(repo, root=root, delta_timestamps=delta, video_backend=VIDEO_BACKEND)
    plain = LeRobotDataset(repo, root=root, video_backend=VIDEO_BACKEND)
    n = len(plain)
    rng = np.random.default_rng(0)
    few = rng.choice(n, size=min(samples, n), replace=False).tolist()
    many = rng.choice(n, size=min(4 * samples, n), replace=False).tolist()
    config = LeRobotDataConfig(root=str(root), chunk_size=chunk, image_size=size)
    ours = LeRobotChunks(config)
    row = {
        "frames": n,
        "lerobot_item_with_chunk": rate(with_chunk.__getitem__, few),
        "lerobot_item": rate(plain.__getitem__, many),
        "dvla_uncached": rate(ours.__getitem__, many),
    }
    start = time.perf_counter()
    for a, b in ours.frames.windows():
        ours.frames.window(a, b)
    row["dvla_cache_one_process"] = n / (time.perf_counter() - start)
    start = time.perf_counter()
    cached = LeRobotChunks(
        LeRobotDataConfig(root=str(root), chunk_size=chunk, image_size=size, cache_frames=True)
    )
    row["dvla_cache_fill_with_workers"] = n / (time.perf_counter() - start)  # includes opening the dataset
    row["workers"] = min(4, os.cpu_count() or 1)
    h, w = cached.image_shapes["top"]  # the camera's aspect ratio is kept
    assert cached.cache.nbytes == n * 3 * h * w and h == size
    row["cache_speedup"] = row["dvla_cache_one_process"] / row["lerobot_item_with_chunk"]
    row["uncached_speedup"] = row["dvla_uncached"] / row["lerobot_item_with_chunk"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small dataset and few samples (smoke run)")
    parser.add_argument("--chunk", type=int, default=32, help="action chunk length")
    parser.add_argument("--image_size", type=int, default=96)
    parser.add_argument("--workdir", default="outputs/bench/data")
    parser.add_argument("--out", default="outputs/bench/data.json")
    args = parser.parse_args()
    episodes, length, samples = (2, 40, 4) if args.quick else (4, 100, 10)
    torch.set_num_threads(os.cpu_count() or 1)
    results = {"rows": {}, "chunk": args.chunk, "image_size": args.image_size}
    for name, gop in (
        ("image features (PNG)", None),
        ("video (AV1), keyframe every 2", 2),
        ("video (H.264), keyframe every 50", 50),
    ):
        folder = f"{'png' if gop is None else f'video_g{gop}'}_{episodes}x{length}"
        root = write_dataset(Path(args.workdir) / folder, gop, episodes, length)
        results["rows"][name] = measure(root, args.chunk, args.image_size, samples)
        print(name, json.dumps(results["rows"][name]), flush=True)
    results["machine"] = {
        "cpus": os.cpu_count(),
        "processor": platform.processor(),
        "torch": torch.__version__,
    }
    results["command"] = "python benchmarks/bench_data.py" + (" --quick" if args.quick else "")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(
        f"\n{HEIGHT}x{WIDTH} camera, {DIM}-D actions, chunk {args.chunk}, {args.image_size} px tall; frames/s"
    )
    columns = {
        "lerobot item + chunk (before)": "lerobot_item_with_chunk",
        "lerobot item": "lerobot_item",
        "dvla uncached": "dvla_uncached",
        "dvla cache, 1 process": "dvla_cache_one_process",
        "dvla cache fill (workers)": "dvla_cache_fill_with_workers",
    }
    print("\n| dataset | " + " | ".join(columns) + " | cache speed-up | uncached speed-up |")
    print("| --- |" + " ---: |" * (len(columns) + 2))
    for name, r in results["rows"].items():
        values = " | ".join(f"{r[key]:.1f}" for key in columns.values())
        print(f"| {name} | {values} | {r['cache_speedup']:.0f}x | {r['uncached_speedup']:.0f}x |")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
