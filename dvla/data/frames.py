"""Camera frames of a LeRobot dataset, read at disk speed.

`LeRobotDataset.__getitem__` decodes every image and video feature of a row, and with
`delta_timestamps` on the action it also decodes the images of every row the chunk touches (a
32-step chunk of a 480x640 PNG dataset cost 2.7 s per sample). dvla reads the low-dimensional
columns once into memory (`dvla.data.table`) and the images here: only the chosen cameras, image
features straight from their parquet column, video features through lerobot's own decoder, a whole
window of an episode per call (one seek, then sequential decoding) when the frame cache fills.
"""

from __future__ import annotations

import numpy as np
import torch

from dvla.data.images import keep_aspect, resize_frames

WINDOW = 64  # frames per video decoding call when caching: one seek each


def camera_shape(feature: dict) -> tuple[int, int]:
    """(height, width) of a LeRobot image or video feature, from its axis names ((H, W, C) if none)."""
    shape, names = list(feature["shape"]), feature.get("names")
    if isinstance(names, list) and "height" in names and "width" in names:
        return int(shape[names.index("height")]), int(shape[names.index("width")])
    if len(shape) == 3 and shape[0] == 3 and shape[2] != 3:  # channels first
        return int(shape[1]), int(shape[2])
    return int(shape[0]), int(shape[1])


class FrameReader:
    """Rows of a (possibly episode-filtered) LeRobotDataset -> the chosen cameras' frames."""

    def __init__(self, dataset, cameras: dict[str, str], height: int | None, table, video_backend: str):
        """`height`: resize every camera to it, keeping its aspect ratio (None = the dataset's size)."""
        self.dataset, self.cameras, self.table = dataset, cameras, table
        self.video_backend = video_backend
        native = {name: camera_shape(dataset.meta.features[key]) for name, key in cameras.items()}
        self.shapes = native if height is None else {n: keep_aspect(s, height) for n, s in native.items()}
        video_keys = set(dataset.meta.video_keys)
        self.video = {name: key for name, key in cameras.items() if key in video_keys}
        self.image = image = {name: key for name, key in cameras.items() if key not in video_keys}
        # the image columns without lerobot's transform (which would decode every column of a row)
        self._images = (
            dataset.hf_dataset.select_columns(list(image.values())).with_format(None) if image else None
        )

    def frame(self, index: int) -> dict[str, torch.Tensor]:
        """One row: {camera: float (3, h, w) in [0, 1]}, the values lerobot gives, resized."""
        return {
            name: resize_frames(frames.float() / 255, self.shapes[name])[0]
            for name, frames in self._read(index, index + 1).items()
        }

    def window(self, start: int, stop: int) -> dict[str, torch.Tensor]:
        """Rows start..stop-1 of one episode: {camera: uint8 (n, 3, h, w)}, resized in uint8
        (within one level of the float path)."""
        frames = self._read(start, stop)
        return {name: resize_frames(x, self.shapes[name]) for name, x in frames.items()}

    def _read(self, start: int, stop: int) -> dict[str, torch.Tensor]:
        """{camera: uint8 (n, 3, H, W)} at the dataset's own size."""
        out = {}
        if self.image:
            rows = self._images[start:stop]
            for name, key in self.image.items():
                out[name] = torch.stack([_image_tensor(image) for image in rows[key]])
        if self.video:
            episode = int(self.table.episode_index[start])
            if int(self.table.episode_index[stop - 1]) != episode:
                raise ValueError(f"rows {start}..{stop - 1} span more than one episode")
            timestamps = self.table.timestamp[start:stop]
            for name, key in self.video.items():
                out[name] = self._decode(episode, key, timestamps)
        return out

    def _decode(self, episode: int, key: str, timestamps: np.ndarray) -> torch.Tensor:
        """uint8 (n, 3, H, W) frames of one episode's video at `timestamps` (seconds into the episode)."""
        from lerobot.datasets.video_utils import decode_video_frames

        meta = self.dataset.meta
        start = meta.episodes[episode][f"videos/{key}/from_timestamp"]  # the episode's place in its file
        path = self.dataset.root / meta.get_video_file_path(episode, key)
        return decode_video_frames(
            path,
            [float(start + t) for t in timestamps],
            self.dataset.tolerance_s,
            self.video_backend,
            return_uint8=True,
        )

    def windows(self, length: int = WINDOW) -> list[tuple[int, int]]:
        """(start, stop) row ranges inside one episode each, covering every row in order."""
        out = []
        for first, last in self.table.episode_ranges():
            out += [(s, min(s + length, last + 1)) for s in range(first, last + 1, length)]
        return out


def _image_tensor(image) -> torch.Tensor:
    """A decoded image cell (PIL image or array, H x W x 3) -> uint8 (3, H, W)."""
    array = np.asarray(image.convert("RGB") if hasattr(image, "convert") else image)
    return torch.from_numpy(array.copy()).permute(2, 0, 1)
