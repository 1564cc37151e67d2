"""Options that cannot be honoured are refused with the limit, not run and misreported."""

import numpy as np
import pytest
import torch
from tiny_models import tiny_vla

from dvla.backbone.decoder import DecodeConfig
from dvla.backbone.tokenizer import train_text_tokenizer
from dvla.eval.rollout_config import RolloutConfig
from dvla.eval.vqa import load_image
from dvla.model import TextSpecials
from dvla.policy import DiffusionVLAPolicy, PolicyConfig

STATS = {
    "observation.state": {"q01": np.zeros(5), "q99": np.ones(5)},
    "action": {"q01": -np.ones(3), "q99": np.ones(3)},
}


@pytest.fixture(scope="module")
def tokenizer():
    return train_text_tokenizer(["open the door", "what color is the cube ?", "red"], vocab_size=50)


def test_decode_steps_beyond_the_tokens_to_fill_are_refused(tokenizer):
    model = tiny_vla(cameras=("a",), text=TextSpecials.from_tokenizer(tokenizer))  # chunks of 4 x 3 tokens
    DiffusionVLAPolicy(model, tokenizer, STATS, PolicyConfig(decode=DecodeConfig(steps=12)))
    with pytest.raises(ValueError, match="decode.steps 100000 > the 12 action tokens"):
        DiffusionVLAPolicy(model, tokenizer, STATS, PolicyConfig(decode=DecodeConfig(steps=100000)))
    answering = DiffusionVLAPolicy(model, tokenizer, STATS, PolicyConfig(answer_decode=DecodeConfig(steps=9)))
    assert answering.answer_decode.steps == 3  # the 3 answer tokens: at most one step each
    flow = tiny_vla("flow", cameras=("a",), text=TextSpecials.from_tokenizer(tokenizer))
    DiffusionVLAPolicy(
        flow, tokenizer, STATS, PolicyConfig(decode=DecodeConfig(steps=100))
    )  # flow ignores steps


def test_image_sizes_and_image_files_are_checked(tmp_path):
    with pytest.raises(ValueError, match="image_size must be >= 8"):
        RolloutConfig(checkpoint="x", image_size=0)
    text = tmp_path / "notes.txt"
    text.write_text("not an image")
    with pytest.raises(ValueError, match="notes.txt is not an image"):
        load_image(str(text))


def test_an_over_long_question_is_cut_with_a_warning(tokenizer):
    model = tiny_vla(cameras=("a",), text=TextSpecials.from_tokenizer(tokenizer), max_text_tokens=8)
    policy = DiffusionVLAPolicy(model, tokenizer, STATS)
    images = {"a": torch.zeros(1, 32, 32, 3, dtype=torch.uint8)}
    with pytest.warns(UserWarning, match="is cut to the model's max_text_tokens=8"):
        obs = policy.observation(images, ["what color is the cube ? " * 50], None)
    assert obs.text_ids.shape == (1, 8)
