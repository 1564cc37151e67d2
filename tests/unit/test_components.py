"""Vision adapter, action tokenizer, flow-matching head and text tokenizer."""

from dataclasses import replace

import pytest
import torch

from dvla.action_head import ActionTokenizer, FlowHead, FlowHeadConfig
from dvla.action_head.base import HeadSpec
from dvla.backbone.tokenizer import train_text_tokenizer
from dvla.vision import VisionConfig, VisionEncoder, random_shift
from dvla.vision.encoder import SpatialSoftmaxKeypoints
from dvla.vision.norm_stats import batch_norms


@pytest.mark.parametrize(
    ("model_name", "kwargs", "tokens"),
    [
        ("resnet10t", {}, 4),
        ("resnet10t", {"output_stride": 16}, None),  # a 4 x 4 grid at 64 px instead of 2 x 2
        ("vit_tiny_patch16_224", {"img_size": 64}, None),
    ],
)
def test_vision_encoder_shapes(model_name, kwargs, tokens):
    config = VisionConfig(
        model_name=model_name,
        image_size=64,
        tokens_per_camera=tokens,
        cameras=["front", "wrist"],
        timm_kwargs=kwargs,
    )
    encoder = VisionEncoder(config, out_dim=24)
    images = {"front": torch.rand(2, 3, 96, 96), "wrist": torch.rand(2, 3, 64, 64)}  # resized as needed
    out = encoder(images, train=True)
    k = tokens or 16  # a 64 px ViT/16 has 4 x 4 patches, a stride-16 CNN 4 x 4 cells
    assert out.shape == (2, 2 * k, 24) and torch.isfinite(out).all()
    front_only = encoder({"front": images["front"]})  # a subset (co-training batches) encodes alone
    assert front_only.shape == (2, k, 24)
    with pytest.raises(ValueError, match="encoder knows"):
        encoder({"side": images["front"]})


@pytest.mark.parametrize(
    ("model_name", "kwargs"), [("resnet10t", {}), ("vit_tiny_patch16_224", {"img_size": 64})]
)
def test_keypoint_tokens_follow_each_cameras_cell_tokens(model_name, kwargs):
    config = VisionConfig(
        model_name=model_name,
        image_size=64,
        tokens_per_camera=4,
        cameras=["a", "b"],
        keypoints=3,
        timm_kwargs=kwargs,
    )
    encoder = VisionEncoder(config, out_dim=24)
    out = encoder({"a": torch.rand(2, 3, 64, 64), "b": torch.rand(2, 3, 64, 64)}, train=True)
    assert out.shape == (2, 2 * (4 + 3), 24) and torch.isfinite(out).all()


def test_spatial_softmax_finds_the_cell_that_lights_up():
    keypoints = SpatialSoftmaxKeypoints(channels=5, count=1, out_dim=8)
    with torch.no_grad():
        keypoints.logits.weight.zero_()
        keypoints.logits.weight[0, 2] = 1.0  # the keypoint follows channel 2
        keypoints.logits.bias.zero_()
    cells = torch.zeros(1, 16, 5)  # a 4 x 4 grid in row order
    cells[0, 1 * 4 + 3, 2] = 40.0  # row 1, column 3
    xy = keypoints.coordinates(cells)[0, 0]
    torch.testing.assert_close(xy, torch.tensor([1.0, -1 / 3]), atol=1e-4, rtol=0)  # x right, y down
    with pytest.raises(ValueError, match="square"):
        keypoints.coordinates(torch.zeros(1, 12, 5))


def test_cameras_are_told_apart():
    torch.manual_seed(0)
    encoder = VisionEncoder(VisionConfig(image_size=32, tokens_per_camera=2, cameras=["a", "b"]), 16).eval()
    same = torch.rand(1, 3, 32, 32)
    out = encoder({"a": same, "b": same})
    assert not torch.allclose(out[:, :2], out[:, 2:])  # identical pictures, different camera embeddings


