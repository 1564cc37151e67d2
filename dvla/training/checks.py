"""Checks that the data of a run fits its model, before the first step (each names the fix)."""

from __future__ import annotations

from dvla.data import dataset_name
from dvla.types import VQA_CAMERA
from dvla.vision.norm_stats import batch_norms


def note_shared_norm_stats(model, ratio: float, accelerator) -> None:
    """Co-training a batch-norm encoder without separate question statistics works but blends robot
    and VQA images' statistics at inference (docs/training.md, co-training); say so once."""
    vision = model.vision
    if 0 < ratio < 1 and vision.question_norm_stats is None and batch_norms(vision.backbone):
        accelerator.print(
            "note: robot and VQA images share batch-norm statistics; set "
            "--model.vision.question_norm_stats true to keep them apart (better robot success)"
        )


def check_fits(config, robot, vqa, model) -> None:
    """Cameras, dimensions and chunk size of the data must be the model's."""
    cams = model.config.vision.cameras
    expected = sorted([*(robot.cameras if robot else []), *([VQA_CAMERA] if vqa else [])])
    if sorted(cams) != expected:
        raise ValueError(
            f"the data's cameras {expected} differ from the model's {cams}: set --model.vision.cameras "
            f"(VQA scenes use the camera {VQA_CAMERA!r}) or --dataset.cameras"
        )
    if robot is None:
        return
    if robot.action_dim != model.config.action_dim or robot.state_dim != model.config.state_dim:
        raise ValueError(
            f"the dataset has state/action dims {robot.state_dim}/{robot.action_dim}, the model "
            f"{model.config.state_dim}/{model.config.action_dim}: set --model.state_dim/--model.action_dim"
        )
    sim_state = model.config.adapters.sim_state
    if sim_state is not None and robot.sim_state_dim != sim_state.dim:
        raise ValueError(
            f"the dataset's simulator state has {robot.sim_state_dim} dimensions, the sim_state adapter "
            f"{sim_state.dim}: resume with the dataset.sim_state_key the run started with"
        )
    chunk_size = config.robot_datasets[0].chunk_size
    if chunk_size != model.config.chunk_size:
        raise ValueError(f"dataset.chunk_size {chunk_size} != model.chunk_size {model.config.chunk_size}")


def check_perception_fits(config, robot, perception) -> None:
    """Perception frames must show the robot's cameras and carry the same simulator state."""
    if perception is None:
        return
    name = dataset_name(config.perception)
    if sorted(perception.cameras) != sorted(robot.cameras):
        raise ValueError(
            f"perception dataset {name} has cameras {sorted(perception.cameras)}, the robot data "
            f"{sorted(robot.cameras)}: record the scenes with the same --cameras, or map them with "
            "perception.cameras"
        )
    if perception.sim_state_dim != robot.sim_state_dim:
        raise ValueError(
            f"perception dataset {name} has a {perception.sim_state_dim}-D simulator state, the robot data "
            f"{robot.sim_state_dim}-D: record both with the same simulator"
        )
