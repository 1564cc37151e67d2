"""Rollout videos: camera frames side by side with a caption band, written as H.264 mp4."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

CAPTION_HEIGHT = 36
MIN_HEIGHT = 256  # small renders are scaled up (nearest) so the caption stays legible


def compose_frame(images: dict[str, np.ndarray], lines: list[str]) -> np.ndarray:
    """{camera: (H, W, 3) uint8} -> (CAPTION_HEIGHT + H', sum W', 3) uint8 with `lines` written on top."""
    row = np.concatenate(list(images.values()), axis=1)  # (H, W * n_cameras, 3)
    scale = max(1, -(-MIN_HEIGHT // row.shape[0]))
    if scale > 1:
        row = row.repeat(scale, axis=0).repeat(scale, axis=1)
    height, width = row.shape[0] + CAPTION_HEIGHT, row.shape[1] + row.shape[1] % 2
    canvas = Image.new("RGB", (width, height + height % 2), (20, 20, 20))
    canvas.paste(Image.fromarray(row), (0, CAPTION_HEIGHT))
    draw = ImageDraw.Draw(canvas)
    font = ImageFont.load_default(size=13)
    for i, line in enumerate(lines[:2]):
        draw.text((6, 3 + 16 * i), line, fill=(235, 235, 235), font=font)
    return np.asarray(canvas)


def write_mp4(path: str | Path, frames: list[np.ndarray], fps: int) -> Path:
    """Encode (H, W, 3) uint8 frames (even H and W) to an H.264 mp4 playable in browsers."""
    import av

    if not frames:
        raise ValueError(f"no frames to write to {path}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.mp4")
    with av.open(str(tmp), mode="w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "23", "preset": "veryfast"}
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    tmp.rename(path)
    return path
