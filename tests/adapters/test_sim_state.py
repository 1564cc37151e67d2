"""The sim_state adapter: an auxiliary simulator-state target read off the image tokens or the
state token, its per-dimension emphasis, perception frames, and the reading as a prefix token."""

import pytest
import torch
from tiny_models import batch, tiny_vla

from dvla.adapters.base import fit_to_data
from dvla.adapters.sim_state import SimStateConfig, weighted_mse
from dvla.backbone.decoder import DecodeConfig
from dvla.model import DiffusionVLAConfig
from dvla.types import PerceptionFrames, fake_observation


def sim_vla(head="discrete", **options):
    return tiny_vla(head, adapters={"sim_state": SimStateConfig(**{"dim": 6, **options})})


def losses(model, data, seed=1):
    return model.compute_loss(data, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("head", ["discrete", "flow"])
def test_read_off_the_state_token(head):
    torch.manual_seed(0)
    model = sim_vla(head, weight=0.5, reads="state_token")
    adapter = model.adapters["sim_state"]
    data = batch()
    plain, plain_metrics = losses(model, data)
    assert not any(k.startswith("sim_state/") for k in plain_metrics)  # no target in the batch: no loss
    data.targets["sim_state"] = torch.rand(3, 6) * 2 - 1
    loss, metrics = losses(model, data)
    torch.testing.assert_close(
        float((loss - plain).detach()), 0.5 * metrics["sim_state/mse"], rtol=1e-4, atol=1e-6
    )
    assert metrics["action_loss"] == pytest.approx(float(plain.detach()), rel=1e-5)  # the head's loss alone
    # the error is read at the state token, not at a target token (whose state depends on the targets)
    others = torch.randn(3, 12, 64)  # (B, 12, d) any target block: the prefix never attends to it
    hidden, inputs = model.full_pass(data.observation, others, train=True)
    reference = torch.nn.functional.mse_loss(
        adapter.head(hidden[:, inputs.state_position]), data.targets["sim_state"]
    )
    assert metrics["sim_state/mse"] == pytest.approx(float(reference), rel=1e-4)
    (loss - plain).backward()  # the auxiliary error alone reaches the vision encoder through the state token
    conv = model.vision.backbone.conv1[0].weight
    assert conv.grad is not None and conv.grad.abs().sum() > 0
    model.eval()  # at inference the head reads the same state token from the prefix pass alone
    hidden, inputs = model.full_pass(data.observation, others, train=False)
    torch.testing.assert_close(
        adapter.predict(model, data.observation), adapter.head(hidden[:, inputs.state_position])
    )


@pytest.mark.parametrize("head", ["discrete", "flow"])
def test_read_off_the_image_tokens(head):
    """The default head reads the encoder's tokens directly: its error is a function of the images
    alone (not of the text, state or targets), and its gradient reaches the encoder."""
    torch.manual_seed(0)
    model = sim_vla(head, weight=0.5)
    adapter = model.adapters["sim_state"]
    data = batch()
    plain, _ = losses(model, data)
    data.targets["sim_state"] = torch.rand(3, 6) * 2 - 1
    loss, metrics = losses(model, data)
    torch.testing.assert_close(
        float((loss - plain).detach()), 0.5 * metrics["sim_state/mse"], rtol=1e-4, atol=1e-6
    )
    tokens = model.vision(data.observation.images, train=True)  # (B, 2 cameras * 4, d)
    reference = torch.nn.functional.mse_loss(adapter.head(tokens, ["a", "b"]), data.targets["sim_state"])
    assert metrics["sim_state/mse"] == pytest.approx(float(reference), rel=1e-4)
    (loss - plain).backward()
    conv = model.vision.backbone.conv1[0].weight
    assert conv.grad is not None and conv.grad.abs().sum() > 0
    model.eval()
    read = adapter.predict(model, data.observation)
    torch.testing.assert_close(read, adapter.head(model.vision(data.observation.images), ["a", "b"]))
    # a batch with one of the cameras (co-training) reads the other as zeros, not as misplaced tokens
    only_b = fake_observation(3, ["b"], 32, 6, 50, 5)
    grid = torch.zeros(3, 2, 4, model.vision.token_embed.shape[1])
    grid[:, 1] = adapter.head.norm(model.vision({"b": only_b.images["b"]}))
    torch.testing.assert_close(adapter.predict(model, only_b), adapter.head.readout(grid.flatten(1)))
    with pytest.raises(ValueError, match="hidden"):
        SimStateConfig(dim=6, reads="hidden")


def test_the_reading_is_a_prefix_token_the_action_loss_cannot_train():
    """With input: true the head's reading of the images joins the prefix after the robot state.
    It is detached: the action loss trains the projection, never the head (its own loss does)."""
    torch.manual_seed(0)
    model = sim_vla(input=True)
    adapter = model.adapters["sim_state"]
    data = batch()
    embeds, valid, _ = model.prefix_embeds(data.observation)  # 8 image + 6 text + state + reading
    assert embeds.shape[1] == valid.shape[1] == 8 + 6 + 2
    reading = adapter.predict(model, data.observation)  # (B, 6)
    torch.testing.assert_close(embeds[:, -1], adapter.input_proj(reading))
    loss, metrics = losses(model, data)
    assert "sim_state/mse" not in metrics  # the batch has no simulator state: action loss only
    loss.backward()
    assert adapter.head.readout.weight.grad is None
    assert adapter.input_proj[0].weight.grad.abs().sum() > 0
    # questions have no robot state and so no reading token; acting needs no simulator state
    question = fake_observation(3, ["a", "b"], 32, 6, 50, None)
    assert model.prefix_embeds(question)[0].shape[1] == 8 + 6
    model.eval()
    assert model.sample_actions(data.observation, DecodeConfig(steps=1))[0].shape == (3, 4, 3)
    # a held value replaces the live reading where it is not NaN
    held = torch.full((3, 6), float("nan"))
    held[:, 3:6] = 0.25
    reading = adapter.predict(model, data.observation)  # in eval mode now
    data.observation.adapter_inputs["sim_state"] = held
    embeds, _, _ = model.prefix_embeds(data.observation)
    torch.testing.assert_close(embeds[:, -1], adapter.input_proj(torch.where(held.isnan(), reading, held)))
    with pytest.raises(ValueError, match="reads: vision"):
        SimStateConfig(dim=6, input=True, reads="state_token")


def test_perception_frames_join_the_simulator_state_mean():
    """Scene frames (no actions) are read by the same head; one weighted mean covers both."""
    torch.manual_seed(0)
    model = sim_vla(emphasis=[(0, 2, 4.0)])
    adapter = model.adapters["sim_state"]
    data = batch()
    data.targets["sim_state"] = torch.rand(3, 6) * 2 - 1
    g = torch.Generator().manual_seed(2)
    frames = PerceptionFrames(
        {c: torch.rand(5, 3, 32, 32, generator=g) for c in ("a", "b")}, torch.rand(5, 6, generator=g) * 2 - 1
    )
    _, plain_metrics = losses(model, data)
    data.targets["sim_state_frames"] = frames
    _, metrics = losses(model, data)
    assert metrics["action_loss"] == pytest.approx(plain_metrics["action_loss"])  # no action target
    images = (data.observation.images, frames.images)
    read = torch.cat([adapter.head(model.vision(x, train=True), ["a", "b"]) for x in images])  # (3 + 5, 6)
    weights = torch.tensor([4.0, 4, 1, 1, 1, 1])
    reference = weighted_mse(read, torch.cat([data.targets["sim_state"], frames.sim_state]), weights)
    assert metrics["sim_state/mse"] == pytest.approx(float(reference), rel=1e-4)


def test_emphasis_weights_the_listed_dimensions():
    """An emphasis of [[2, 4, 10], [5, 6, 0]] multiplies the squared error of dimensions 2 and 3 by
    10 and of 5 by 0 before the mean; bad entries are refused."""
    torch.manual_seed(0)
    model = sim_vla(emphasis=[(2, 4, 10.0), (5, 6, 0.0)])
    data = batch()
    data.targets["sim_state"] = torch.rand(3, 6) * 2 - 1
    _, metrics = losses(model, data)
    tokens = model.vision(data.observation.images, train=True)  # (B, 2 cameras * 4, d)
    squared = (model.adapters["sim_state"].head(tokens, ["a", "b"]) - data.targets["sim_state"]).square()
    expected = (squared[:, :2].sum() + 10 * squared[:, 2:4].sum() + squared[:, 4].sum()) / 18
    assert metrics["sim_state/mse"] == pytest.approx(float(expected), rel=1e-4)
    assert not any("dim_weights" in k for k in model.state_dict())  # rebuilt from the config, not saved
    with pytest.raises(ValueError, match="start < stop"):
        SimStateConfig(emphasis=[(39, 36, 30.0)])
    with pytest.raises(ValueError, match="past the simulator state's 6 dimensions"):
        sim_vla(emphasis=[(4, 8, 2.0)])


def test_dim_comes_from_the_data():
    """`dvla train` fills in dim from the data; a mismatch or data without a simulator state is named."""
    configs = DiffusionVLAConfig().adapters
    configs.sim_state = SimStateConfig()
    assert fit_to_data(configs, {"sim_state_dim": 39}).sim_state.dim == 39
    with pytest.raises(ValueError, match="sim_state_key"):
        fit_to_data(configs, {"sim_state_dim": 0})
    configs.sim_state = SimStateConfig(dim=12)
    with pytest.raises(ValueError, match="39 dimensions"):
        fit_to_data(configs, {"sim_state_dim": 39})
    with pytest.raises(ValueError, match="dim is unset"):
        tiny_vla(adapters={"sim_state": SimStateConfig()})
