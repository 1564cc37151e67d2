"""Fast offscreen camera rendering for MuJoCo models (one GL context per process)."""

from __future__ import annotations

import mujoco
import numpy as np

# lerobot's MetaWorld env moves `corner2` here and flips its image on both axes; we do the same so
# images match `lerobot/metaworld_mt50` and `lerobot-eval`.
CORNER2_POS = (0.75, 0.075, 0.7)
FLIPPED_CAMERAS = frozenset({"corner2"})


class CameraRenderer:
    """Renders named cameras of one model to uint8 (H, W, 3) arrays.

    MetaWorld's XML asks for a 4096 px shadow map, which costs ~60 ms a frame on a CPU (Mesa).
    `shadow_size=0` turns shadows off (~17 ms a frame at 128 px); a small map (e.g. 512) keeps soft
    shadows for a few ms more.
    """

    def __init__(
        self,
        model: mujoco.MjModel,
        cameras: list[str],
        height: int,
        width: int,
        shadow_size: int = 0,
    ):
        known = [model.camera(i).name for i in range(model.ncam)]
        unknown = [c for c in cameras if c not in known]
        if unknown:
            raise ValueError(f"unknown camera(s) {unknown}; this model has {known}")
        if height < 16 or width < 16:
            raise ValueError(f"image size {height}x{width} is too small (>= 16 px)")
        self.cameras = list(cameras)
        self.shadows = shadow_size > 0
        if self.shadows:
            model.vis.quality.shadowsize = shadow_size
        model.vis.global_.offwidth = max(model.vis.global_.offwidth, width)
        model.vis.global_.offheight = max(model.vis.global_.offheight, height)
        self._renderer = mujoco.Renderer(model, height, width)

    def render(self, data: mujoco.MjData) -> dict[str, np.ndarray]:
        """Render every camera: {name: uint8 (H, W, 3)}."""
        images = {}
        for camera in self.cameras:
            self._renderer.update_scene(data, camera=camera)
            self._renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = self.shadows
            image = self._renderer.render()
            if camera in FLIPPED_CAMERAS:
                image = np.ascontiguousarray(np.flip(image, (0, 1)))
            images[camera] = image
        return images

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
