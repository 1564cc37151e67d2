"""The text_film adapter: the question scales and shifts the image tokens (questions only)."""

import pytest
import torch
from tiny_models import questions, tiny_vla

from dvla.adapters.text_film import TextFiLMConfig
from dvla.types import Observation, VQABatch


def image_tokens(model, obs, n=4):
    return model.prefix_embeds(obs)[0][:, :n]  # (B, N, d)


def test_starts_as_the_identity_and_conditions_image_tokens_on_the_text():
    torch.manual_seed(0)
    plain = tiny_vla(cameras=("scene",))
    film = tiny_vla(cameras=("scene",), adapters={"text_film": TextFiLMConfig()})
    film.load_state_dict(plain.state_dict(), strict=False)  # all but the FiLM layers
    obs = questions(3)
    torch.testing.assert_close(film.prefix_embeds(obs)[0], plain.prefix_embeds(obs)[0])  # zero-initialised
    adapter = film.adapters["text_film"]
    torch.nn.init.normal_(adapter.to_scale_shift[-1].weight, std=0.5)
    conditioned = image_tokens(film, obs)
    other = Observation(obs.images, obs.text_ids.flip(0), obs.text_valid.flip(0))  # other questions
    assert not torch.allclose(image_tokens(film, other), conditioned)
    padded = obs.text_ids.clone()
    padded[~obs.text_valid] = 7  # what sits under the padding does not count
    torch.testing.assert_close(
        image_tokens(film, Observation(obs.images, padded, obs.text_valid)), conditioned
    )
    loss, _ = film.compute_vqa_loss(VQABatch(obs, torch.tensor([[10, 2, 2], [11, 12, 2], [13, 2, 2]])))
    loss.backward()
    assert adapter.to_scale_shift[0].weight.grad.abs().sum() > 0


def test_queries_see_word_order_and_ignore_padding():
    """The mean cannot tell two orders of the same words apart; attention queries over positioned
    embeddings can. Padding never counts, and the layer starts as the identity."""
    torch.manual_seed(0)
    obs = questions(2)
    swapped = obs.text_ids.clone()
    swapped[:, [0, 1]] = swapped[:, [1, 0]]  # the same words, two of them in the other order
    valid = torch.ones_like(obs.text_valid)
    for queries, order_matters in ((0, False), (3, True)):
        film = tiny_vla(cameras=("scene",), adapters={"text_film": TextFiLMConfig(queries)})
        identity = image_tokens(film, Observation(obs.images, obs.text_ids, valid))
        torch.testing.assert_close(identity, film.vision(obs.images))  # zero-initialised
        torch.nn.init.normal_(film.adapters["text_film"].to_scale_shift[-1].weight, std=0.5)
        tokens = image_tokens(film, Observation(obs.images, obs.text_ids, valid))
        reordered = image_tokens(film, Observation(obs.images, swapped, valid))
        assert torch.allclose(tokens, reordered, atol=1e-5) != order_matters
        padded = obs.text_ids.clone()
        padded[~obs.text_valid] = 7
        torch.testing.assert_close(
            image_tokens(film, Observation(obs.images, padded, obs.text_valid)), image_tokens(film, obs)
        )
    with pytest.raises(ValueError, match="queries"):
        TextFiLMConfig(queries=-1)
