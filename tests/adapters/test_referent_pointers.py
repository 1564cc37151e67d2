"""The referent_pointers adapter: two question-pointed object tokens and their comparison."""

import math

import pytest
import torch
from tiny_models import questions, tiny_vla

from dvla.adapters.base import LossInputs
from dvla.adapters.referent_pointers import ReferentPointersConfig
from dvla.types import VQABatch
from dvla.vision import VisionConfig


def test_learns_to_point_at_and_place_the_named_objects():
    """Three more prefix tokens after the image tokens: the two tokens the question's pointers pick
    and their comparison. The referent targets alone teach the pointers to point at given cells and
    the places to match; questions without a pair (-1) add nothing; the comparison token is trained
    to read as the answer."""
    torch.manual_seed(0)
    model = tiny_vla(cameras=("scene",), adapters={"referent_pointers": ReferentPointersConfig()})
    adapter = model.adapters["referent_pointers"]
    obs = questions(4)
    embeds, _, inputs = model.prefix_embeds(obs)
    n = model.vision.tokens_per_camera
    assert adapter.grid == 2 and embeds.shape[1] == n + 3 + obs.text_ids.shape[1]
    assert model.data_targets() == {"referents": {"grid": 2}}
    found = inputs.found["referent_pointers"]
    assert (
        found.tokens.shape == (4, 3, 64)
        and found.logits.shape == (4, 2, n)
        and found.places.shape == (4, 2, 3)
    )
    torch.testing.assert_close(embeds[:, n : n + 3], found.tokens)
    cells = torch.tensor([[0, 3], [2, 1], [-1, -1], [1, 0]])
    places = torch.rand(4, 2, 3) * 2
    targets = torch.cat([cells[..., None].float(), places], -1)  # (B, 2, 4)
    targets[2, :, 1:] = float("nan")
    answers = torch.tensor([[10, 2, 2], [11, 12, 2], [10, 2, 2], [11, 2, 2]])
    none = torch.full((4, 2, 4), float("nan"))
    none[..., 0] = -1
    _, metrics = model.compute_vqa_loss(VQABatch(obs, answers, {"referents": none}))
    assert metrics["referent_pointers/pointer_ce"] == 0.0
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    batch = VQABatch(obs, answers, {"referents": targets})
    for _ in range(150):
        _, _, inputs = model.prefix_embeds(obs, train=True)
        loss, metrics = adapter.aux_loss(LossInputs(inputs, None, 0, batch, model))
        opt.zero_grad()
        loss.backward()
        opt.step()
    found = model.prefix_embeds(obs)[2].found["referent_pointers"]
    assert torch.equal(found.logits.argmax(-1)[[0, 1, 3]], cells[[0, 1, 3]])
    torch.testing.assert_close(found.places[[0, 1, 3]], places[[0, 1, 3]], atol=0.1, rtol=0)
    assert metrics["comparison_ce"] < 0.1 and not math.isnan(metrics["place_mse"])
    opt.zero_grad()
    loss, metrics = model.compute_vqa_loss(batch)
    loss.backward()
    assert {
        "referent_pointers/pointer_ce",
        "referent_pointers/place_mse",
        "referent_pointers/comparison_ce",
    } <= set(metrics)
    assert metrics["answer_loss"] < loss.item()
    assert adapter.compare[-1].weight.grad.abs().sum() > 0
    assert model.vision.backbone.conv1[0].weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="weight >= 0"):
        ReferentPointersConfig(weight=-1)
    with pytest.raises(ValueError, match="square grid"):
        tiny_vla(
            cameras=("scene",),
            adapters={"referent_pointers": ReferentPointersConfig()},
            vision=VisionConfig(image_size=32, tokens_per_camera=3, cameras=["scene"]),
        )
