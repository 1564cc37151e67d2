"""The pipeline end to end at tiny scale: co-training, `dvla rollout`, `dvla vqa`, fine-tuning."""

import json
from dataclasses import replace

import av
import numpy as np
import pytest
import torch
from test_train import tiny_train_config

from dvla.action_head import DiscreteHeadConfig, FlowHeadConfig
from dvla.adapters import AdaptersConfig
from dvla.adapters.referent_pointers import ReferentPointersConfig
from dvla.adapters.relation_token import RelationTokenConfig
from dvla.adapters.scene_map import SceneMapConfig
from dvla.adapters.sim_state import SimStateConfig
from dvla.adapters.text_film import TextFiLMConfig
from dvla.checkpoint import checkpoint_info, export_raw_weights, load_checkpoint
from dvla.cli import main
from dvla.data import LeRobotDataConfig, VQAScenes
from dvla.data.mixing import ROBOT, VQA, source_of, vqa_batches_before
from dvla.eval.rollout import HOLD_SECONDS
from dvla.model import BackboneSize, DiffusionVLA, DiffusionVLAConfig
from dvla.policy import DiffusionVLAPolicy
from dvla.sim.vqa_targets import CHANNELS
from dvla.training.config import VQADataConfig
from dvla.training.finetune import finetune_config, transfer_weights
from dvla.training.loop import train
from dvla.vision import VisionConfig


@pytest.fixture(scope="module")
def tiny_vqa(tmp_path_factory):
    from dvla.sim.vqa_dataset import build_vqa_dataset

    root = tmp_path_factory.mktemp("vqa") / "scenes"
    build_vqa_dataset(root, scenes=6, image_size=32)
    return root


@pytest.fixture(scope="module")
def cotrained(tiny_dataset, tiny_vqa, tmp_path_factory):
    """A tiny checkpoint co-trained on robot chunks and VQA scenes (every other batch), with the
    VQA questions grouped by image and the auxiliary scene map."""
    root, _ = tiny_dataset
    # VQA batches of 2 scenes with all their questions (and 2 more spatial ones each), the scene-map
    # target with positions on a 2 x 2 grid, order-aware FiLM, the relation token and the referent
    # pointers with their target
    adapters = {
        "scene_map": SceneMapConfig(1.0, positions=True),
        "text_film": TextFiLMConfig(queries=2),
        "relation_token": RelationTokenConfig(hidden=32),
        "referent_pointers": ReferentPointersConfig(hidden=32),
    }
    config = tiny_train_config(
        root,
        tmp_path_factory.mktemp("train") / "cotrain",
        steps=4,
        adapters=adapters,
        vqa=VQADataConfig(
            root=str(tiny_vqa), ratio=0.5, image_size=32, images_per_batch=2, extra_spatial_questions=2
        ),
        tensorboard=False,
    )
    config.model.vision.cameras = ["corner2", "gripperPOV", "scene"]
    config.model.vision.tokens_per_camera = 4
    return train(config).checkpoint


def test_a_questions_only_run_takes_its_camera_from_the_scenes(tiny_vqa, tmp_path):
    config = tiny_train_config(
        tiny_vqa, tmp_path / "vqa_only", steps=1, dataset=None,
        vqa=VQADataConfig(root=str(tiny_vqa), image_size=32), tensorboard=False,
    )  # fmt: skip
    config.model.vision.cameras = None
    model, _, _ = load_checkpoint(train(config).checkpoint)
    assert model.config.vision.cameras == ["scene"]
    assert (model.config.state_dim, model.config.action_dim) == (4, 4)  # never used: it only answers


def test_vqa_data_config_errors():
    with pytest.raises(ValueError, match="needs vqa.images_per_batch"):
        VQADataConfig(root="x", extra_spatial_questions=2)
    with pytest.raises(ValueError, match="images_per_batch must be >= 1"):
        VQADataConfig(root="x", images_per_batch=0)


