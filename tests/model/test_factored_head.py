"""The factored head: several action dimensions per backbone token, each its own discrete variable."""

import pytest
import torch
from tiny_models import ACTION_DIM, CHUNK, batch, overfit, tiny_vla

from dvla.action_head import FactoredHeadConfig
from dvla.backbone.decoder import DecodeConfig


def factored(dims_per_token=None, levels=32):
    return FactoredHeadConfig(levels=levels, dims_per_token=dims_per_token)


@pytest.mark.parametrize(("dims_per_token", "tokens"), [(None, CHUNK), (1, CHUNK * ACTION_DIM), (3, CHUNK)])
def test_one_token_carries_several_dimensions(dims_per_token, tokens):
    torch.manual_seed(0)
    model = tiny_vla(factored(dims_per_token)).eval()
    assert model.head.target_length == tokens
    data = batch(size=2)
    target = model.head.training_target(data.actions, data.actions_is_pad)
    assert target.embeds.shape == (2, tokens, 64)
    actions, forwards = model.sample_actions(data.observation, DecodeConfig(steps=2))
    assert actions.shape == (2, CHUNK, ACTION_DIM) and actions.abs().max() <= 1 and forwards == 3
    vocab = model.backbone.config.vocab_size
    assert vocab == 50 + 1  # no action tokens in the backbone's vocabulary: text + [MASK]


def test_which_dimension_holds_a_value_matters():
    """A token is not a bag of values: swapping two dimensions' values changes its embedding."""
    torch.manual_seed(0)
    head = tiny_vla(factored()).head
    values = torch.tensor([[3, 7, 32] * CHUNK])  # the third dimension hidden (32 = levels)
    swapped = torch.tensor([[7, 3, 32] * CHUNK])
    assert not torch.allclose(head.embed(values), head.embed(swapped))


def test_prefix_cache_is_exact_for_the_factored_block():
    torch.manual_seed(0)
    model = tiny_vla(factored()).eval()
    obs = batch(size=2).observation
    values = torch.randint(0, 33, (2, CHUNK * ACTION_DIM))
    with torch.no_grad():
        prefix = model.encode_prefix(obs)
        cached = model.head.logits(model.target_hidden(prefix, model.head.embed(values)))
        full = model.full_pass(obs, model.head.embed(values), train=False)[0][:, -CHUNK:]
        torch.testing.assert_close(cached, model.head.logits(full), atol=1e-5, rtol=0)


def test_factored_model_overfits_four_chunks_to_within_one_bin():
    torch.manual_seed(0)
    model = tiny_vla(factored(), cameras=("a",))
    data = batch(cameras=("a",), size=4)
    data.actions_is_pad[:] = False
    overfit(model, data, 250, model.compute_loss)
    for steps in (1, 4):
        actions, _ = model.sample_actions(data.observation, DecodeConfig(steps=steps))
        assert ((actions - data.actions).abs() <= 2 / 32).all(), steps


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match=r"must divide the action dimension 3 \(e.g. \[1, 3\]\)"):
        tiny_vla(factored(dims_per_token=2))
    with pytest.raises(ValueError, match="levels"):
        FactoredHeadConfig(levels=1)
    head = tiny_vla(factored()).head
    with pytest.raises(ValueError, match="parallel only"):
        head.check_decode(DecodeConfig(autoregressive=True))
    with pytest.raises(ValueError, match="12 action values"):
        head.check_decode(DecodeConfig(steps=13))
