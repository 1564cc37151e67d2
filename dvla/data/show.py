"""`dvla show`: summarise a dataset written by `dvla collect` and save a preview image."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dvla.sim.recording import VIDEO_BACKEND


@dataclass
class ShowConfig:
    """Print a dataset's size, features and tasks; save one frame per episode start as a PNG grid."""

    # Dataset folder (a LeRobot dataset root, or a VQA scenes folder).
    root: str | None = None
    # Where to save the preview grid (default: <root>/preview.png).
    preview: str | None = None
    # At most this many tiles in the preview.
    max_tiles: int = 12

    def __post_init__(self):
        if not self.root:
            raise ValueError("--root is required")


def run(config: ShowConfig) -> None:
    root = Path(config.root)
    preview = Path(config.preview) if config.preview else root / "preview.png"
    if (root / "meta" / "info.json").exists():
        tiles = _show_lerobot(root, config.max_tiles)
    elif (root / "dataset_dict.json").exists():
        tiles = _show_vqa(root, config.max_tiles)
    else:
        raise FileNotFoundError(f"{root} is neither a LeRobot dataset (meta/info.json) nor a VQA dataset")
    save_grid(tiles, preview)
    print(f"preview: {preview}")


def _show_lerobot(root: Path, max_tiles: int) -> list[np.ndarray]:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset(repo_id=f"local/{root.name}", root=root, video_backend=VIDEO_BACKEND)
    meta = ds.meta
    print(
        f"LeRobot dataset {root}: {meta.total_episodes} episodes, {meta.total_frames} frames, {meta.fps} fps"
    )
    for key, spec in meta.features.items():
        print(f"  {key:<32} {spec['dtype']:<8} {tuple(spec['shape'])}")
    print("tasks:")
    for task in meta.tasks.index:
        print(f"  - {task}")
    tiles = []
    camera = meta.camera_keys[0]
    step = max(1, meta.total_episodes // max_tiles)
    for ep in range(0, meta.total_episodes, step)[:max_tiles]:
        frame = ds[int(meta.episodes[ep]["dataset_from_index"])]
        tiles.append((frame[camera].permute(1, 2, 0).numpy() * 255).astype(np.uint8))
    return tiles


def _show_vqa(root: Path, max_tiles: int) -> list[np.ndarray]:
    import datasets

    dd = datasets.load_from_disk(str(root))
    for split, ds in dd.items():
        print(f"  {split:<14} {len(ds)} questions")
    test = dd["test"]
    for row in test.select(range(min(5, len(test)))):
        print(f"  Q: {row['question']}  A: {row['answer']}  ({row['question_type']})")
    first_rows = {}
    for i, scene in enumerate(test["scene_id"]):  # one tile per scene (a scene has several questions)
        first_rows.setdefault(scene, i)
    rows = list(first_rows.values())[:max_tiles]
    return [np.asarray(test[i]["image"].convert("RGB")) for i in rows]


def save_grid(tiles: list[np.ndarray], path: Path, columns: int = 4) -> None:
    """Save uint8 (H, W, 3) tiles of one size as a PNG grid."""
    from PIL import Image

    if not tiles:
        raise ValueError("nothing to preview: the dataset is empty")
    h, w, _ = tiles[0].shape
    rows = (len(tiles) + columns - 1) // columns
    grid = np.zeros((rows * h, columns * w, 3), np.uint8)
    for i, tile in enumerate(tiles):
        r, c = divmod(i, columns)
        grid[r * h : (r + 1) * h, c * w : (c + 1) * w] = tile
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid).save(path)