def test_mixing_pattern_is_fixed_and_resumable():
    assert [source_of(g, 0.25) for g in range(8)] == [ROBOT] * 3 + [VQA] + [ROBOT] * 3 + [VQA]
    assert [source_of(g, 0.5) for g in range(4)] == [ROBOT, VQA, ROBOT, VQA]
    assert vqa_batches_before(8, 0.25) == 2  # a run resumed at micro-batch 8 has drawn 2 VQA batches


def test_cotrained_checkpoint_acts_and_answers(cotrained, tiny_vqa):
    info = checkpoint_info(cotrained)
    model = load_checkpoint(cotrained)[0]
    adapters = model.config.adapters
    assert adapters.scene_map.weight == 1.0 and model.adapters["scene_map"].grid == 2
    assert adapters.scene_map.channels == len(CHANNELS) and adapters.scene_map.positions  # fitted to the data
    assert adapters.text_film.queries == 2 and model.adapters["referent_pointers"].grid == 2
    assert list(adapters.active()) == ["scene_map", "text_film", "relation_token", "referent_pointers"]
    assert sorted(info["tasks"]) == ["Open a door with a revolving joint", "Reach a goal position"]
    assert info["vqa"] == str(tiny_vqa)
    policy = DiffusionVLAPolicy.from_pretrained(cotrained)
    images = {c: torch.zeros(1, 32, 32, 3, dtype=torch.uint8) for c in ("corner2", "gripperPOV")}
    chunk = policy.predict_action_chunk(images, ["Reach a goal position"], torch.zeros(1, 4))
    assert chunk.shape == (1, 4, 4) and torch.isfinite(chunk).all()
    sample = VQAScenes(tiny_vqa, "test")[0]
    answers = policy.answer({"scene": sample["images"]["scene"][None]}, [sample["question"]])
    assert len(answers) == 1 and isinstance(answers[0], str)
    with pytest.raises(ValueError, match="missing camera"):
        policy.predict_action_chunk(
            {"corner2": images["corner2"]}, ["Reach a goal position"], torch.zeros(1, 4)
        )


def test_rollout_writes_a_report_and_videos(cotrained, tmp_path):
    out = tmp_path / "rollout"
    args = ["rollout", "--checkpoint", str(cotrained), "--tasks", "reach-v3,door-open-v3"]
    args += ["--episodes", "2", "--max_steps", "6", "--workers", "2", "--videos_per_task", "1"]
    args += ["--n_action_steps", "2", "--decode.steps", "2", "--image_size", "32", "--output_dir", str(out)]
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    assert set(report["per_task"]) == {"reach-v3", "door-open-v3"}
    for task in report["per_task"].values():
        assert task["episodes"] == 2 and task["seeds"] == [1000, 1001]
        low, high = task["wilson95"]
        assert 0 <= low <= task["success_rate"] <= high <= 1
        assert 1 <= task["mean_length"] <= 6
        assert len(task["videos"]) == 1
    assert report["decode"]["forwards_per_chunk"] == 3  # 2 denoising steps + the prefix pass
    assert report["pooled"]["episodes"] == 4
    video = report["per_task"]["reach-v3"]["videos"][0]
    with av.open(video) as container:
        frames = sum(1 for _ in container.decode(video=0))
    fps = checkpoint_info(cotrained)["fps"]
    first_episode = 1 + 6  # reset frame + at most 6 steps (fewer on early success), then the hold
    assert 2 + int(HOLD_SECONDS * fps) <= frames <= first_episode + int(HOLD_SECONDS * fps)
    assert "reach-v3" in (out / "report.md").read_text()


