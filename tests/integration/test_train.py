"""`dvla train`: a short run, exact resume, checkpoint rotation and clear errors."""

import json

import numpy as np
import pytest
import torch

from dvla.action_head import DiscreteHeadConfig
from dvla.adapters import AdaptersConfig
from dvla.adapters.sim_state import SimStateConfig
from dvla.checkpoint import checkpoint_info, load_checkpoint
from dvla.data import LeRobotChunks, LeRobotDataConfig
from dvla.data.mixing import ResumableBatchSampler
from dvla.model import BackboneSize, DiffusionVLAConfig
from dvla.training.config import OptimConfig, TrainConfig
from dvla.training.loop import checkpoint_dirs, lr_factor, train
from dvla.vision import VisionConfig


def tiny_train_config(root, output, steps, adapters=None, **overrides) -> TrainConfig:
    """`adapters` {name: config} turns adapters on, e.g. {"sim_state": SimStateConfig()}."""
    model = DiffusionVLAConfig(
        vision=VisionConfig(image_size=32, tokens_per_camera=2, cameras=["corner2", "gripperPOV"]),
        backbone=BackboneSize(32, 64, 1, 2),
        head=DiscreteHeadConfig(bins=16),
        adapters=AdaptersConfig(**(adapters or {})),
        chunk_size=4,
        text_vocab_size=200,
    )
    values = dict(
        dataset=LeRobotDataConfig(root=str(root), chunk_size=4, image_size=32),
        model=model,
        optim=OptimConfig(lr=1e-3, warmup_steps=1),
        output_dir=str(output),
        steps=steps,
        batch_size=4,
        save_every=2,
        keep_last=2,
        log_every=1,
        num_workers=0,
    )
    return TrainConfig(**{**values, **overrides})


def test_training_from_a_causal_lm_reads_text_with_its_tokenizer(tiny_dataset, tmp_path):
    """--model.backbone.init_from: the LM's weights and its own tokenizer (bins and [MASK] appended)."""
    import draccus
    from conftest import tiny_causal_lm
    from transformers import AutoTokenizer

    from dvla.backbone.tokenizer import train_text_tokenizer

    lm = tmp_path / "lm"
    torch.manual_seed(0)
    train_text_tokenizer(["pick the cube", "open the door"], vocab_size=64).save_pretrained(lm)
    source = tiny_causal_lm("llama")
    source.save_pretrained(lm)
    root, _ = tiny_dataset
    config = tiny_train_config(root, tmp_path / "run", steps=2)
    config.model.backbone = BackboneSize(init_from=str(lm))
    model, tokenizer, _ = load_checkpoint(train(config).checkpoint)
    assert model.text.vocab_size == 64 and model.mask_id == 64 + 16  # 16 action bins, then [MASK]
    assert model.backbone.config.hidden_size == 32 and len(model.backbone.model.layers) == 2  # the LM's
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(lm).get_vocab()
    args = ["--dataset.root", str(root), "--model.backbone.init_from", str(lm)]
    assert draccus.parse(config_class=TrainConfig, args=args).model.backbone.init_from == str(lm)


def test_resume_matches_an_uninterrupted_run(tiny_dataset, tmp_path):
    root, _ = tiny_dataset
    straight = train(tiny_train_config(root, tmp_path / "straight", steps=4))
    first = train(tiny_train_config(root, tmp_path / "resumed", steps=4, steps_this_run=2))  # "interrupted"
    assert first.step == 2
    resumed = train(tiny_train_config(root, tmp_path / "resumed", steps=4, resume=True))
    a, _, _ = load_checkpoint(straight.checkpoint)
    b, _, _ = load_checkpoint(resumed.checkpoint)
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    assert json.loads((resumed.checkpoint / "step.json").read_text()) == {"step": 4}
    assert [p.name for p in checkpoint_dirs(tmp_path / "resumed")] == ["step-00000002", "step-00000004"]
    assert (tmp_path / "resumed" / "train_config.yaml").exists()
    assert list((tmp_path / "resumed" / "logs").rglob("events.out.tfevents.*"))  # TensorBoard
    with pytest.raises(FileExistsError, match="--resume"):
        train(tiny_train_config(root, tmp_path / "resumed", steps=6))


