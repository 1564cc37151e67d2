"""The relation_token adapter: one prefix token from every pair of image tokens and the question."""

import pytest
import torch
from tiny_models import questions, tiny_vla

from dvla.adapters.relation_token import RelationTokenConfig
from dvla.backbone.decoder import DecodeConfig
from dvla.types import VQABatch


def test_reads_pairs_of_image_tokens_with_the_question():
    """One more prefix token after the image tokens: it changes with the question's word order and
    with what the image tokens show (not where they sit), and its gradient reaches the encoder."""
    torch.manual_seed(0)
    model = tiny_vla(cameras=("scene",), adapters={"relation_token": RelationTokenConfig(hidden=32)})
    adapter = model.adapters["relation_token"]
    obs = questions(2)
    embeds, valid, _ = model.prefix_embeds(obs)
    n = model.vision.tokens_per_camera
    assert embeds.shape[1] == n + 1 + obs.text_ids.shape[1] and valid[:, : n + 1].all()
    text = model.backbone.embed(obs.text_ids)
    tokens = model.vision(obs.images)  # (B, N, d)
    relation = adapter(tokens, text, obs.text_valid)  # (B, 1, d)
    torch.testing.assert_close(embeds[:, n : n + 1], relation)
    swapped = text.clone()
    swapped[:, [0, 1]] = swapped[:, [1, 0]]
    assert not torch.allclose(adapter(tokens, swapped, obs.text_valid), relation)
    reordered = tokens[:, torch.randperm(n)]  # a mean over pairs, blind to token order
    assert torch.allclose(adapter(reordered, text, obs.text_valid), relation, atol=1e-5)
    shifted = tokens + torch.randn_like(tokens) * 0.1
    assert not torch.allclose(adapter(shifted, text, obs.text_valid), relation)
    loss, _ = model.compute_vqa_loss(VQABatch(obs, torch.tensor([[10, 2, 2], [11, 12, 2]])))
    loss.backward()
    assert adapter.pair[1].weight.grad.abs().sum() > 0
    assert model.vision.backbone.conv1[0].weight.grad.abs().sum() > 0
    assert model.eval().answer(obs, DecodeConfig(steps=2)).tokens.shape == (2, model.config.answer_tokens)
    with pytest.raises(ValueError, match="hidden >= 1"):
        RelationTokenConfig(hidden=0)
