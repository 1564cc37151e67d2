"""The scene_map adapter: each scene-camera token predicts what its grid cell holds (VQA batches)."""

import pytest
import torch
from tiny_models import questions, tiny_vla

from dvla.adapters.base import fit_to_data
from dvla.adapters.scene_map import SceneMapConfig
from dvla.model import DiffusionVLAConfig
from dvla.types import Observation, VQABatch
from dvla.vision import VisionConfig

ANSWERS = torch.tensor([[10, 2, 2], [11, 12, 2], [13, 2, 2]])


def map_vla(weight=0.5, positions=False, cameras=("a", "scene"), **overrides):
    config = SceneMapConfig(weight, positions, channels=37, position_channels=72)
    return tiny_vla(cameras=cameras, adapters={"scene_map": config}, **overrides)


def test_read_off_the_scene_tokens():
    """Each image token predicts its own cell of the map; the error adds to the answer loss with
    its weight and its gradient reaches the encoder. Robot cameras absent from a VQA batch are fine."""
    torch.manual_seed(0)
    model = map_vla()
    adapter = model.adapters["scene_map"]
    assert adapter.grid == 2 and model.data_targets() == {"scene_map": {"grid": 2}}  # 4 tokens per camera
    obs = questions(3)
    gen = lambda: torch.Generator().manual_seed(1)  # noqa: E731
    plain, _ = model.compute_vqa_loss(VQABatch(obs, ANSWERS), generator=gen())
    target = (torch.rand(3, 4, 37) < 0.1).float()  # (B, G*G, C)
    loss, metrics = model.compute_vqa_loss(VQABatch(obs, ANSWERS, {"scene_map": target}), generator=gen())
    assert metrics["answer_loss"] == pytest.approx(float(plain.detach()), rel=1e-5)
    torch.testing.assert_close(
        float((loss - plain).detach()), 0.5 * metrics["scene_map/bce"], rtol=1e-4, atol=1e-6
    )
    tokens = model.vision(obs.images)  # (B, 4, d): the scene camera only
    reference = torch.nn.functional.binary_cross_entropy_with_logits(adapter.head(tokens), target)
    assert metrics["scene_map/bce"] == pytest.approx(float(reference), rel=1e-4)
    (loss - plain).backward()
    assert model.vision.backbone.conv1[0].weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="square grid"):
        map_vla(
            vision=VisionConfig(image_size=32, tokens_per_camera=8, cameras=["scene"]), cameras=("scene",)
        )
    with pytest.raises(ValueError, match="weight must be > 0"):
        SceneMapConfig(weight=0.0)


def test_positions_regress_where_the_objects_are():
    """With positions the head also outputs the position channels; their squared error over the
    present (finite) entries adds to the binary cross-entropy, and reaches the encoder."""
    torch.manual_seed(0)
    model = map_vla(1.0, positions=True, cameras=("scene",))
    adapter = model.adapters["scene_map"]
    obs = questions(2)
    target = torch.cat([(torch.rand(2, 4, 37) < 0.1).float(), torch.full((2, 4, 72), float("nan"))], -1)
    target[0, 1, 37:40] = torch.tensor([1.2, 0.7, 1.5])  # one object: column, row, depth in cells
    target[1, 3, 40:43] = torch.tensor([1.9, 1.1, 0.2])
    tokens = model.vision(obs.images)  # (I, 4, d)
    loss, metrics = adapter.loss(tokens, target)
    out = adapter.head(tokens)  # (I, 4, 109)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(out[..., :37], target[..., :37])
    mse = (
        (out[0, 1, 37:40] - target[0, 1, 37:40]).square().sum()
        + (out[1, 3, 40:43] - target[1, 3, 40:43]).square().sum()
    ) / 6
    assert metrics["position_mse"] == pytest.approx(float(mse), rel=1e-4)
    assert float(loss.detach()) == pytest.approx(float(bce + mse), rel=1e-4)
    loss.backward()
    assert model.vision.backbone.conv1[0].weight.grad.abs().sum() > 0
    without = map_vla(1.0, cameras=("scene",))  # the same target, positions unused
    _, plain = without.adapters["scene_map"].loss(without.vision(obs.images), target)
    assert set(plain) == {"bce"} and without.adapters["scene_map"].head[-1].out_features == 37


def test_questions_sharing_an_image_count_it_once():
    torch.manual_seed(0)
    model = map_vla(1.0, cameras=("scene",)).eval()
    shared = questions(5)
    index = torch.tensor([0, 0, 1, 1, 1])  # 5 questions about 2 images
    images = {"scene": shared.images["scene"][:2]}
    grouped = Observation(images, shared.text_ids, shared.text_valid, None, index)
    scene_map = (torch.rand(2, 4, 37) < 0.2).float()  # one per image
    answers = torch.randint(4, 50, (5, 3))
    loss, metrics = model.compute_vqa_loss(VQABatch(grouped, answers, {"scene_map": scene_map}))
    own, _ = model.adapters["scene_map"].loss(model.vision(images), scene_map)  # each image once
    assert metrics["scene_map/bce"] == pytest.approx(float(own), rel=1e-5)
    assert float(loss.detach()) == pytest.approx(metrics["answer_loss"] + float(own), rel=1e-5)


def test_channels_come_from_the_vqa_data():
    configs = DiffusionVLAConfig().adapters
    configs.scene_map = SceneMapConfig(positions=True)
    fitted = fit_to_data(configs, {"scene_map_channels": 37, "scene_map_position_channels": 72}).scene_map
    assert (fitted.channels, fitted.position_channels, fitted.positions) == (37, 72, True)
    with pytest.raises(ValueError, match="vqa.root"):
        fit_to_data(configs, {"sim_state_dim": 39})
