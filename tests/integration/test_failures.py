"""Runs fail loudly, never silently: non-finite data and training, damaged checkpoints, one run per
output folder. Each test reproduces the failure first, then asserts the clear error or the fallback."""

import json
import shutil
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file, save_file
from test_train import tiny_train_config

from dvla.checkpoint import TRAINING_STATE, load_checkpoint
from dvla.cli import main
from dvla.data import LeRobotChunks, LeRobotDataConfig
from dvla.locks import exclusive_output
from dvla.training.config import OptimConfig
from dvla.training.loop import checkpoint_dirs, train


def with_nan_states(source, target, episode=1, every=5):
    """A copy of a recorded dataset whose observation.state[0] is NaN on every 5th frame of one episode."""
    shutil.copytree(source, target)
    path = next((target / "data").rglob("*.parquet"))
    table = pq.read_table(path)
    states = table.column("observation.state").to_pylist()
    episodes, frames = table.column("episode_index").to_pylist(), table.column("frame_index").to_pylist()
    for row, (e, f) in enumerate(zip(episodes, frames, strict=True)):
        if e == episode and f % every == 0:
            states[row][0] = float("nan")
    column = pa.array(states, type=table.schema.field("observation.state").type)
    pq.write_table(
        table.set_column(table.schema.get_field_index("observation.state"), "observation.state", column), path
    )
    return target


def test_nan_in_the_state_is_named_or_its_episodes_dropped(tiny_dataset, tmp_path):
    root, _ = tiny_dataset
    bad = with_nan_states(root, tmp_path / "nan")
    config = LeRobotDataConfig(root=str(bad), chunk_size=4, image_size=32)
    with pytest.raises(
        ValueError, match=r"'observation.state' is NaN or inf at episode 1 frame 0, episode 1 frame 5"
    ):
        LeRobotChunks(config)
    with pytest.warns(UserWarning, match="dropped 1 episode"):
        data = LeRobotChunks(
            LeRobotDataConfig(root=str(bad), chunk_size=4, image_size=32, drop_nonfinite_episodes=True)
        )
    assert len(data) == len(
        LeRobotChunks(LeRobotDataConfig(root=str(root), episodes=[0, 2, 3], chunk_size=4))
    )
    assert all(torch.isfinite(torch.as_tensor(v)).all() for s in data.stats.values() for v in s.values())
    with pytest.raises(ValueError, match="drop_nonfinite_episodes"):  # `dvla train` stops before any step
        train(tiny_train_config(bad, tmp_path / "run", steps=2))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_nonfinite_steps_are_skipped_then_stop_training(tiny_dataset, tmp_path):
    """A learning rate that blows the weights up: the NaN steps leave the weights as they were, the
    run stops after max_nonfinite_steps in a row, and no checkpoint holds NaN weights."""
    root, _ = tiny_dataset
    config = tiny_train_config(root, tmp_path / "run", steps=6, optim=OptimConfig(lr=1e30, warmup_steps=1),
                               max_nonfinite_steps=2, tensorboard=False)  # fmt: skip
    with pytest.raises(RuntimeError, match="2 steps in a row; stopped without saving"):
        train(config)
    for checkpoint in checkpoint_dirs(tmp_path / "run"):
        load_checkpoint(checkpoint)  # refuses non-finite weights


def test_damaged_checkpoint_parts_are_named(tiny_dataset, tmp_path):
    root, _ = tiny_dataset
    result = train(tiny_train_config(root, tmp_path / "run", steps=2, tensorboard=False))
    good = result.checkpoint

    def damaged(name, change):
        copy = tmp_path / name
        shutil.copytree(good, copy)
        change(copy)
        return copy

    weights_file = "model.safetensors"
    cases = {
        "truncated": (
            lambda c: (c / weights_file).write_bytes((c / weights_file).read_bytes()[:100]),
            r"model.safetensors cannot be read",
        ),
        "empty": (lambda c: (c / weights_file).write_bytes(b""), r"model.safetensors cannot be read"),
        "no_tokenizer": (lambda c: shutil.rmtree(c / "tokenizer"), r"tokenizer is missing or incomplete"),
        "garbage_config": (
            lambda c: (c / "config.json").write_bytes(b"\xff\xfe garbage"),
            r"config.json is not valid JSON",
        ),
        "garbage_stats": (
            lambda c: (c / "stats.json").write_text("{not json"),
            r"stats.json is not valid JSON",
        ),
        "config_without_model": (
            lambda c: (c / "config.json").write_text('{"format_version": 2}'),
            r"config.json has no \['model'",
        ),
    }
    for name, (change, message) in cases.items():
        with pytest.raises((ValueError, FileNotFoundError), match=message):
            load_checkpoint(damaged(name, change))
    weights = load_file(good / "model.safetensors")
    weights["state_proj.0.weight"][0, 0] = float("nan")

    def nan_weights(c):
        save_file(weights, c / "model.safetensors")

    with pytest.raises(ValueError, match=r"state_proj.0.weight holds 1 NaN or inf value"):
        load_checkpoint(damaged("nan", nan_weights))
    assert main(["rollout", "--checkpoint", str(tmp_path / "truncated"), "--tasks", "reach-v3"]) == 1


def test_resume_falls_back_to_the_newest_intact_checkpoint(tiny_dataset, tmp_path, capsys):
    root, _ = tiny_dataset
    train(tiny_train_config(root, tmp_path / "run", steps=4, steps_this_run=4, tensorboard=False))
    last = checkpoint_dirs(tmp_path / "run")[-1]
    (last / TRAINING_STATE).write_bytes(b"\x80garbage")  # a torn write
    result = train(tiny_train_config(root, tmp_path / "run", steps=6, resume=True, tensorboard=False))
    assert result.step == 6
    assert (tmp_path / "run" / "checkpoints" / f"broken-{last.name}").exists()  # set aside, not deleted
    assert "is damaged" in capsys.readouterr().out


def test_one_run_per_output_folder(tiny_dataset, tmp_path):
    """A second run on a held folder is refused with the holder's PID; a crashed holder frees it."""
    holder = textwrap.dedent(f"""
        import sys, time
        from dvla.locks import exclusive_output
        with exclusive_output({str(tmp_path / "run")!r}, "dvla train"):
            print("held", flush=True)
            time.sleep(60)
    """)
    process = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "held"
        root, _ = tiny_dataset
        with pytest.raises(FileExistsError, match=rf"in use by `dvla train` \(PID {process.pid}"):
            train(tiny_train_config(root, tmp_path / "run", steps=1, tensorboard=False))
    finally:
        process.kill()  # as a crash would
        process.wait()
    with exclusive_output(tmp_path / "run", "test"):  # the kernel released the lock
        assert json.loads((tmp_path / "run" / ".dvla.lock").read_text())["command"] == "test"


def test_fsdp_is_refused_before_anything_is_written(tiny_dataset, tmp_path, monkeypatch):
    """`accelerate launch --use_fsdp` sets ACCELERATE_USE_FSDP; on a CPU accelerate would quietly run
    DDP instead, and dvla's EMA and checkpoints need whole parameters: a clear error, not a quiet run."""
    root, _ = tiny_dataset
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ValueError, match="FSDP is not supported.*without --use_fsdp"):
        train(tiny_train_config(root, tmp_path / "fsdp", steps=1))
    assert not checkpoint_dirs(tmp_path / "fsdp") and not (tmp_path / "fsdp" / "train_config.yaml").exists()
