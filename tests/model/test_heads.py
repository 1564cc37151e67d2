"""Action heads behind their registry: the discrete head's full-mask fraction and first-step loss,
the choice in YAML, and a third head as one new registered class."""

import draccus
import pytest
import torch
from tiny_models import batch, tiny_vla

from dvla.action_head import HEADS, DiscreteHeadConfig, HeadConfig, register_head
from dvla.action_head.flow import FlowHead
from dvla.model import DiffusionVLAConfig


def test_full_mask_fraction_hides_whole_chunks():
    """At fraction 1 every valid action token is hidden (t = 1, weight 1): the loss is then the plain
    cross-entropy of predicting the chunk from the observation alone, as one-step decoding does."""
    torch.manual_seed(0)
    model = tiny_vla(DiscreteHeadConfig(bins=32, full_mask_fraction=1.0))
    data = batch()
    loss, metrics = model.compute_loss(data, generator=torch.Generator().manual_seed(1))
    assert metrics["mask_fraction"] == 1.0
    head = model.head
    bins = head.tokens.encode(data.actions).flatten(1)  # (B, H*D)
    hidden = model.full_pass(data.observation, head.embed(torch.full_like(bins, 32)), train=True)[0]
    ce = torch.nn.functional.cross_entropy(
        head.vocab.bin_logits(hidden[:, -12:]).flatten(0, 1), bins.flatten(), reduction="none"
    )
    valid = (~data.actions_is_pad).repeat_interleave(3, dim=1).flatten()
    assert float(loss.detach()) == pytest.approx(float(ce[valid].mean()), rel=1e-4)
    partial = tiny_vla()
    assert partial.compute_loss(data, generator=torch.Generator().manual_seed(1))[1]["mask_fraction"] < 1
    with pytest.raises(ValueError, match="full_mask_fraction"):
        DiscreteHeadConfig(full_mask_fraction=1.5)


def test_first_step_nll_is_the_fully_hidden_loss_per_sample():
    """first_step_nll equals the training loss of samples drawn with the whole chunk hidden (t = 1)
    and depends on each sample's own inputs only."""
    torch.manual_seed(0)
    model = tiny_vla(DiscreteHeadConfig(bins=32, full_mask_fraction=1.0)).eval()
    data = batch(size=4)

    def first_step_nll():
        obs = data.observation
        hidden = lambda embeds: model.full_pass(obs, embeds, train=False)[0][:, -embeds.shape[1] :]  # noqa: E731
        return model.head.first_step_nll(hidden, data.actions, data.actions_is_pad)

    per_sample = first_step_nll()  # (B,)
    assert per_sample.shape == (4,) and (per_sample > 0).all()
    with torch.no_grad():
        loss, _ = model.compute_loss(data, generator=torch.Generator().manual_seed(0))
    valid = (~data.actions_is_pad).sum(1).float()  # the training loss averages over valid tokens
    assert float(loss) == pytest.approx(float((per_sample * valid).sum() / valid.sum()), rel=1e-4)
    data.observation.images = {c: img.flip(0) for c, img in data.observation.images.items()}
    assert first_step_nll()[0] != pytest.approx(float(per_sample[0]), abs=1e-6)


def test_the_head_is_a_typed_choice_in_yaml(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("head:\n  type: flow\n  integration_steps: 3\n")
    config = draccus.parse(DiffusionVLAConfig, config_path=str(path), args=[])
    assert config.head.type == "flow" and config.head.integration_steps == 3
    path.write_text("head:\n  type: diffusion\n")
    with pytest.raises(Exception, match="diffusion"):
        draccus.parse(DiffusionVLAConfig, config_path=str(path), args=[])


def test_a_third_head_is_one_registered_class():
    """A new head: a config registered as a choice and a module registered by the same name."""
    from dataclasses import dataclass

    @HeadConfig.register_subclass("flow_copy")
    @dataclass
    class FlowCopyConfig(type(tiny_vla("flow").config.head)):
        pass

    @register_head("flow_copy")
    class FlowCopy(FlowHead):
        pass

    try:
        torch.manual_seed(0)
        model = tiny_vla(FlowCopyConfig())
        assert isinstance(model.head, FlowCopy)
        loss, _ = model.compute_loss(batch())
        assert torch.isfinite(loss)
        with pytest.raises(ValueError, match="already registered"):
            register_head("flow_copy")(FlowCopy)
    finally:
        HEADS.pop("flow_copy")
        HeadConfig._choice_registry.pop("flow_copy", None)