def test_cameras_read_in_one_batch_match_each_camera_alone():
    """All cameras go through the CNN as one batch; in eval mode a camera's tokens must not depend on
    which other cameras came with it (co-training batches carry a subset)."""
    torch.manual_seed(0)
    encoder = VisionEncoder(VisionConfig(image_size=32, tokens_per_camera=4, cameras=["a", "b", "c"]), 16)
    encoder.train()
    encoder({c: torch.rand(4, 3, 32, 32) for c in "abc"}, train=True)  # moves the batch-norm statistics
    encoder.eval()
    convolutions = [p for p in encoder.backbone.parameters() if p.dim() == 4]
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in convolutions)
    images = {c: torch.rand(2, 3, 32, 32) for c in "abc"}
    calls = []
    forward_features = encoder.backbone.forward_features
    encoder.backbone.forward_features = lambda x: calls.append(x.shape[0]) or forward_features(x)
    together = encoder(images)  # (B, 3 * K, d)
    assert calls == [6] and together.shape == (2, 12, 16)  # one CNN call for 3 cameras x 2 samples
    for i, camera in enumerate("abc"):
        alone = encoder({camera: images[camera]})  # (B, K, d)
        torch.testing.assert_close(together[:, 4 * i : 4 * (i + 1)], alone, atol=1e-5, rtol=1e-5)
    a_and_c = encoder({"c": images["c"], "a": images["a"]})  # the configured order, not the dict's
    expected = torch.cat([together[:, :4], together[:, 8:]], dim=1)
    torch.testing.assert_close(a_and_c, expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="same batch size"):
        encoder({"a": images["a"][:1], "b": images["b"][:1].repeat(3, 1, 1, 1)})


def test_a_square_feature_grid_is_pooled_in_blocks():
    encoder = VisionEncoder(VisionConfig(image_size=32, tokens_per_camera=4, cameras=["a"]), 8)
    grid = torch.arange(16.0).reshape(4, 4)  # one channel, cells numbered in row order
    pooled = encoder._pooled(grid.reshape(1, 16, 1))  # (B, N, C) -> (B, K, C)
    blocks = [grid[:2, :2], grid[:2, 2:], grid[2:, :2], grid[2:, 2:]]  # 2 x 2 blocks, not row stripes
    assert pooled.flatten().tolist() == [b.mean().item() for b in blocks]
    assert encoder._pooled(torch.rand(2, 6, 3)).shape == (2, 4, 3)  # a non-square count pools in 1-D


def test_a_wide_image_keeps_its_aspect_ratio_and_is_pooled_in_wide_blocks():
    config = VisionConfig(image_size=64, image_width=128, tokens_per_camera=2, cameras=["top"])
    encoder = VisionEncoder(config, 8)
    assert config.shape == (64, 128) and encoder.grid == (2, 4)  # resnet10t: stride 32
    grid = torch.arange(8.0).reshape(2, 4)
    pooled = encoder._pooled(grid.reshape(1, 8, 1))
    assert pooled.flatten().tolist() == [grid[:, :2].mean().item(), grid[:, 2:].mean().item()]
    out = encoder({"top": torch.rand(3, 3, 480, 640)})  # resized to 64 x 128, not squashed
    assert out.shape == (3, 2, 8)


def test_vision_config_rejects_unknown_kwargs_and_models():
    with pytest.raises(ValueError, match="not allowed"):
        VisionConfig(timm_kwargs={"pretrained_cfg_overlay": {}})
    with pytest.raises(ValueError, match="timm cannot build"):
        VisionEncoder(VisionConfig(model_name="no_such_model_v9"), 8)
    with pytest.raises(ValueError, match="shift_fraction"):
        VisionConfig(shift_fraction=0.5)


def test_random_shift_moves_content_within_the_pad():
    image = torch.zeros(4, 3, 16, 16)
    image[:, :, 8, 8] = 1.0
    shifted = random_shift(image, pad=2)
    assert shifted.shape == image.shape
    for b in range(4):
        y, x = (shifted[b, 0] == 1).nonzero()[0].tolist()
        assert abs(y - 8) <= 2 and abs(x - 8) <= 2


def test_action_tokenizer_round_trip_within_half_a_bin():
    low, high = torch.tensor([-1.0, 0.0, -2.0]), torch.tensor([1.0, 1.0, 2.0])
    tok = ActionTokenizer(low, high, bins=256, offset=100)
    actions = torch.rand(5, 16, 3) * (high - low) + low  # (B, H, D)
    ids = tok.encode(actions)
    assert ids.shape == (5, 16, 3) and ids.min() >= 100 and ids.max() < 356
    err = (tok.decode(ids) - actions).abs()
    assert (err <= tok.bin_width() / 2 + 1e-6).all()
    clipped = tok.decode(tok.encode(torch.tensor([[5.0, -5.0, 0.0]])))  # outside q01/q99 -> clipped
    assert clipped[0, 0] == pytest.approx(1 - 1 / 256) and clipped[0, 1] == pytest.approx(0.5 / 256)
    with pytest.raises(ValueError, match="dimensions"):
        tok.encode(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="outside the action bins"):
        tok.decode(torch.tensor([5]))
    with pytest.raises(ValueError, match="NaN"):
        tok.encode(torch.tensor([[float("nan"), 0.0, 0.0]]))


