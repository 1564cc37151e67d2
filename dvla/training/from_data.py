"""What a new model takes from its training data: dimensions, cameras and image aspect ratio.

Settings left unset (None) are filled in; settings given are kept, and `checks.check_fits` then
refuses any that disagree with the data.
"""

from __future__ import annotations

from dataclasses import replace

from dvla.model.config import DiffusionVLAConfig
from dvla.types import VQA_CAMERA

QUESTIONS_ONLY_DIMS = 4


def fill_from_data(model: DiffusionVLAConfig, robot, vqa) -> tuple[DiffusionVLAConfig, list[str]]:
    """The model config with unset fields taken from the robot data (LeRobotChunks or ConcatChunks)
    and the VQA scenes, and a line per field filled."""
    filled, notes = {}, []
    for name in ("state_dim", "action_dim"):
        if getattr(model, name) is None:
            # a model trained on questions only never acts: it keeps MetaWorld's 4 (the former default)
            filled[name] = getattr(robot, name) if robot is not None else QUESTIONS_ONLY_DIMS
            notes.append(
                f"model.{name} = {filled[name]} ({'the dataset' if robot is not None else 'no robot data'})"
            )
    vision = model.vision
    if vision.cameras is None:
        cameras = [*(robot.cameras if robot is not None else []), *([VQA_CAMERA] if vqa is not None else [])]
        vision = replace(vision, cameras=cameras)
        notes.append(f"model.vision.cameras = {cameras}")
    if vision.image_width is None and robot is not None:
        shapes = {(h / w) for h, w in robot.image_shapes.values()}
        if len(shapes) == 1 and shapes != {1.0}:  # one shared, non-square aspect ratio: keep it
            h, w = next(iter(robot.image_shapes.values()))
            vision = replace(vision, image_width=round(vision.image_size * w / h))
            notes.append(f"model.vision.image_width = {vision.image_width} (the cameras' {h}x{w} aspect)")
    return replace(model, vision=vision, **filled), notes