def test_mismatched_dataset_and_model_fail_clearly(tiny_dataset, tmp_path):
    root, _ = tiny_dataset
    config = tiny_train_config(root, tmp_path / "x", steps=1)
    config.model.action_dim = 7
    with pytest.raises(ValueError, match="model.action_dim"):
        train(config)
    config = tiny_train_config(root, tmp_path / "y", steps=1)
    config.model.vision.cameras = ["corner2"]
    with pytest.raises(ValueError, match="model.vision.cameras"):
        train(config)


def test_sim_state_target_sizes_a_training_only_head(tiny_dataset, tmp_path):
    from dvla.policy import DiffusionVLAPolicy
    from dvla.processor import SIM_STATE_KEY

    root, _ = tiny_dataset
    dataset = LeRobotDataConfig(root=str(root), chunk_size=4, image_size=32, sim_state_key="sim.state")
    sim_state = {"sim_state": SimStateConfig()}
    result = train(tiny_train_config(root, tmp_path / "aux", steps=2, adapters=sim_state, dataset=dataset))
    model, tokenizer, stats = load_checkpoint(result.checkpoint)
    assert model.config.adapters.sim_state.dim == 39 and "sim_state" in model.adapters
    span = np.asarray(stats[SIM_STATE_KEY]["q99"]) - np.asarray(stats[SIM_STATE_KEY]["q01"])
    assert span.shape == (39,) and span.min() == pytest.approx(0.05)  # constant dims widened, not 1e-8
    # acting needs no simulator state
    policy = DiffusionVLAPolicy(model, tokenizer, stats)
    sample = LeRobotChunks(LeRobotDataConfig(root=str(root), chunk_size=4, image_size=32))[0]
    images = {name: image[None] for name, image in sample["images"].items()}
    assert policy.select_action(images, [sample["task"]], sample["state"][None]).shape == (1, 4)
    missing = LeRobotDataConfig(root=str(root), chunk_size=4, image_size=32, sim_state_key="sim.goal")
    with pytest.raises(ValueError, match="dataset.sim_state_key"):
        train(tiny_train_config(root, tmp_path / "bad", steps=1, adapters=sim_state, dataset=missing))
    wrong = {"sim_state": SimStateConfig(dim=5)}
    with pytest.raises(ValueError, match="has 39 dimensions"):
        train(tiny_train_config(root, tmp_path / "bad", steps=1, adapters=wrong, dataset=dataset))
    with pytest.raises(ValueError, match="turn it on"):  # a target without its adapter
        tiny_train_config(root, tmp_path / "bad", steps=1, dataset=dataset)
    with pytest.raises(
        ValueError, match="needs a simulator state in the data"
    ):  # an adapter without its target
        train(tiny_train_config(root, tmp_path / "bad", steps=1, adapters=sim_state))


def test_batch_order_depends_only_on_seed_and_position():
    full = ResumableBatchSampler(10, 3, seed=1)
    first = [b for _, b in zip(range(7), iter(full), strict=False)]
    later = [
        b for _, b in zip(range(3), iter(ResumableBatchSampler(10, 3, seed=1, start_batch=4)), strict=False)
    ]
    assert later == first[4:7]
    assert sorted(i for b in first[:3] for i in b) == sorted(
        set(i for b in first[:3] for i in b)
    )  # no repeats
    with pytest.raises(ValueError, match="fewer than batch_size"):
        ResumableBatchSampler(2, 3, 0)


def test_learning_rate_schedule():
    assert lr_factor(0, 10, 100, 0.1) == pytest.approx(0.1)
    assert lr_factor(9, 10, 100, 0.1) == pytest.approx(1.0)
    assert lr_factor(100, 10, 100, 0.1) == pytest.approx(0.1)


