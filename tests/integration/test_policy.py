"""The policy wrapper end to end on real data: LeRobot chunks and VQA scenes through the model."""

import numpy as np
import pytest
import torch
from tiny_models import tiny_vla

from dvla.backbone.decoder import DecodeConfig
from dvla.backbone.tokenizer import train_text_tokenizer
from dvla.data import LeRobotChunks, LeRobotDataConfig, VQAScenes, collate
from dvla.model import TextSpecials
from dvla.policy import DiffusionVLAPolicy, PolicyConfig
from dvla.processor import QuantileNormalizer, decode_answers, encode_answers, encode_text

STATS = {
    "observation.state": {"q01": np.zeros(5), "q99": np.ones(5)},
    "action": {"q01": -2 * np.ones(3), "q99": 2 * np.ones(3)},
}


@pytest.fixture(scope="module")
def tokenizer():
    return train_text_tokenizer(
        ["open the door", "what color is the cube ?", "red", "two", "yes"], vocab_size=50
    )


def test_text_and_answer_blocks(tokenizer):
    ids, valid = encode_text(tokenizer, ["open the door", "red"], max_tokens=16)
    n = len(tokenizer("open the door", add_special_tokens=False)["input_ids"])
    assert ids.shape == (2, n) and valid[0].all() and valid[1].sum() == 1
    assert (ids[1, 1:] == tokenizer.pad_token_id).all()
    cut, cut_valid = encode_text(tokenizer, ["open the door"], max_tokens=2)
    assert cut.shape == (1, 2) and cut_valid.all()
    answers = encode_answers(tokenizer, ["red", "two"], 3)
    for row, text in zip(answers, ["red", "two"], strict=True):
        n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        assert (
            n < 3 and (row[n:] == tokenizer.eos_token_id).all() and (row[:n] != tokenizer.eos_token_id).all()
        )
    assert decode_answers(tokenizer, answers) == ["red", "two"]
    with pytest.raises(ValueError, match="raise model.answer_tokens"):
        encode_answers(tokenizer, ["open the door"], 2)


def test_normalizer_round_trip_and_missing_stats():
    norm = QuantileNormalizer(STATS, "action")
    x = torch.tensor([[-2.0, 0.0, 1.0]])
    torch.testing.assert_close(norm.normalize(x), torch.tensor([[-1.0, 0.0, 0.5]]))
    torch.testing.assert_close(norm.unnormalize(norm.normalize(x)), x)
    with pytest.raises(KeyError, match="stats for 'observation.qpos'"):
        QuantileNormalizer(STATS, "observation.qpos")
    with pytest.raises(ValueError, match="dimensions"):
        norm.normalize(torch.zeros(1, 4))


def test_state_beyond_the_data_range_is_clipped_at_state_clip(tokenizer):
    far = torch.tensor([[-1.0, 0.5, 2.0]])  # q01..q99 is -2..2: in range, then three half-spans out
    torch.testing.assert_close(QuantileNormalizer(STATS, "action").normalize(far)[0, 2], torch.tensor(1.0))
    torch.testing.assert_close(
        QuantileNormalizer(STATS, "action", clip=3.0).normalize(far * 4)[0], torch.tensor([-2.0, 1.0, 3.0])
    )
    with pytest.raises(ValueError, match="clip must be >= 1"):
        QuantileNormalizer(STATS, "action", clip=0.5)
    model = tiny_vla(cameras=("a",), text=TextSpecials.from_tokenizer(tokenizer), state_clip=4.0)
    policy = DiffusionVLAPolicy(model, tokenizer, STATS)
    obs = policy.observation(
        {"a": torch.zeros(1, 32, 32, 3, dtype=torch.uint8)}, ["open the door"], 3 * torch.ones(1, 5)
    )
    torch.testing.assert_close(obs.state, torch.full((1, 5), 4.0))  # (3 - 0) / 1 * 2 - 1 = 5 -> 4