def test_interrupted_rollout_resumes_without_rerunning_finished_episodes(
    cotrained, tmp_path, monkeypatch, capsys
):
    from dvla.sim.env_pool import EnvPool

    out = tmp_path / "rollout"
    args = ["rollout", "--checkpoint", str(cotrained), "--tasks", "reach-v3", "--episodes", "3"]
    args += ["--max_steps", "4", "--workers", "1", "--videos_per_task", "0", "--n_action_steps", "2"]
    args += ["--decode.steps", "2", "--image_size", "32", "--output_dir", str(out)]
    real_step = EnvPool.step

    def step_until_one_episode_is_saved(self, actions):
        if (out / "partial.json").exists():
            raise KeyboardInterrupt  # as if the user pressed Ctrl-C
        return real_step(self, actions)

    monkeypatch.setattr(EnvPool, "step", step_until_one_episode_is_saved)
    with pytest.raises(KeyboardInterrupt):
        main(args)
    monkeypatch.setattr(EnvPool, "step", real_step)
    saved = json.loads((out / "partial.json").read_text())
    assert [e["seed"] for e in saved["episodes"]["reach-v3"]] == [1000]
    assert saved["pending_episodes"] == 2
    assert not (out / "report.json").exists()

    capsys.readouterr()
    assert main(args) == 1  # without --resume the partial rollout is not overwritten
    assert "pass --resume" in capsys.readouterr().err
    assert main([*args, "--resume", "--decode.steps", "4"]) == 1
    assert "settings differ (decode" in capsys.readouterr().err
    other_task = [a if a != "reach-v3" else "door-open-v3" for a in args]
    assert main([*other_task, "--resume"]) == 1  # would drop the saved reach-v3 episode
    assert "does not ask for" in capsys.readouterr().err

    real_reset, seeds_run = EnvPool.reset, []

    def reset_and_record(self, episodes):
        seeds_run.extend(seed for _, seed in episodes.values())
        return real_reset(self, episodes)

    monkeypatch.setattr(EnvPool, "reset", reset_and_record)
    assert main([*args, "--resume"]) == 0
    assert seeds_run == [1001, 1002]  # only the missing episodes ran
    report = json.loads((out / "report.json").read_text())
    task = report["per_task"]["reach-v3"]
    assert task["episodes"] == 3 and task["seeds"] == [1000, 1001, 1002]
    first = saved["episodes"]["reach-v3"][0]
    assert (1000 in task["successful_seeds"]) == first["success"]
    assert not (out / "partial.json").exists()


def test_rollout_errors_are_clear(cotrained, tmp_path, capsys):
    assert main(["rollout", "--checkpoint", str(tmp_path / "nothing"), "--tasks", "reach-v3"]) == 1
    assert "not a dvla checkpoint" in capsys.readouterr().err
    assert main(["rollout", "--checkpoint", str(cotrained), "--tasks", "pick-place-v3"]) == 1
    assert "not trained on ['pick-place-v3']" in capsys.readouterr().err