def test_two_process_ddp_on_cpu_keeps_ranks_identical(tiny_dataset, tmp_path):
    """torchrun with 2 CPU processes (gloo): gradients are synchronised, so every rank ends with the
    same parameters (train() checks a checksum across ranks and fails otherwise)."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    root, _ = tiny_dataset
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    launcher += ["--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "dvla.cli", "train"]
    options = {
        "dataset.root": root,
        "dataset.chunk_size": 4,
        "dataset.image_size": 32,
        "model.vision.cameras": "[corner2,gripperPOV]",
        "model.vision.image_size": 32,
        "model.vision.tokens_per_camera": 2,
        "model.backbone.hidden_size": 32,
        "model.backbone.intermediate_size": 64,
        "model.backbone.num_hidden_layers": 1,
        "model.backbone.num_attention_heads": 2,
        "model.chunk_size": 4,
        "model.head.bins": 16,
        "steps": 3,
        "batch_size": 2,
        "num_workers": 0,
        "tensorboard": "false",
        "output_dir": tmp_path / "ddp",
    }
    cmd = launcher + [f"--{key}={value}" for key, value in options.items()]
    # its own session, so that a hung rank is killed with the launcher instead of outliving the test
    pipe = subprocess.PIPE
    launch = subprocess.Popen(cmd, stdout=pipe, stderr=pipe, text=True, start_new_session=True)
    try:
        stdout, stderr = launch.communicate(timeout=300)  # ~15 s when healthy
    except subprocess.TimeoutExpired:
        os.killpg(launch.pid, signal.SIGKILL)
        stdout, stderr = launch.communicate()
        pytest.fail(f"2-rank training did not finish in 300 s:\n{stderr[-3000:]}")
    assert launch.returncode == 0, stderr[-3000:]
    assert "parameters identical across 2 processes" in stdout + stderr
    assert [p.name for p in checkpoint_dirs(tmp_path / "ddp")] == ["step-00000003"]


def test_a_config_file_with_several_cached_datasets_trains(tiny_dataset, tmp_path):
    import draccus

    root, _ = tiny_dataset
    config_file = tmp_path / "two.yaml"
    config_file.write_text(
        f"datasets:\n"
        f"  - {{root: {root}, chunk_size: 4, image_size: 32, episodes: [0, 1], cache_frames: true}}\n"
        f"  - {{root: {root}, chunk_size: 4, image_size: 32, episodes: [2, 3]}}\n"
    )
    config = draccus.parse(TrainConfig, config_path=str(config_file), args=[])
    assert len(config.robot_datasets) == 2 and config.dataset is None
    tiny = tiny_train_config(root, tmp_path / "run", steps=2, dataset=None, datasets=config.datasets)
    result = train(tiny)
    every_task = LeRobotChunks(LeRobotDataConfig(root=str(root))).tasks
    assert len(every_task) == 2 and sorted(checkpoint_info(result.checkpoint)["tasks"]) == sorted(every_task)
    with pytest.raises(ValueError, match="not both"):
        tiny_train_config(root, tmp_path / "x", steps=1, datasets=config.datasets)


def test_wandb_logs_the_run_in_offline_mode(tiny_dataset, tmp_path, monkeypatch):
    """--wandb true with wandb's offline mode: the run, its config and its loss are written locally."""
    import importlib.util

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    train(tiny_train_config(tiny_dataset[0], tmp_path / "w", steps=2, wandb=True, wandb_project="dvla-test"))
    runs = list((tmp_path / "wandb").glob("offline-run-*/*.wandb"))
    assert len(runs) == 1  # the run's log, for `wandb sync`: its records carry the config and the
    record = runs[0].read_bytes()  # logged values under their names (protobuf keeps strings as is)
    assert all(record.count(key) >= 2 for key in (b"loss", b"samples_s", b"batch_size", b"dvla-test"))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(ValueError, match="pip install wandb"):  # without the package: said up front
        tiny_train_config(tiny_dataset[0], tmp_path / "x", steps=1, wandb=True)