def test_policy_queues_actions_and_replans(tokenizer):
    torch.manual_seed(0)
    model = tiny_vla(cameras=("a",), text=TextSpecials.from_tokenizer(tokenizer))
    policy = DiffusionVLAPolicy(
        model, tokenizer, STATS, PolicyConfig(n_action_steps=3, decode=DecodeConfig(steps=2))
    )
    calls = []
    original = model.sample_actions
    model.sample_actions = lambda *a, **k: calls.append(1) or original(*a, **k)
    images = {"a": torch.randint(0, 255, (2, 32, 32, 3), dtype=torch.uint8)}  # camera frames
    state = torch.rand(2, 5)
    actions = [policy.select_action(images, ["open the door"] * 2, state) for _ in range(7)]
    assert all(a.shape == (2, 3) for a in actions)
    assert len(calls) == 3  # steps 0, 3 and 6 re-plan
    assert all((a.abs() <= 2 + 1e-5).all() for a in actions)  # back in robot units
    policy.reset()
    policy.select_action(images, ["open the door"] * 2, state)
    assert len(calls) == 4
    with pytest.raises(ValueError, match="n_action_steps"):
        DiffusionVLAPolicy(model, tokenizer, STATS, PolicyConfig(n_action_steps=5))


def test_policy_decodes_actions_in_one_step_and_answers_in_several(tokenizer):
    from dvla.eval.rollout_config import RolloutConfig

    torch.manual_seed(0)
    model = tiny_vla(cameras=("a",), text=TextSpecials.from_tokenizer(tokenizer))
    policy = DiffusionVLAPolicy(model, tokenizer, STATS)
    images = {"a": torch.randint(0, 255, (2, 32, 32, 3), dtype=torch.uint8)}
    policy.predict_action_chunk(images, ["open the door"] * 2, torch.rand(2, 5))
    assert policy.last_forwards == 2  # one denoising step + the prefix pass
    assert RolloutConfig(checkpoint="x").decode.steps == 1  # `dvla rollout` decodes the same way
    steps = []
    original = model.answer
    model.answer = lambda obs, decode, **k: steps.append(decode.steps) or original(obs, decode, **k)
    policy.answer(images, ["what color is the cube ?"] * 2)
    answer_steps = min(DecodeConfig().steps, model.config.answer_tokens)  # at most one per answer token
    assert steps == [answer_steps] and steps[0] > 1  # a multi-token answer keeps several


def test_training_batches_from_real_datasets(tiny_dataset, tmp_path, tokenizer):
    from dvla.sim.vqa_dataset import build_vqa_dataset

    root, _ = tiny_dataset
    data = LeRobotChunks(LeRobotDataConfig(root=str(root), chunk_size=4, image_size=32))
    build_vqa_dataset(tmp_path / "vqa", scenes=3, image_size=32)
    vqa = VQAScenes(tmp_path / "vqa", "train")
    texts = [*data.tasks, *vqa.data["question"], *vqa.data["answer"]]
    tok = train_text_tokenizer(texts, vocab_size=200)  # the tokenizer is trained on the data's text
    text = TextSpecials.from_tokenizer(tok)
    model = tiny_vla(cameras=("corner2", "gripperPOV"), state_dim=4, action_dim=4, text=text)
    stats = dict(data.stats)
    policy = DiffusionVLAPolicy(model, tok, stats)
    batch = policy.processor.action_batch(collate([data[0], data[len(data) - 1]]))
    loss, _ = model.compute_loss(batch)
    assert torch.isfinite(loss) and batch.actions.abs().max() <= 1

    vqa_model = tiny_vla(cameras=("scene",), state_dim=4, action_dim=4, text=text)
    vqa_policy = DiffusionVLAPolicy(
        vqa_model, tok, {**stats, "observation.state": STATS["observation.state"]}
    )
    vqa_batch = vqa_policy.processor.vqa_batch(collate([vqa[0], vqa[1]]))
    assert torch.isfinite(vqa_model.compute_vqa_loss(vqa_batch)[0])
    answers = vqa_policy.answer(vqa_batch.observation.images, ["what color is the cube ?"] * 2)
    assert len(answers) == 2 and all(isinstance(a, str) for a in answers)