def test_flow_head_overfits_a_few_chunks():
    torch.manual_seed(0)
    config = FlowHeadConfig(hidden_size=64, num_blocks=2, integration_steps=10)
    head = FlowHead(config, HeadSpec(width=16, chunk_size=8, action_dim=4, vocabulary=None))
    cond = torch.randn(4, 8, 16)
    actions = torch.rand(4, 8, 4) * 2 - 1
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 1000)
    for _ in range(1000):
        loss = head.flow_loss(cond, actions)
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
    sampled = head.integrate(cond, generator=torch.Generator().manual_seed(1))
    assert sampled.shape == (4, 8, 4) and torch.isfinite(sampled).all()
    assert (sampled - actions).abs().mean() < 0.05  # actions span [-1, 1]
    pad = torch.zeros(4, 8, dtype=torch.bool)
    pad[:, 4:] = True
    assert torch.isfinite(head.flow_loss(cond, actions, pad))


def test_text_tokenizer_trained_on_the_data(tmp_path):
    texts = ["Pick and place a puck to a goal", "What color is the large cube?", "red", "Count the spheres."]
    tok = train_text_tokenizer(texts, vocab_size=300)
    ids = tok("What color is the large cube?")["input_ids"]
    assert tok.decode(ids) == "what color is the large cube?"
    assert len({tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id}) == 4
    tok.save_pretrained(tmp_path)
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(tmp_path)("What color is the large cube?")["input_ids"] == ids
    with pytest.raises(ValueError, match="no text"):
        train_text_tokenizer([])
    assert tok.decode(tok("purple")["input_ids"]) == "purple"  # an unseen word, spelled by its characters
    again = train_text_tokenizer(list(reversed(texts)), vocab_size=300)
    assert again.get_vocab() == tok.get_vocab()  # deterministic: ids never change between runs


def test_question_images_keep_their_own_batch_norm_statistics():
    """Training on question images moves only the question statistics and on robot images only the
    shared ones; at inference each kind is normalised by its own."""
    torch.manual_seed(0)
    config = VisionConfig(image_size=32, tokens_per_camera=4, cameras=["a", "scene"], shift_fraction=0.0)
    plain = VisionEncoder(config, out_dim=16)
    split = VisionEncoder(replace(config, question_norm_stats=True), out_dim=16)
    split.load_state_dict(plain.state_dict(), strict=False)  # same weights; question stats start equal
    first_norm = batch_norms(split.backbone)[0]
    robot, scene = {"a": torch.rand(4, 3, 32, 32)}, {"scene": torch.rand(4, 3, 32, 32) * 0.2 + 0.8}
    split.train()
    before_robot = first_norm.running_mean.clone()
    split(scene, train=True, question=True)
    torch.testing.assert_close(first_norm.running_mean, before_robot)  # robot statistics untouched
    question_mean = split.question_norm_stats.running_mean_0.clone()
    assert not torch.equal(question_mean, before_robot)
    split(robot, train=True)
    torch.testing.assert_close(split.question_norm_stats.running_mean_0, question_mean)
    assert not torch.equal(first_norm.running_mean, before_robot)
    split.eval()
    # at inference a question image is normalised as a plain encoder with the question statistics
    reference = VisionEncoder(config, out_dim=16).eval()
    reference.load_state_dict(split.state_dict(), strict=False)
    for i, norm in enumerate(batch_norms(reference.backbone)):
        norm.running_mean.copy_(getattr(split.question_norm_stats, f"running_mean_{i}"))
        norm.running_var.copy_(getattr(split.question_norm_stats, f"running_var_{i}"))
    torch.testing.assert_close(split(scene, question=True), reference(scene))
    assert not torch.allclose(split(robot), reference(robot))  # robot images keep their own
    with pytest.raises(ValueError, match="no batch norms"):
        VisionEncoder(
            VisionConfig(model_name="vit_tiny_patch16_224", image_size=32, timm_kwargs={"img_size": 32},
                         question_norm_stats=True, cameras=["scene"]),
            out_dim=16,
        )  # fmt: skip
