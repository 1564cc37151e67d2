"""dvla.data: LeRobot datasets and VQA scenes as training samples, their statistics, and the
resumable interleaving of robot and VQA batches."""

from dvla.data.images import collate, resize_image
from dvla.data.lerobot import LeRobotChunks, LeRobotDataConfig
from dvla.data.robot import ConcatChunks, dataset_name, robot_dataset
from dvla.data.vqa import VQAScenes, VQAScenesByImage, collate_by_image

__all__ = [
    "ConcatChunks",
    "LeRobotChunks",
    "LeRobotDataConfig",
    "VQAScenes",
    "VQAScenesByImage",
    "collate",
    "collate_by_image",
    "dataset_name",
    "resize_image",
    "robot_dataset",
]
