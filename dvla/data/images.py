"""Images and batches: resizing and collating samples."""

from __future__ import annotations

import torch
import torch.nn.functional as F

Size = int | tuple[int, int] | None  # a square side, (height, width), or None = unchanged


def keep_aspect(shape: tuple[int, int], height: int) -> tuple[int, int]:
    """The (height, width) of an image of `shape` (H, W) resized to `height` with its aspect ratio."""
    h, w = shape
    return height, max(1, round(height * w / h))


def resize_image(image: torch.Tensor, size: Size) -> torch.Tensor:
    """(3, H, W) float -> (3, h, w); unchanged when size is None or already right."""
    return resize_frames(image[None], size)[0]


def resize_frames(frames: torch.Tensor, size: Size) -> torch.Tensor:
    """(n, 3, H, W) float in [0, 1] or uint8 -> (n, 3, h, w) for size (h, w) (an int: square),
    antialiased bilinear (torch's uint8 kernel is about 5x faster than float); unchanged when size
    is None or already right."""
    if size is None:
        return frames
    size = (size, size) if isinstance(size, int) else tuple(size)
    if frames.shape[-2:] == size:
        return frames
    resized = F.interpolate(frames, size=size, mode="bilinear", antialias=True)
    return resized if frames.dtype == torch.uint8 else resized.clamp(0, 1)


def collate(samples: list[dict]) -> dict:
    """Stack tensors (and dicts of tensors); keep strings as lists."""
    out = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        if isinstance(values[0], dict):
            out[key] = {k: torch.stack([v[k] for v in values]) for k in values[0]}
        elif isinstance(values[0], torch.Tensor):
            out[key] = torch.stack(values)
        else:
            out[key] = values
    return out
