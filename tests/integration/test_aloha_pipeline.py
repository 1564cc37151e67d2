"""ALOHA at tiny scale: `dvla collect --env aloha` -> `dvla train` -> `dvla rollout` and `dvla bench`
against ACT (environment taken from the checkpoint's robot type)."""

import json

import pytest
from test_train import tiny_train_config

from dvla.action_head import FactoredHeadConfig
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


@pytest.fixture(scope="module")
def aloha_checkpoint(aloha_dataset, tmp_path_factory):
    config = tiny_train_config(aloha_dataset, tmp_path_factory.mktemp("aloha_train"), steps=2)
    config.model.vision.cameras = None  # dimensions, cameras and aspect ratio come from the data
    config.dataset = LeRobotDataConfig(root=str(aloha_dataset), chunk_size=4, image_size=32)
    config.model.head = FactoredHeadConfig(levels=32)  # one token per step, as the ALOHA config
    return train(config).checkpoint


def test_train_then_rollout_in_the_checkpoints_environment(aloha_checkpoint, tmp_path, capsys):
    checkpoint = aloha_checkpoint
    model, _, _ = load_checkpoint(checkpoint)
    assert (model.config.state_dim, model.config.action_dim) == (14, 14)
    assert model.config.vision.cameras == ["top"] and model.config.vision.shape == (32, 43)  # 3:4
    out = tmp_path / "rollout"
    args = ["rollout", "--checkpoint", str(checkpoint), "--tasks", "transfer_cube", "--episodes", "1"]
    args += ["--max_steps", "6", "--image_size", "48", "--videos_per_task", "1", "--output_dir", str(out)]
    # the next chunk continues the one that runs during a simulated delay of 1 step, within joint limits
    execution = ["--n_action_steps", "3", "--execution.mode", "inpaint", "--execution.inference_delay", "1"]
    shown = ["--decode.steps", "2", "--show_denoising", "2", "--show_plan"]  # figures of two chunks, plans
    assert main([*args, *execution, *shown, "--action_bounds", "env"]) == 0
    figures = sorted((out / "denoising").glob("*.png"))
    assert [f.name for f in figures] == ["transfer_cube_ep000_chunk00.png", "transfer_cube_ep000_chunk01.png"]
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in figures)
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["env"] == "aloha"  # from the checkpoint's robot type
    assert report["execution"]["mode"] == "inpaint" and report["execution"]["action_bounds"] == "env"
    jerk = report["execution"]["jerk"]  # chunks 0 and 1 run 3 steps each: within and across a switch
    assert (
        jerk["within"] >= 0
        and jerk["switch"] >= 0
        and "jerk across chunk switches" in (out / "report.md").read_text()
    )
    episode = report["per_task"]["transfer_cube"]
    assert episode["seeds"] == [1000] and episode["mean_length"] == 6 and len(episode["videos"]) == 1
    assert _has_plan_overlay(episode["videos"][0])  # the grippers' planned paths, in yellow to red
    assert main([*args[:4], "reach-v3", *args[5:]]) != 0  # a MetaWorld task does not exist here
    assert "unknown ALOHA task(s) ['reach-v3']" in capsys.readouterr().err


def test_bench_against_act_with_its_own_chunking(aloha_dataset, aloha_checkpoint, tmp_path):
    out = tmp_path / "bench"
    args = ["bench", "--checkpoint", str(aloha_checkpoint), "--quick", "--workers", "1"]
    args += ["--sections", "[decode,peers,latency]", "--peers.policies", "[act]"]
    args += ["--peers.chunk_size", "8", "--peers.n_action_steps", "8"]
    args += ["--peers.dataset_root", str(aloha_dataset), "--output_dir", str(out)]
    assert main(args) == 0
    results = json.loads((out / "bench.json").read_text())
    assert results["run"]["env"] == "aloha" and results["run"]["tasks"] == ["transfer_cube"]
    (peer,) = results["peers"]["rows"]
    assert peer["policy"] == "act" and peer["episodes"] == 1
    assert "--policy.chunk_size=8" in peer["command"] and "--policy.n_action_steps=8" in peer["command"]
    rollout = json.loads((out / "rollouts" / "act_transfer_cube" / "report.json").read_text())
    assert rollout["config"]["env"] == "aloha" and rollout["per_task"]["transfer_cube"]["mean_length"] == 16
    latency = {r["name"]: r for r in results["latency"]["rows"]}
    assert latency["act"]["forwards"] == 1 and latency["act"]["n_action_steps"] == 8  # 14-D, 48x64 images
    # the factored head has no left-to-right mode: one value per forward (4 x 14 = 56) is the baseline
    assert results["latency"]["sequential"] == "dvla discrete, 56 steps"
    assert (
        latency["dvla discrete, 56 steps"]["forwards"] == 57
        and "dvla discrete, autoregressive" not in latency
    )
    sweep = {r["name"]: r for r in results["decode"]["rows"]}
    assert set(sweep) == {"dvla discrete, 1 step", "dvla discrete, 4 steps", "dvla discrete, 56 steps"}
    assert sweep["dvla discrete, 1 step"]["forwards"] == 2 and sweep["dvla discrete, 1 step"]["episodes"] == 1
    (speedup,) = [t for t in results["targets"] if "AR decoding" in t["target"]]
    assert "one value per forward" in speedup["value"]


def test_closed_loop_benchmark_compares_execution_modes(aloha_checkpoint, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_closed_loop.py"
    out = tmp_path / "closed_loop"
    args = ["--checkpoint", str(aloha_checkpoint), "--tasks", "transfer_cube", "--episodes", "1"]
    args += ["--max_steps", "6", "--delays", "1", "--workers", "1", "--out", str(out)]
    result = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {r["setting"]: r for r in json.loads((out / "closed_loop.json").read_text())["rows"]}
    assert set(rows) == {"receding, no delay", "naive async, d=1", "inpaint, d=1", "temporal ensemble, d=1",
                         "receding, no delay, bounds env"}  # fmt: skip
    assert rows["temporal ensemble, d=1"]["chunks_per_episode"] == 6  # a chunk every step
    assert rows["receding, no delay"]["chunks_per_episode"] == 3  # chunk 4, 2 executed per chunk
    assert rows["inpaint, d=1"]["forwards_per_chunk"] <= rows["receding, no delay"]["forwards_per_chunk"]
    assert rows["receding, no delay"]["paired_vs_baseline"]["episodes"] == 1
    assert "| inpaint, d=1 |" in result.stdout


def _has_plan_overlay(video: str) -> bool:
    """Whether a frame after the first shows the plan's yellow dot (the scene has no yellow)."""
    import av

    with av.open(video) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    yellow = [((f[..., 0] > 200) & (f[..., 1] > 180) & (f[..., 2] < 120)).sum() for f in frames]
    return yellow[0] == 0 and yellow[2] > 10
