"""ALOHA at tiny scale: `dvla collect --env aloha` -> `dvla train` -> `dvla rollout` (environment
taken from the checkpoint's robot type)."""

import json

import pytest
from test_train import tiny_train_config

from dvla.checkpoint import load_checkpoint
from dvla.cli import main
from dvla.data import LeRobotDataConfig
from dvla.training.loop import train


@pytest.fixture(scope="module")
def aloha_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("aloha") / "cube"
    args = ["collect", "--env", "aloha", "--tasks", "transfer_cube", "--episodes", "1"]
    assert main([*args, "--image_size", "48", "--root", str(root)]) == 0
    return root


def test_collected_dataset_has_the_hub_schema(aloha_dataset):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    dataset = LeRobotDataset("local/cube", root=aloha_dataset)
    meta = dataset.meta
    assert meta.robot_type == "aloha" and meta.fps == 50 and meta.total_episodes == 1
    assert meta.total_frames == 400  # recorded to the end, as the hub's scripted sets are
    assert meta.features["observation.images.top"]["shape"] == (48, 64, 3)  # 3:4 kept
    assert meta.features["observation.state"]["names"][6] == "left_gripper"
    assert meta.features["action"]["shape"] == (14,) and "sim.state" not in meta.features
    frame = dataset[399]
    assert frame["task"] == "Pick up the cube with the right arm and transfer it to the left arm."
    report = json.loads((aloha_dataset / "meta" / "dvla_collect_report.json").read_text())
    assert report["spec"]["env"] == "aloha"
    assert 0 < report["per_task"]["transfer_cube"]["expert_success_rate"] <= 1


def test_train_then_rollout_in_the_checkpoints_environment(aloha_dataset, tmp_path, capsys):
    config = tiny_train_config(aloha_dataset, tmp_path / "train", steps=2)
    config.model.vision.cameras = None  # dimensions, cameras and aspect ratio come from the data
    config.dataset = LeRobotDataConfig(root=str(aloha_dataset), chunk_size=4, image_size=32)
    checkpoint = train(config).checkpoint
    model, _, _ = load_checkpoint(checkpoint)
    assert (model.config.state_dim, model.config.action_dim) == (14, 14)
    assert model.config.vision.cameras == ["top"] and model.config.vision.shape == (32, 43)  # 3:4
    out = tmp_path / "rollout"
    args = ["rollout", "--checkpoint", str(checkpoint), "--tasks", "transfer_cube", "--episodes", "1"]
    args += ["--max_steps", "6", "--image_size", "48", "--videos_per_task", "1", "--output_dir", str(out)]
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["env"] == "aloha"  # from the checkpoint's robot type
    episode = report["per_task"]["transfer_cube"]
    assert episode["seeds"] == [1000] and episode["mean_length"] == 6 and len(episode["videos"]) == 1
    assert main([*args[:4], "reach-v3", *args[5:]]) != 0  # a MetaWorld task does not exist here
    assert "unknown ALOHA task(s) ['reach-v3']" in capsys.readouterr().err
