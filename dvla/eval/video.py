"""Rollout videos: camera frames side by side with a caption band, written as H.264 mp4; optionally
the planned chunk drawn over the frames (where the grippers are sent, `dvla rollout --show_plan`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

CAPTION_HEIGHT = 36
MIN_HEIGHT = 256  # small renders are scaled up (nearest) so the caption stays legible
NEAR, FAR = np.array([255, 235, 60]), np.array([230, 40, 40])  # a plan's next step .. its last, colours
DONE = (150, 150, 150)  # steps of the plan already executed


def compose_frame(
    images: dict[str, np.ndarray], lines: list[str], plans: dict[str, tuple[np.ndarray, int]] | None = None
) -> np.ndarray:
    """{camera: (H, W, 3) uint8} -> (CAPTION_HEIGHT + H', sum W', 3) uint8 with `lines` written on top.

    `plans` {camera: (pixels (K, P, 2), next)}: the path of each of P grippers over a planned chunk
    of K steps in that camera's pixels (NaN where not visible), of which steps before `next` have run;
    drawn grey where executed, then yellow (next step, a dot) to red (the chunk's last step)."""
    row = np.concatenate(list(images.values()), axis=1)  # (H, W * n_cameras, 3)
    scale = max(1, -(-MIN_HEIGHT // row.shape[0]))
    if scale > 1:
        row = row.repeat(scale, axis=0).repeat(scale, axis=1)
    height, width = row.shape[0] + CAPTION_HEIGHT, row.shape[1] + row.shape[1] % 2
    canvas = Image.new("RGB", (width, height + height % 2), (20, 20, 20))
    canvas.paste(Image.fromarray(row), (0, CAPTION_HEIGHT))
    draw = ImageDraw.Draw(canvas)
    left, width = 0, max(2, row.shape[0] // 160)  # lines of 2 px at 256-320 px, 3 at 480
    for camera, image in images.items():
        if plans and camera in plans:
            pixels, index = plans[camera]
            _draw_plan(draw, pixels * scale + [left * scale, CAPTION_HEIGHT], index, width)
        left += image.shape[1]
    font = ImageFont.load_default(size=13)
    for i, line in enumerate(lines[:2]):
        draw.text((6, 3 + 16 * i), line, fill=(235, 235, 235), font=font)
    return np.asarray(canvas)


def _draw_plan(draw: ImageDraw.ImageDraw, pixels: np.ndarray, index: int, width: int) -> None:
    """Each gripper's path (pixels (K, P, 2) on the canvas) in lines of `width` px, past steps grey,
    the rest by how far ahead they are."""
    k = len(pixels)
    for path in pixels.transpose(1, 0, 2):  # (K, 2) per gripper
        for i in range(k - 1):
            a, b = path[i], path[i + 1]
            if np.isnan(a).any() or np.isnan(b).any():
                continue
            colour = DONE if i + 1 <= index else _shade((i + 1 - index) / max(1, k - 1 - index))
            draw.line([tuple(a), tuple(b)], fill=colour, width=width)
        if index < k and not np.isnan(path[index]).any():
            x, y = path[index]
            r = 1.5 * width
            draw.ellipse([x - r, y - r, x + r, y + r], fill=tuple(NEAR))


def _shade(fraction: float) -> tuple[int, int, int]:
    return tuple(int(v) for v in NEAR + (FAR - NEAR) * min(max(fraction, 0.0), 1.0))


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