def test_vqa_command_scores_a_split_and_shows_steps(cotrained, tiny_vqa, tmp_path, capsys):
    out = tmp_path / "vqa"
    args = ["vqa", "--checkpoint", str(cotrained), "--dataset", str(tiny_vqa), "--split", "test"]
    assert main([*args, "--batch_size", "4", "--output_dir", str(out)]) == 0
    report = json.loads((out / "vqa_test.json").read_text())
    assert report["questions"] == len(VQAScenes(tiny_vqa, "test"))
    assert sum(t["questions"] for t in report["per_type"].values()) == report["questions"]
    assert 0 <= report["exact_match"] <= 1
    capsys.readouterr()
    from dvla.backbone.decoder import DecodeConfig
    from dvla.eval.vqa import load_vqa_policy

    policy = load_vqa_policy(str(cotrained), DecodeConfig(steps=2))  # what --decode.steps 2 builds
    assert policy.config.answer_decode.steps == 2  # answers follow --decode; actions keep 1 step
    assert policy.config.decode.steps == 1

    from PIL import Image

    sample = VQAScenes(tiny_vqa, "test")[0]
    image = tmp_path / "scene.png"
    pixels = (sample["images"]["scene"].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    Image.fromarray(pixels).save(image)
    ask = ["vqa", "--checkpoint", str(cotrained), "--image", str(image), "--question", sample["question"]]
    assert main([*ask, "--show_steps", "--decode.steps", "2", "--output_dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "step 1:" in printed and "step 2:" in printed and "A:" in printed
    assert (out / "answer_steps.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([*ask[:3], "--image", str(tmp_path / "missing.png"), "--question", "how many?"]) == 1
    assert "no image file" in capsys.readouterr().err


def test_vqa_answers_a_file_of_questions_in_batches(cotrained, tiny_vqa, tmp_path, capsys):
    from PIL import Image

    from dvla.backbone.decoder import DecodeConfig
    from dvla.eval.vqa import load_image, load_vqa_policy

    scenes = VQAScenes(tiny_vqa, "test")
    lines = []
    for i in range(3):
        sample = scenes[i]
        pixels = (sample["images"]["scene"].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        image = Image.fromarray(pixels)
        if i == 2:  # another size: answered in its own forward
            image = image.resize((image.width * 2, image.height * 2))
        image.save(tmp_path / f"{i}.png")
        lines.append(json.dumps({"id": f"q{i}", "image": f"{i}.png", "question": sample["question"]}))
    questions = tmp_path / "questions.jsonl"
    questions.write_text("\n".join(lines) + "\n\n")  # a blank line is skipped
    ask = ["vqa", "--checkpoint", str(cotrained), "--questions", str(questions), "--mixed_precision", "no"]
    assert main([*ask, "--batch_size", "2"]) == 0
    answered = [json.loads(line) for line in (tmp_path / "questions.answers.jsonl").read_text().splitlines()]
    assert [a["id"] for a in answered] == ["q0", "q1", "q2"] and answered[0]["image"] == "0.png"
    policy = load_vqa_policy(str(cotrained), DecodeConfig())
    one_by_one = [
        policy.answer({"scene": load_image(str(tmp_path / f"{i}.png"))}, [answered[i]["question"]])[0]
        for i in range(3)
    ]
    assert [a["answer"] for a in answered] == one_by_one  # batching changes no answer
    capsys.readouterr()
    assert main(ask) == 1  # answers are never overwritten silently
    assert "--overwrite" in capsys.readouterr().err
    questions.write_text(lines[0] + "\n" + '{"image": "0.png"}\n')
    assert main([*ask, "--overwrite"]) == 1
    assert "line 2: needs" in capsys.readouterr().err
    (tmp_path / "broken.png").write_bytes(b"not an image")
    questions.write_text(lines[0] + "\n" + json.dumps({"image": "broken.png", "question": "how many?"}))
    assert main([*ask, "--overwrite"]) == 1  # checked before the model loads: nothing is lost later
    assert "line 2: " in capsys.readouterr().err
    given = json.loads(lines[0]) | {"answer": "the truth"}
    questions.write_text(json.dumps(given) + "\n")
    assert main([*ask, "--overwrite"]) == 0  # a given answer is kept; the model's is "predicted"
    (record,) = [json.loads(x) for x in (tmp_path / "questions.answers.jsonl").read_text().splitlines()]
    assert record["answer"] == "the truth" and record["predicted"] == answered[0]["answer"]


def _synthetic_dataset(root, action_dim=3, state_dim=6, episodes=2, length=10):
    """A LeRobot dataset of another robot: one 32 px camera 'front', 6-D state, 3-D actions."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {
        "observation.images.front": {
            "dtype": "image",
            "shape": (32, 32, 3),
            "names": ["height", "width", "channels"],
        },
        "observation.state": {"dtype": "float32", "shape": (state_dim,), "names": None},
        "action": {"dtype": "float32", "shape": (action_dim,), "names": None},
    }
    data = LeRobotDataset.create("local/other", fps=10, features=features, root=root, use_videos=False)
    rng = np.random.default_rng(0)
    for _ in range(episodes):
        for _ in range(length):
            data.add_frame(
                {
                    "observation.images.front": rng.integers(0, 255, (32, 32, 3), dtype=np.uint8),
                    "observation.state": rng.standard_normal(state_dim).astype(np.float32),
                    "action": rng.uniform(-1, 1, action_dim).astype(np.float32),
                    "task": "push the block",
                }
            )
        data.save_episode()
    data.finalize()
    return root


def test_finetune_to_another_robot(cotrained, tmp_path):
    root = _synthetic_dataset(tmp_path / "other")
    source, _, _ = load_checkpoint(cotrained)
    config = tiny_train_config(root, tmp_path / "ft", steps=2, init_from=str(cotrained), tensorboard=False)
    config.dataset = LeRobotDataConfig(root=str(root), chunk_size=4)
    config.model.action_dim, config.model.state_dim = 3, 6
    config.model.vision.cameras = ["front"]
    config.ema_decay = 0.5

    target = DiffusionVLA(finetune_config(source.config, config.model), source.text, source.backbone.config)
    report = transfer_weights(source, target)
    assert "state_proj.0.weight" in report.reinitialised and "head.dim_embed.weight" in report.reinitialised
    assert "vision.camera_embed.weight[front]" in report.reinitialised
    assert torch.equal(
        target.backbone.model.layers[0].mlp.up_proj.weight, source.backbone.model.layers[0].mlp.up_proj.weight
    )
    assert report.kept_parameters / report.total_parameters > 0.9

    result = train(config)
    model, _, stats = load_checkpoint(result.checkpoint)
    assert model.config.action_dim == 3 and model.config.vision.cameras == ["front"]
    assert stats["action"]["q01"].shape == (3,)
    state = torch.load(result.checkpoint / "training_state.pt", weights_only=True)
    raw = state["raw_model"]["state_proj.0.weight"]
    assert not torch.equal(raw, model.state_dict()["state_proj.0.weight"])  # the checkpoint holds the EMA
    raw_copy = export_raw_weights(result.checkpoint, tmp_path / "raw")  # the raw weights as a checkpoint
    unaveraged, _, raw_stats = load_checkpoint(raw_copy)
    assert torch.equal(unaveraged.state_dict()["state_proj.0.weight"], raw)
    assert checkpoint_info(raw_copy) == checkpoint_info(result.checkpoint)
    assert np.array_equal(raw_stats["action"]["q01"], stats["action"]["q01"])
    with pytest.raises(FileNotFoundError, match="training_state.pt"):
        export_raw_weights(raw_copy, tmp_path / "again")
    assert main(["rollout", "--checkpoint", str(result.checkpoint), "--tasks", "reach-v3"]) == 1


def test_finetune_takes_the_adapters_and_head_training_settings_from_the_new_run():
    """Adapters are copied generically (whatever is registered): the new run's set replaces the
    checkpoint's; the head keeps the checkpoint's architecture (bins) with the new run's
    training settings (its RUN_FIELDS); backbone and vision model stay the checkpoint's."""
    old = DiffusionVLAConfig(  # a checkpoint's: filled from its data
        vision=VisionConfig(cameras=["corner2"]),
        action_dim=4,
        state_dim=4,
        backbone=BackboneSize(64, 128, 2, 4),
        head=DiscreteHeadConfig(bins=64),
        adapters=AdaptersConfig(
            sim_state=SimStateConfig(dim=39, emphasis=[(36, 39, 40.0)]), text_film=TextFiLMConfig()
        ),
    )
    new = DiffusionVLAConfig(
        head=DiscreteHeadConfig(bins=256, full_mask_fraction=0.5),
        adapters=AdaptersConfig(
            sim_state=SimStateConfig(dim=6, weight=2.0, emphasis=[(0, 3, 5.0)], input=True),
            scene_map=SceneMapConfig(0.5, channels=37, position_channels=72),
        ),
    )
    merged = finetune_config(old, new)
    assert merged.adapters == new.adapters  # text_film off, scene_map on, the reading token learnt anew
    assert merged.head == DiscreteHeadConfig(bins=64, full_mask_fraction=0.5)
    assert merged.backbone == old.backbone
    flow = replace(new, head=FlowHeadConfig(integration_steps=3))
    assert finetune_config(old, flow).head == old.head  # another kind of head: the checkpoint's


def test_resume_refuses_other_model_settings(cotrained, tiny_dataset, tmp_path):
    root, _ = tiny_dataset
    first = tiny_train_config(root, tmp_path / "run", steps=2, steps_this_run=1, tensorboard=False)
    train(first)
    changed = tiny_train_config(root, tmp_path / "run", steps=2, resume=True, tensorboard=False)
    changed.model.chunk_size = 8
    with pytest.raises(ValueError, match="--model settings differ"):
        train(changed)