def test_the_weight_average_is_bias_corrected():
    """After k updates the average weighs update j by decay^(k-j) over their sum: the first weights
    fade like any other step's instead of keeping decay^k (a plain EMA's bias)."""
    from torch.optim.swa_utils import AveragedModel

    from dvla.training.ema import bias_corrected_ema

    decay, model = 0.9, torch.nn.Linear(3, 2)
    model.register_buffer("count", torch.zeros((), dtype=torch.long))
    ema = AveragedModel(model, multi_avg_fn=bias_corrected_ema(decay), use_buffers=True)
    seen = []
    for step in range(5):
        with torch.no_grad():
            model.weight.fill_(float(step + 1))
            model.count.fill_(step)
        seen.append(step + 1.0)
        ema.update_parameters(model)
    weights = torch.tensor([decay ** (len(seen) - 1 - j) for j in range(len(seen))])
    expected = float((weights * torch.tensor(seen)).sum() / weights.sum())
    torch.testing.assert_close(ema.module.weight, torch.full((2, 3), expected))
    assert int(ema.module.count) == 4  # integer buffers follow the model
    with pytest.raises(ValueError, match="ema_decay"):
        bias_corrected_ema(1.0)


def test_perception_frames_train_the_state_head_and_resume_exactly(tiny_dataset, tiny_scenes, tmp_path):
    """Scenes without an expert ride along each robot batch for the simulator-state target only."""
    root, _ = tiny_dataset
    dataset = LeRobotDataConfig(root=str(root), chunk_size=4, image_size=32, sim_state_key="sim.state")
    sim_state = {"sim_state": SimStateConfig()}
    scenes = LeRobotDataConfig(
        root=str(tiny_scenes[0]), chunk_size=4, image_size=32, sim_state_key="sim.state"
    )

    def config(output, **overrides):
        values = dict(
            steps=4, dataset=dataset, perception=scenes, perception_batch_size=3, adapters=sim_state
        )
        return tiny_train_config(root, output, **{**values, **overrides})

    straight = train(config(tmp_path / "straight"))
    assert checkpoint_info(straight.checkpoint)["perception"] == str(tiny_scenes[0])
    train(config(tmp_path / "resumed", steps_this_run=2))
    resumed = train(config(tmp_path / "resumed", resume=True))
    a, _, _ = load_checkpoint(straight.checkpoint)
    b, _, _ = load_checkpoint(resumed.checkpoint)
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    without = train(
        tiny_train_config(root, tmp_path / "without", steps=4, adapters=sim_state, dataset=dataset)
    )
    c, _, _ = load_checkpoint(without.checkpoint)
    heads = (a.adapters["sim_state"].head, c.adapters["sim_state"].head)
    assert not torch.equal(heads[0].readout.weight, heads[1].readout.weight)
    with pytest.raises(ValueError, match="dataset.sim_state_key"):
        tiny_train_config(root, tmp_path / "x", steps=1, perception=scenes)
    other = LeRobotDataConfig(root=str(tiny_scenes[0]), chunk_size=4, image_size=32, sim_state_key="sim.goal")
    with pytest.raises(ValueError, match="must be the robot data's"):
        tiny_train_config(
            root, tmp_path / "x", steps=1, adapters=sim_state, dataset=dataset, perception=other
        )
    one_camera = LeRobotDataConfig(
        root=str(tiny_scenes[0]), chunk_size=4, image_size=32, sim_state_key="sim.state",
        cameras={"corner2": "observation.images.corner2"},
    )  # fmt: skip
    with pytest.raises(ValueError, match="record the scenes with the same --cameras"):
        train(config(tmp_path / "cams", perception=one_camera))


def test_every_shipped_config_parses():
    """Each YAML under configs/ loads into its command's config (a typo or a renamed option fails
    here, not an hour into a user's run)."""
    import io
    from pathlib import Path

    import draccus

    from dvla.bench.config import BenchConfig
    from dvla.sim.command import CollectConfig

    files = sorted((Path(__file__).parents[2] / "configs").glob("*/*.yaml"))
    assert len(files) >= 20
    classes = {"collect": CollectConfig, "bench": BenchConfig}
    for path in files:
        config_class = classes.get(path.parent.name, TrainConfig)
        config = draccus.parse(config_class=config_class, args=[f"--config_path={path}"])
        assert config.root if config_class is CollectConfig else config.output_dir, path.name
        if config_class is TrainConfig:  # and dumps to YAML that loads back (train_config.yaml)
            assert draccus.load(TrainConfig, io.StringIO(draccus.dump(config))) == config, path.name
