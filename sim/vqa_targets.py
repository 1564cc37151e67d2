"""The scene map: what a VQA scene holds in each cell of an image grid, from its ground truth.

An auxiliary training target (the scene_map adapter, `model.adapters.scene_map`): each image token
of the scene camera
predicts which colours, shapes, sizes and colour-shape pairs have an object centred in its cell, so
the vision encoder learns to see objects before the backbone learns to answer about them. With
`positions: true` it also regresses where each such object is (image column, image row
and depth, in cell units), so spatial questions can tell apart objects closer than one cell.
"""

from __future__ import annotations

import numpy as np

from dvla.sim.vqa_questions import spatial_referents
from dvla.sim.vqa_scenes import CAMERA_FOVY, COLORS, SHAPES, SIZES, SceneObject, object_view

COLOR_NAMES, SIZE_NAMES = tuple(COLORS), tuple(SIZES)
# Channels per cell: one per colour, shape, size and colour-shape pair (8 + 3 + 2 + 24 = 37).
CHANNELS = (
    [f"color={c}" for c in COLOR_NAMES]
    + [f"shape={s}" for s in SHAPES]
    + [f"size={s}" for s in SIZE_NAMES]
    + [f"{c} {s}" for c in COLOR_NAMES for s in SHAPES]
)


# Position channels: (column, row, depth) of each colour-shape pair centred in the cell, NaN where
# the cell holds none. Column and row span the image, depth the table's range of viewing distances
# (metres along the camera axis), each scaled to [0, grid] so an error of 1 is one cell.
POSITION_AXES = ("column", "row", "depth")
POSITION_CHANNELS = [f"{c} {s} {axis}" for c in COLOR_NAMES for s in SHAPES for axis in POSITION_AXES]
DEPTH_RANGE = (0.8, 1.13)


def image_position(obj: SceneObject) -> tuple[float, float]:
    """Where the object's centre appears, as (column, row) fractions of the image in [0, 1]."""
    u, v, _ = object_view(obj)
    half = np.tan(np.deg2rad(CAMERA_FOVY) / 2)
    return 0.5 + u / (2 * half), 0.5 - v / (2 * half)


def object_cell(obj: SceneObject, grid: int) -> tuple[int, int]:
    """(row, column) of the grid cell the object's centre falls in."""
    col, row = image_position(obj)
    return min(max(int(row * grid), 0), grid - 1), min(max(int(col * grid), 0), grid - 1)


def object_place(obj: SceneObject, grid: int) -> np.ndarray:
    """(3,) the object's image column, image row and depth, each scaled to [0, grid] (cell units)."""
    col, row = image_position(obj)
    near, far = DEPTH_RANGE
    depth = (object_view(obj)[2] - near) / (far - near)
    return np.array([col, row, depth], dtype=np.float32) * grid


def referent_targets(question: str, objects: list[SceneObject], grid: int) -> np.ndarray:
    """(2, 4) for the first and second object a spatial question names: the token index of its
    cell (row-major) and its `object_place`; -1 and NaN for questions that name no pair. The
    target of the model's referent pointers."""
    out = np.full((2, 4), np.nan, dtype=np.float32)
    out[:, 0] = -1
    pair = spatial_referents(question, objects)
    for k, i in enumerate(pair or ()):
        row, col = object_cell(objects[i], grid)
        out[k, 0], out[k, 1:] = row * grid + col, object_place(objects[i], grid)
    return out


def scene_map(objects: list[SceneObject], grid: int) -> np.ndarray:
    """(grid * grid, len(CHANNELS) + len(POSITION_CHANNELS)): the multi-hot map, then the positions
    (NaN where absent); cells in row order like the encoder's tokens."""
    out = np.zeros((grid, grid, len(CHANNELS)), dtype=np.float32)
    positions = np.full((grid, grid, len(COLOR_NAMES) * len(SHAPES), len(POSITION_AXES)), np.nan, np.float32)
    n_colors, n_shapes = len(COLOR_NAMES), len(SHAPES)
    for obj in objects:
        i, j = object_cell(obj, grid)
        c, s, z = COLOR_NAMES.index(obj.color), SHAPES.index(obj.shape), SIZE_NAMES.index(obj.size)
        pair = n_colors + n_shapes + len(SIZE_NAMES) + c * n_shapes + s
        out[i, j, [c, n_colors + s, n_colors + n_shapes + z, pair]] = 1.0
        positions[i, j, c * n_shapes + s] = object_place(obj, grid)
    cells = grid * grid
    return np.concatenate([out.reshape(cells, -1), positions.reshape(cells, -1)], axis=1)
