"""The adapter registry: configs in YAML, one test module per adapter, registry order, hooks only
where an adapter applies, namespaced metrics, and a new adapter as one module plus its registration."""

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import draccus
import pytest
import torch
from tiny_models import TEXT, batch, questions, tiny_vla
from torch import nn

from dvla.adapters import ADAPTERS, HOOKS, REGISTERED, AdaptersConfig, register_adapter
from dvla.adapters.base import Adapter, Applies, Slot, adapters_config_class
from dvla.adapters.referent_pointers import ReferentPointersConfig
from dvla.adapters.relation_token import RelationTokenConfig
from dvla.adapters.text_film import TextFiLMConfig
from dvla.cli import config_error
from dvla.model import DiffusionVLA, DiffusionVLAConfig
from dvla.types import VQABatch


def test_every_adapter_is_registered_in_order_and_has_its_own_tests():
    assert list(ADAPTERS) == [name for name in REGISTERED if name in ADAPTERS]  # registry order
    modules = {entry.adapter.__module__ for entry in [*ADAPTERS.values(), *HOOKS.values()]}
    assert modules == {f"dvla.adapters.{name}" for name in REGISTERED}  # one module each
    here = Path(__file__).parent
    for name in REGISTERED:
        assert (here / f"test_{name}.py").exists(), f"adapter {name} has no tests/adapters/test_{name}.py"
    fields = [f.name for f in dataclasses.fields(AdaptersConfig)]
    assert fields == list(ADAPTERS) and AdaptersConfig().active() == {}


def test_typed_configs_in_yaml(tmp_path):
    """Slices are lists of [start, stop] pairs, weights real numbers; an unknown adapter is named."""
    path = tmp_path / "model.yaml"
    path.write_text(
        "adapters:\n"
        "  sim_state:\n    emphasis: [[36, 39, 40], [4, 7, 10]]\n    input: true\n"
        "  reading_offsets:\n    slices: [[36, 39]]\n"
        "  text_film: {}\n"
    )
    config = draccus.parse(DiffusionVLAConfig, config_path=str(path), args=[])
    adapters = config.adapters.active()
    assert list(adapters) == ["sim_state", "reading_offsets", "text_film"]  # registry order
    assert [list(e) for e in adapters["sim_state"].emphasis] == [[36, 39, 40.0], [4, 7, 10.0]]
    assert [list(s) for s in adapters["reading_offsets"].slices] == [[36, 39]]
    assert adapters["text_film"].queries == 0
    flags = ["--adapters.text_film", "{queries: 4}", "--adapters.sim_state.weight", "0.5"]
    parsed = draccus.parse(DiffusionVLAConfig, args=flags)
    assert parsed.adapters.text_film.queries == 4 and parsed.adapters.sim_state.weight == 0.5
    path.write_text("adapters:\n  keypoint_magic: {}\n")
    with pytest.raises(Exception, match="keypoint_magic"):
        draccus.parse(DiffusionVLAConfig, config_path=str(path), args=[])
    path.write_text("adapters:\n  reading_offsets:\n    slices: [[36, 38]]\n")
    with pytest.raises(Exception) as raised:
        draccus.parse(DiffusionVLAConfig, config_path=str(path), args=[])
    assert "must be a 3-D position" in str(config_error(raised.value))  # what `dvla` prints


def test_robot_observations_skip_the_question_adapters():
    """Question adapters (FiLM, relation token, referent pointers) act on questions only: a robot
    observation's prefix is that of the same model without them, and the action loss leaves them
    untouched, while a question still gets all three."""
    torch.manual_seed(0)
    adapters = {
        "text_film": TextFiLMConfig(),
        "relation_token": RelationTokenConfig(hidden=32),
        "referent_pointers": ReferentPointersConfig(),
    }
    both = tiny_vla(cameras=("scene",), adapters=adapters)
    for layer in (both.adapters["text_film"].to_scale_shift[-1], both.adapters["relation_token"].out[-1]):
        torch.nn.init.normal_(layer.weight, std=0.5)  # off the identity, so it would show
    plain = tiny_vla(cameras=("scene",))
    plain.load_state_dict(both.state_dict(), strict=False)  # all but the question adapters
    data = batch(cameras=("scene",))
    robot = data.observation
    torch.testing.assert_close(both.prefix_embeds(robot)[0], plain.prefix_embeds(robot)[0])
    loss, _ = both.compute_loss(data)
    loss.backward()
    for adapter in both.adapters.values():
        assert all(p.grad is None for p in adapter.parameters()), adapter.name
    assert both.vision.projector[0].weight.grad is not None
    question = questions(2)
    n = both.vision.tokens_per_camera
    assert both.prefix_embeds(question)[0].shape[1] == n + 1 + 3 + question.text_ids.shape[1]


def test_a_new_adapter_is_one_module_and_its_registration():
    """An adapter written here (a learned token after the state with an auxiliary loss) runs in the
    core without touching it: its token joins the prefix, its loss the total with its weight, its
    metric under its name."""

    @dataclass
    class BiasTokenConfig:
        weight: float = 0.5

    @register_adapter("bias_token", BiasTokenConfig)
    class BiasToken(Adapter):
        applies_to = Applies.ROBOT
        slot = Slot.AFTER_STATE

        def __init__(self, config, core):
            super().__init__(config, core)
            self.token = nn.Parameter(torch.ones(core.width))

        def prefix_tokens(self, inputs):
            return self.token.expand(inputs.obs.batch_size, 1, -1)  # (B, 1, d)

        def aux_loss(self, inputs):
            loss = self.token.square().mean()
            return loss, {"norm": float(loss.detach())}

    try:
        with_token = adapters_config_class()(bias_token=BiasTokenConfig())
        config = dataclasses.replace(tiny_vla().config, adapters=with_token)
        model = DiffusionVLA(config, TEXT)
        data = batch()
        embeds, _, _ = model.prefix_embeds(data.observation)
        assert embeds.shape[1] == 8 + 6 + 2 and torch.equal(embeds[:, -1], torch.ones(3, 64))
        gen = lambda: torch.Generator().manual_seed(1)  # noqa: E731
        loss, metrics = model.compute_loss(data, generator=gen())
        assert metrics["bias_token/norm"] == 1.0
        assert float(loss.detach()) == pytest.approx(metrics["action_loss"] + 0.5 * 1.0, rel=1e-5)
        assert model.prefix_embeds(questions(2, cameras=("a", "b")))[0].shape[1] == 8 + 6  # robot only
        _, answer_metrics = model.compute_vqa_loss(
            VQABatch(questions(2, cameras=("a", "b")), torch.tensor([[10, 2, 2], [11, 2, 2]]))
        )
        assert "bias_token/norm" not in answer_metrics
        with pytest.raises(ValueError, match="already registered"):
            register_adapter("bias_token", BiasTokenConfig)(BiasToken)
    finally:
        ADAPTERS.pop("bias_token")
