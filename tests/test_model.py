"""The assembled VLA: shapes, exact prefix caching, decoding modes, overfitting, VQA, checkpoints."""

import math

import pytest
import torch
from conftest import tiny_causal_lm

from dvla.backbone import layout
from dvla.backbone.decoder import DecodeConfig
from dvla.backbone.tokenizer import train_text_tokenizer
from dvla.batch import Observation, VQABatch, fake_action_batch, fake_observation
from dvla.checkpoint import load_checkpoint, save_checkpoint
from dvla.model import DiffusionVLA, TextSpecials
from dvla.model_config import BackboneSize, DiffusionVLAConfig
from dvla.vision import VisionConfig

TEXT = TextSpecials(vocab_size=50, pad_id=0, eos_id=2)


def tiny_vla(
    head="discrete", model_name="resnet10t", cameras=("a", "b"), text=TEXT, **overrides
) -> DiffusionVLA:
    kwargs = {"img_size": 32} if model_name.startswith("vit") else {}
    vision = VisionConfig(
        model_name=model_name,
        image_size=32,
        tokens_per_camera=4,
        cameras=list(cameras),
        shift_fraction=0.0,
        timm_kwargs=kwargs,
    )
    values = dict(
        vision=vision,
        backbone=BackboneSize(64, 128, 2, 4),
        action_head=head,
        chunk_size=4,
        action_dim=3,
        state_dim=5,
        action_bins=32,
        answer_tokens=3,
    )
    return DiffusionVLA(DiffusionVLAConfig(**{**values, **overrides}), text)


def batch(cameras=("a", "b"), size=3):
    return fake_action_batch(size, list(cameras), 32, 6, 50, 5, 4, 3)


@pytest.mark.parametrize("head", ["discrete", "flow"])
@pytest.mark.parametrize("model_name", ["resnet10t", "vit_tiny_patch16_224"])
def test_shapes_for_every_encoder_and_head(head, model_name):
    torch.manual_seed(0)
    model = tiny_vla(head, model_name)
    data = batch()
    loss, metrics = model.compute_loss(data)
    assert loss.ndim == 0 and torch.isfinite(loss) and metrics
    loss.backward()
    assert model.vision.projector[0].weight.grad is not None  # gradients reach the vision adapter
    actions, forwards = model.eval().sample_actions(data.observation, DecodeConfig(steps=2))
    assert actions.shape == (3, 4, 3) and torch.isfinite(actions).all()
    if head == "discrete":
        assert actions.abs().max() <= 1 and forwards == 3  # the prefix pass + 2 steps
    else:
        assert forwards == 2  # the prefix pass + one pass over the action queries


def test_cached_prefix_decoding_logits_equal_the_full_pass():
    torch.manual_seed(1)
    model = tiny_vla().eval()
    obs = batch().observation
    tokens = torch.randint(0, 33, (3, 12))  # bins, with 32 = hidden
    with torch.no_grad():
        prefix = model.encode_prefix(obs)
        cached = model.bin_logits(model._target_hidden(prefix, model.action_embeds(tokens)))
        full = model.bin_logits(model._full_hidden(obs, model.action_embeds(tokens), train=False))
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=0)


def test_autoregressive_kv_cache_matches_recomputing_each_step():
    """Each AR step's logits equal a fresh pass over [prefix | chosen tokens | hidden token k]."""
    torch.manual_seed(2)
    model = tiny_vla().eval()
    obs = batch().observation
    chosen = torch.randint(0, 32, (3, 12))
    with torch.no_grad():
        prefix = model.encode_prefix(obs)
        step = model._ar_step_fn(prefix)
        embeds, valid = model.prefix_embeds(obs)
        for k in range(5):
            ar = step(k, None if k == 0 else chosen[:, k - 1])
            tokens = torch.cat([chosen[:, :k], torch.full((3, 1), 32)], dim=1)  # (B, k+1)
            n = k + 1
            mask = layout.full_mask(valid, n).clone()
            p = valid.shape[1]
            mask[:, :, p : p + k, p + k] = False  # chosen tokens do not see the hidden one
            causal = torch.ones(n, n, dtype=torch.bool).tril()  # nor later chosen tokens
            mask[:, :, p:, p:] &= causal
            positions = torch.cat([layout.prefix_positions(valid), layout.target_positions(valid, n)], 1)
            out = model.backbone(
                inputs_embeds=torch.cat([embeds, model.action_embeds(tokens)], 1),
                position_ids=positions,
                attention_mask=mask,
                return_logits=False,
            )
            torch.testing.assert_close(ar, model.bin_logits(out.hidden_states[:, -1]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("steps", [1, 2, 4, 12])
def test_forwards_are_the_steps_asked_for_plus_the_prefix(steps):
    model = tiny_vla().eval()
    _, forwards = model.sample_actions(batch().observation, DecodeConfig(steps=steps))
    assert forwards == steps + 1
    _, forwards = model.sample_actions(batch().observation, DecodeConfig(autoregressive=True))
    assert forwards == 12 + 1  # one per action token
    cached, _ = model.sample_actions(batch().observation, DecodeConfig(steps=steps))
    uncached, forwards = model.sample_actions(batch().observation, DecodeConfig(steps=steps), use_cache=False)
    assert forwards == steps and torch.equal(cached, uncached)


def _overfit(model, data, steps, loss_fn, anneal=False):
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps) if anneal else None
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _ = loss_fn(data)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if schedule is not None:
            schedule.step()
    return model.eval()


def test_discrete_model_overfits_four_chunks_to_within_one_bin():
    torch.manual_seed(0)
    model = tiny_vla(cameras=("a",))
    data = batch(cameras=("a",), size=4)
    data.actions_is_pad[:] = False
    _overfit(model, data, 250, model.compute_loss)
    for steps in (1, 4):
        actions, _ = model.sample_actions(data.observation, DecodeConfig(steps=steps))
        assert ((actions - data.actions).abs() <= 2 / 32).all(), steps  # one bin of [-1, 1] / 32


def test_flow_model_overfits_four_chunks():
    torch.manual_seed(0)
    model = tiny_vla("flow", cameras=("a",))
    data = batch(cameras=("a",), size=4)
    data.actions_is_pad[:] = False
    _overfit(model, data, 400, model.compute_loss, anneal=True)  # flow regression wants a decaying rate
    actions, _ = model.sample_actions(
        data.observation, DecodeConfig(), generator=torch.Generator().manual_seed(0)
    )
    assert (actions - data.actions).abs().mean() < 0.1


@pytest.mark.parametrize("head", ["discrete", "flow"])
def test_sim_state_target_read_off_the_state_token(head):
    torch.manual_seed(0)
    model = tiny_vla(head, sim_state_dim=6, sim_state_weight=0.5, sim_state_reads="state_token")
    data = batch()
    plain, _ = model.compute_loss(data, generator=torch.Generator().manual_seed(1))
    data.sim_state = torch.rand(3, 6) * 2 - 1
    loss, metrics = model.compute_loss(data, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(float(loss - plain), 0.5 * metrics["sim_state_mse"], rtol=1e-4, atol=1e-6)
    # the error is read at the state token, not at a target token (whose state depends on the
    # targets): a reference pass with 12 other target tokens, whose state token is at -13
    others = model.action_embeds(torch.zeros(3, 12, dtype=torch.long))  # (B, 12, d)
    state_token = model._full_pass(data.observation, others, train=True)[0][:, -13]  # (B, d)
    reference = torch.nn.functional.mse_loss(model.sim_state_head(state_token), data.sim_state)
    assert metrics["sim_state_mse"] == pytest.approx(float(reference), rel=1e-4)
    # the auxiliary error alone reaches the vision encoder through the state token
    aux = loss - plain
    aux.backward()
    conv = model.vision.backbone.conv1[0].weight
    assert conv.grad is not None and conv.grad.abs().sum() > 0
    # at inference the head reads the same state token from the prefix pass alone
    model.eval()
    targets = model.action_embeds(torch.zeros(3, 12, dtype=torch.long))  # (B, H*D, d)
    hidden, _ = model._full_pass(data.observation, targets, train=False)  # (B, P + 12, d)
    readout = model.sim_state_head(hidden[:, -13])  # the state token, just before the 12 targets
    torch.testing.assert_close(model.predict_sim_state(data.observation), readout)
    assert tiny_vla(head).sim_state_head is None  # no target, no head
    with pytest.raises(ValueError, match="sim_state_key"):
        tiny_vla(head).predict_sim_state(data.observation)


@pytest.mark.parametrize("head", ["discrete", "flow"])
def test_sim_state_target_read_off_the_image_tokens(head):
    """The default head reads the encoder's tokens directly: its error is a function of the images
    alone (not of the text, state or targets), and its gradient reaches the encoder."""
    torch.manual_seed(0)
    model = tiny_vla(head, sim_state_dim=6, sim_state_weight=0.5)
    data = batch()
    plain, _ = model.compute_loss(data, generator=torch.Generator().manual_seed(1))
    data.sim_state = torch.rand(3, 6) * 2 - 1
    loss, metrics = model.compute_loss(data, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(float(loss - plain), 0.5 * metrics["sim_state_mse"], rtol=1e-4, atol=1e-6)
    tokens = model.vision(data.observation.images, train=True)  # (B, 2 cameras * 4, d)
    reference = torch.nn.functional.mse_loss(model.sim_state_head(tokens, ["a", "b"]), data.sim_state)
    assert metrics["sim_state_mse"] == pytest.approx(float(reference), rel=1e-4)
    (loss - plain).backward()
    conv = model.vision.backbone.conv1[0].weight
    assert conv.grad is not None and conv.grad.abs().sum() > 0
    model.eval()
    read = model.predict_sim_state(data.observation)
    torch.testing.assert_close(read, model.sim_state_head(model.vision(data.observation.images), ["a", "b"]))
    # a batch with one of the cameras (co-training) reads the other as zeros, not as misplaced tokens
    only_b = fake_observation(3, ["b"], 32, 6, 50, 5)
    alone = model.predict_sim_state(only_b)
    grid = torch.zeros(3, 2, 4, model.vision.token_embed.shape[1])
    grid[:, 1] = model.sim_state_head.norm(model.vision({"b": only_b.images["b"]}))
    torch.testing.assert_close(alone, model.sim_state_head.readout(grid.flatten(1)))
    with pytest.raises(ValueError, match="sim_state_reads"):
        tiny_vla(head, sim_state_dim=6, sim_state_reads="hidden")


def test_sim_state_reading_is_a_prefix_token_the_action_loss_cannot_train():
    """With sim_state_input the head's reading of the images joins the prefix after the robot state.
    It is detached: the action loss trains the projection, never the head (its own loss does)."""
    torch.manual_seed(0)
    model = tiny_vla(sim_state_dim=6, sim_state_input=True)
    data = batch()
    embeds, valid = model.prefix_embeds(data.observation)  # 8 image + 6 text + state + reading
    assert embeds.shape[1] == valid.shape[1] == 8 + 6 + 2
    reading = model.predict_sim_state(data.observation)  # (B, 6), encoder in eval mode
    torch.testing.assert_close(embeds[:, -1], model.sim_state_proj(reading))
    loss, metrics = model.compute_loss(data, generator=torch.Generator().manual_seed(1))
    assert "sim_state_mse" not in metrics  # the batch has no simulator state: action loss only
    loss.backward()
    assert model.sim_state_head.readout.weight.grad is None
    assert model.sim_state_proj[0].weight.grad.abs().sum() > 0
    # questions have no robot state and so no reading token; acting needs no simulator state
    question = fake_observation(3, ["a", "b"], 32, 6, 50, None)
    assert model.prefix_embeds(question)[0].shape[1] == 8 + 6
    model.eval()
    assert model.sample_actions(data.observation, DecodeConfig(steps=1))[0].shape == (3, 4, 3)
    with pytest.raises(ValueError, match="dataset.sim_state_key"):
        tiny_vla(sim_state_input=True)
    with pytest.raises(ValueError, match="sim_state_reads vision"):
        tiny_vla(sim_state_dim=6, sim_state_input=True, sim_state_reads="state_token")


def test_reading_offsets_token_is_the_read_positions_minus_the_hand_in_decimetres():
    """reading_offsets "3:6" turns the head's reading of simulator-state dims 3..5 and the robot
    state's first three values back into metres (with the run's q01 and span) and gives their
    difference x10 as one more prefix token; without units it refuses to guess."""
    torch.manual_seed(0)
    model = tiny_vla(sim_state_dim=6, reading_offsets="3:6")
    data = batch()
    with pytest.raises(RuntimeError, match="no units yet"):
        model.prefix_embeds(data.observation)
    state_low, state_span = torch.tensor([0.0, 0.5, 0.1, 0, 0]), torch.tensor([0.2, 0.4, 0.3, 1, 1])
    sim_low, sim_span = torch.zeros(6), torch.tensor([1, 1, 1, 0.2, 0.4, 0.6])
    model.reading_offsets.set_units(state_low, state_span, sim_low, sim_span)
    reading = torch.tensor([[0.0, 0, 0, 1.0, -1.0, 0.0]])  # goal read at (0.2, 0, 0.3) m
    state = torch.tensor([[-1.0, 1.0, 0.0, 0, 0]])  # hand at (0, 0.9, 0.25) m
    offsets = model.reading_offsets(reading, state)
    torch.testing.assert_close(offsets, torch.tensor([[2.0, -9.0, 0.5]]))
    embeds, valid = model.prefix_embeds(data.observation)  # 8 image + 6 text + state + offsets
    assert embeds.shape[1] == valid.shape[1] == 8 + 6 + 2
    read = model.predict_sim_state(data.observation)
    expected = model.offset_proj(model.reading_offsets(read, data.observation.state))
    torch.testing.assert_close(embeds[:, -1], expected)
    loss, _ = model.compute_loss(data, generator=torch.Generator().manual_seed(1))
    loss.backward()
    assert model.offset_proj[0].weight.grad.abs().sum() > 0  # the action loss trains the projection
    assert model.sim_state_head.readout.weight.grad is None  # but never the head
    with pytest.raises(ValueError, match="3-D position"):
        tiny_vla(sim_state_dim=6, reading_offsets="3:5")
    with pytest.raises(ValueError, match="past the simulator state"):
        tiny_vla(sim_state_dim=6, reading_offsets="4:7")
    with pytest.raises(ValueError, match="dataset.sim_state_key"):
        tiny_vla(reading_offsets="3:6")


def test_perception_frames_join_the_simulator_state_mean():
    """Scene frames (no actions) are read by the same head; one weighted mean covers both."""
    from dvla.batch import PerceptionFrames
    from dvla.sim_state_head import weighted_mse

    torch.manual_seed(0)
    model = tiny_vla(sim_state_dim=6, sim_state_emphasis="0:2=4")
    data = batch()
    data.sim_state = torch.rand(3, 6) * 2 - 1
    g = torch.Generator().manual_seed(2)
    frames = PerceptionFrames(
        {c: torch.rand(5, 3, 32, 32, generator=g) for c in ("a", "b")}, torch.rand(5, 6, generator=g) * 2 - 1
    )
    _, plain_metrics = model.compute_loss(data, generator=torch.Generator().manual_seed(1))
    data.perception = frames
    _, metrics = model.compute_loss(data, generator=torch.Generator().manual_seed(1))
    assert metrics["action_loss"] == pytest.approx(plain_metrics["action_loss"])  # no action target
    read = torch.cat(
        [
            model.sim_state_head(model.vision(x, train=True), ["a", "b"])
            for x in (data.observation.images, frames.images)
        ]
    )  # (3 + 5, 6)
    weights = torch.tensor([4.0, 4, 1, 1, 1, 1])
    reference = weighted_mse(read, torch.cat([data.sim_state, frames.sim_state]), weights)
    assert metrics["sim_state_mse"] == pytest.approx(float(reference), rel=1e-4)


def test_full_mask_fraction_hides_whole_chunks():
    """At fraction 1 every valid action token is hidden (t = 1, weight 1): the loss is then the plain
    cross-entropy of predicting the chunk from the observation alone, as one-step decoding does."""
    torch.manual_seed(0)
    model = tiny_vla(full_mask_fraction=1.0)
    data = batch()
    loss, metrics = model.compute_loss(data, generator=torch.Generator().manual_seed(1))
    assert metrics["mask_fraction"] == 1.0
    bins = model.action_tokens.encode(data.actions).flatten(1)  # (B, H*D)
    hidden = torch.full_like(bins, model.config.action_bins)
    out = model._full_hidden(data.observation, model.action_embeds(hidden), train=True)
    ce = torch.nn.functional.cross_entropy(
        model.bin_logits(out).flatten(0, 1), bins.flatten(), reduction="none"
    )
    valid = (~data.actions_is_pad).repeat_interleave(3, dim=1).flatten()
    assert float(loss) == pytest.approx(float(ce[valid].mean()), rel=1e-4)
    partial = tiny_vla(full_mask_fraction=0.0)
    assert partial.compute_loss(data, generator=torch.Generator().manual_seed(1))[1]["mask_fraction"] < 1
    with pytest.raises(ValueError, match="full_mask_fraction"):
        tiny_vla(full_mask_fraction=1.5)


@pytest.mark.parametrize("head", ["discrete", "flow"])
def test_state_dropout_hides_the_state_of_drawn_samples(head):
    """With state_dropout, the drawn samples' loss does not depend on their robot state (a learned
    token stands in for it) and the others' does; at 0 nothing is drawn and every state counts."""
    torch.manual_seed(0)
    model = tiny_vla(head, state_dropout=0.5)
    data = batch(size=6)
    hidden = model._draw_hidden_states(6, "cpu", torch.Generator().manual_seed(1))  # (B,)
    assert 0 < int(hidden.sum()) < 6

    def loss_with_state(state):
        data.observation.state = state
        return float(model.compute_loss(data, generator=torch.Generator().manual_seed(1))[0])

    state = data.observation.state.clone()
    base = loss_with_state(state)
    assert loss_with_state(torch.where(hidden[:, None], -state, state)) == pytest.approx(base, abs=1e-6)
    assert loss_with_state(torch.where(hidden[:, None], state, -state)) != pytest.approx(base, abs=1e-4)
    loss, _ = model.compute_loss(data)
    loss.backward()
    assert model.state_hidden_embed.grad is not None and model.state_hidden_embed.grad.abs().sum() > 0
    assert tiny_vla(head)._draw_hidden_states(6, "cpu") is None
    with pytest.raises(ValueError, match="state_dropout"):
        tiny_vla(head, state_dropout=1.0)


def test_sim_state_emphasis_weights_the_listed_dimensions():
    """An emphasis of "2:4=10" multiplies the squared error of dimensions 2 and 3 by 10 before the
    mean; bad specs and slices past the state are refused with the expected form in the message."""
    torch.manual_seed(0)
    model = tiny_vla(sim_state_dim=6, sim_state_emphasis="2:4=10, 5:6=0")
    data = batch()
    data.sim_state = torch.rand(3, 6) * 2 - 1
    _, metrics = model.compute_loss(data, generator=torch.Generator().manual_seed(1))
    tokens = model.vision(data.observation.images, train=True)  # (B, 2 cameras * 4, d)
    squared = (model.sim_state_head(tokens, ["a", "b"]) - data.sim_state).square()  # (B, 6)
    expected = (squared[:, :2].sum() + 10 * squared[:, 2:4].sum() + squared[:, 4].sum()) / 18
    assert metrics["sim_state_mse"] == pytest.approx(float(expected), rel=1e-4)
    assert "sim_state_dim_weights" not in model.state_dict()  # rebuilt from the config, not saved
    with pytest.raises(ValueError, match="start:stop=weight"):
        DiffusionVLAConfig(sim_state_emphasis="36-39=30")
    with pytest.raises(ValueError, match="past the simulator state's 6 dimensions"):
        tiny_vla(sim_state_dim=6, sim_state_emphasis="4:8=2")


def test_vqa_answers_through_the_same_backbone():
    torch.manual_seed(0)
    model = tiny_vla(cameras=("scene",))
    obs = fake_observation(4, ["scene"], 32, 6, 50, None)
    answers = torch.tensor([[10, 2, 2], [11, 12, 2], [13, 2, 2], [14, 15, 16]])  # padded with EOS (2)
    vqa = VQABatch(obs, answers)
    _overfit(model, vqa, 300, model.compute_vqa_loss)
    result = model.answer_ids(obs, DecodeConfig(steps=3))
    assert torch.equal(result.tokens, answers) and result.forwards == 3
    assert (result.tokens < TEXT.vocab_size).all()  # answers are text tokens only


def test_checkpoint_round_trip_is_bit_exact(tmp_path):
    torch.manual_seed(3)
    model = tiny_vla().eval()
    tokenizer = train_text_tokenizer(["pick the red cube", "open the door"], vocab_size=60)
    stats = {"action": {"q01": torch.tensor([-1.0, 0.0, 0.5]).numpy(), "q99": torch.ones(3).numpy()}}
    save_checkpoint(tmp_path / "ckpt", model, tokenizer, stats)
    loaded, loaded_tokenizer, loaded_stats = load_checkpoint(tmp_path / "ckpt")
    for key, value in model.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key
    assert loaded.config == model.config and loaded.text == model.text
    obs = batch().observation
    gen = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    assert torch.equal(
        model.sample_actions(obs, DecodeConfig(steps=2), gen())[0],
        loaded.sample_actions(obs, DecodeConfig(steps=2), gen())[0],
    )
    assert loaded_tokenizer("open the door")["input_ids"] == tokenizer("open the door")["input_ids"]
    assert loaded_stats["action"]["q01"].tolist() == [-1.0, 0.0, 0.5]
    with pytest.raises(FileNotFoundError, match="not a dvla checkpoint"):
        load_checkpoint(tmp_path / "nowhere")


def test_checkpoint_saved_before_the_head_choice_loads_its_state_token_head(tmp_path):
    import json

    from dvla.checkpoint import CONFIG_FILE

    model = tiny_vla(sim_state_dim=6, sim_state_reads="state_token").eval()
    tokenizer = train_text_tokenizer(["open the door"], vocab_size=60)
    save_checkpoint(tmp_path / "ckpt", model, tokenizer, {})
    config_path = tmp_path / "ckpt" / CONFIG_FILE
    saved = json.loads(config_path.read_text())
    del saved["model"]["sim_state_reads"]  # as written before the choice existed
    config_path.write_text(json.dumps(saved))
    loaded, _, _ = load_checkpoint(tmp_path / "ckpt")
    assert loaded.config.sim_state_reads == "state_token"
    torch.testing.assert_close(
        loaded.predict_sim_state(batch().observation), model.predict_sim_state(batch().observation)
    )


def test_scene_map_target_read_off_the_scene_tokens():
    """Each image token predicts its own cell of the map; the error adds to the answer loss with
    its weight and its gradient reaches the encoder. Robot cameras absent from a VQA batch are fine."""
    torch.manual_seed(0)
    model = tiny_vla(cameras=("a", "scene"), scene_map_weight=0.5)
    assert model.scene_map_grid == 2  # 4 tokens per camera
    obs = fake_observation(3, ["scene"], 32, 6, 50, None)
    answers = torch.tensor([[10, 2, 2], [11, 12, 2], [13, 2, 2]])
    plain, _ = model.compute_vqa_loss(VQABatch(obs, answers), generator=torch.Generator().manual_seed(1))
    target = (torch.rand(3, 4, 37) < 0.1).float()  # (B, G*G, C)
    loss, metrics = model.compute_vqa_loss(
        VQABatch(obs, answers, target), generator=torch.Generator().manual_seed(1)
    )
    assert metrics["answer_loss"] == pytest.approx(float(plain.detach()), rel=1e-5)
    torch.testing.assert_close(float(loss - plain), 0.5 * metrics["scene_map_bce"], rtol=1e-4, atol=1e-6)
    tokens = model.vision(obs.images)  # (B, 4, d): the scene camera only
    reference = torch.nn.functional.binary_cross_entropy_with_logits(model.scene_map_head(tokens), target)
    assert metrics["scene_map_bce"] == pytest.approx(float(reference), rel=1e-4)
    (loss - plain).backward()
    assert model.vision.backbone.conv1[0].weight.grad.abs().sum() > 0
    assert tiny_vla(cameras=("scene",)).scene_map_head is None and tiny_vla().scene_map_grid is None
    with pytest.raises(ValueError, match="square grid"):
        tiny_vla(cameras=("scene",), scene_map_weight=1.0, vision=VisionConfig(tokens_per_camera=8))
    with pytest.raises(ValueError, match="scene_map_weight"):
        DiffusionVLAConfig(scene_map_weight=-1.0)


def test_scene_map_positions_regress_where_the_objects_are():
    """With scene_map_positions the head also outputs the position channels; their squared error
    over the present (finite) entries adds to the binary cross-entropy, and reaches the encoder."""
    torch.manual_seed(0)
    model = tiny_vla(cameras=("scene",), scene_map_weight=1.0, scene_map_positions=True)
    obs = fake_observation(2, ["scene"], 32, 6, 50, None)
    target = torch.cat([(torch.rand(2, 4, 37) < 0.1).float(), torch.full((2, 4, 72), float("nan"))], -1)
    target[0, 1, 37:40] = torch.tensor([1.2, 0.7, 1.5])  # one object: column, row, depth in cells
    target[1, 3, 40:43] = torch.tensor([1.9, 1.1, 0.2])
    tokens = model.vision(obs.images)  # (I, 4, d)
    loss, metrics = model.scene_map_loss(tokens, target)
    out = model.scene_map_head(tokens)  # (I, 4, 109)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(out[..., :37], target[..., :37])
    mse = (
        (out[0, 1, 37:40] - target[0, 1, 37:40]).square().sum()
        + (out[1, 3, 40:43] - target[1, 3, 40:43]).square().sum()
    ) / 6
    assert metrics["scene_map_position_mse"] == pytest.approx(float(mse), rel=1e-4)
    assert float(loss) == pytest.approx(float(bce + mse), rel=1e-4)
    loss.backward()
    assert model.vision.backbone.conv1[0].weight.grad.abs().sum() > 0
    without = tiny_vla(cameras=("scene",), scene_map_weight=1.0)  # the same target, positions unused
    _, plain = without.scene_map_loss(without.vision(obs.images), target)
    assert set(plain) == {"scene_map_bce"} and without.scene_map_head[-1].out_features == 37
    with pytest.raises(ValueError, match="scene_map_weight > 0"):
        DiffusionVLAConfig(scene_map_positions=True)


def test_questions_sharing_an_image_equal_each_with_its_own_copy():
    """obs.image_index reads each image once for several questions: the answer loss and the
    answers equal those of a batch where every question has its own copy of the image; the
    scene-map error counts each image once."""
    torch.manual_seed(0)
    model = tiny_vla(cameras=("scene",), scene_map_weight=1.0).eval()  # eval: batch norm as at inference
    shared = fake_observation(5, ["scene"], 32, 6, 50, None)
    index = torch.tensor([0, 0, 1, 1, 1])  # 5 questions about 2 images
    images = {"scene": shared.images["scene"][:2]}
    grouped = Observation(images, shared.text_ids, shared.text_valid, None, index)
    copied = Observation({"scene": images["scene"][index]}, shared.text_ids, shared.text_valid)
    answers = torch.randint(4, 50, (5, 3))
    scene_map = (torch.rand(2, 4, 37) < 0.2).float()  # one per image
    loss, metrics = model.compute_vqa_loss(
        VQABatch(grouped, answers, scene_map), generator=torch.Generator().manual_seed(2)
    )
    plain, _ = model.compute_vqa_loss(VQABatch(copied, answers), generator=torch.Generator().manual_seed(2))
    assert metrics["answer_loss"] == pytest.approx(float(plain.detach()), rel=1e-5)
    own, _ = model.scene_map_loss(model.vision(images), scene_map)  # each image once, not per question
    assert metrics["scene_map_bce"] == pytest.approx(float(own), rel=1e-5)
    assert float(loss) == pytest.approx(float(plain.detach()) + float(own), rel=1e-5)
    decode = DecodeConfig(steps=3)
    torch.testing.assert_close(
        model.answer_ids(grouped, decode).tokens, model.answer_ids(copied, decode).tokens
    )


def test_text_film_starts_as_the_identity_and_conditions_image_tokens_on_the_text():
    torch.manual_seed(0)
    plain = tiny_vla(cameras=("scene",))
    film = tiny_vla(cameras=("scene",), text_film=True)
    film.load_state_dict(plain.state_dict(), strict=False)  # all but the FiLM layers
    obs = fake_observation(3, ["scene"], 32, 6, 50, None)
    embeds, _ = plain.prefix_embeds(obs)
    torch.testing.assert_close(film.prefix_embeds(obs)[0], embeds)  # zero-initialised: identity
    torch.nn.init.normal_(film.text_film.to_scale_shift[-1].weight, std=0.5)
    n = film.vision.tokens_per_camera
    conditioned = film.prefix_embeds(obs)[0][:, :n]  # (B, N, d) image tokens
    other = Observation(obs.images, obs.text_ids.flip(0), obs.text_valid.flip(0))  # other questions
    assert not torch.allclose(film.prefix_embeds(other)[0][:, :n], conditioned)
    padded = obs.text_ids.clone()
    padded[~obs.text_valid] = 7  # what sits under the padding does not count
    same = Observation(obs.images, padded, obs.text_valid)
    torch.testing.assert_close(film.prefix_embeds(same)[0][:, :n], conditioned)
    answers = torch.tensor([[10, 2, 2], [11, 12, 2], [13, 2, 2]])
    loss, _ = film.compute_vqa_loss(VQABatch(obs, answers))
    loss.backward()
    assert film.text_film.to_scale_shift[0].weight.grad.abs().sum() > 0


def test_text_film_queries_see_word_order_and_ignore_padding():
    """The mean cannot tell two orders of the same words apart; attention queries over positioned
    embeddings can. Padding never counts, and the layer starts as the identity."""
    torch.manual_seed(0)
    obs = fake_observation(2, ["scene"], 32, 6, 50, None)
    swapped = obs.text_ids.clone()
    swapped[:, [0, 1]] = swapped[:, [1, 0]]  # the same words, two of them in the other order
    valid = torch.ones_like(obs.text_valid)
    n = 4
    for queries, order_matters in ((0, False), (3, True)):
        film = tiny_vla(cameras=("scene",), text_film=True, text_film_queries=queries)
        identity = film.prefix_embeds(Observation(obs.images, obs.text_ids, valid))[0][:, :n]
        torch.testing.assert_close(identity, film.vision(obs.images))  # zero-initialised
        torch.nn.init.normal_(film.text_film.to_scale_shift[-1].weight, std=0.5)
        tokens = film.prefix_embeds(Observation(obs.images, obs.text_ids, valid))[0][:, :n]
        reordered = film.prefix_embeds(Observation(obs.images, swapped, valid))[0][:, :n]
        assert torch.allclose(tokens, reordered, atol=1e-5) != order_matters
        padded = obs.text_ids.clone()
        padded[~obs.text_valid] = 7
        torch.testing.assert_close(
            film.prefix_embeds(Observation(obs.images, padded, obs.text_valid))[0][:, :n],
            film.prefix_embeds(obs)[0][:, :n],
        )
    with pytest.raises(ValueError, match="text_film_queries"):
        DiffusionVLAConfig(text_film_queries=2)


def test_relation_token_reads_pairs_of_image_tokens_with_the_question():
    """One more prefix token after the image tokens, computed from every ordered pair of them and
    the question: it changes with the question's word order and with which image token shows what,
    and its gradient reaches the encoder."""
    torch.manual_seed(0)
    model = tiny_vla(cameras=("scene",), relation_token=True)
    obs = fake_observation(2, ["scene"], 32, 6, 50, None)
    embeds, valid = model.prefix_embeds(obs)
    n = model.vision.tokens_per_camera
    assert embeds.shape[1] == n + 1 + obs.text_ids.shape[1] and valid[:, : n + 1].all()
    text = model.backbone.embed(obs.text_ids)
    tokens = model.vision(obs.images)  # (B, N, d)
    relation = model.relation(tokens, text, obs.text_valid)  # (B, 1, d)
    torch.testing.assert_close(embeds[:, n : n + 1], relation)
    swapped = text.clone()
    swapped[:, [0, 1]] = swapped[:, [1, 0]]
    assert not torch.allclose(model.relation(tokens, swapped, obs.text_valid), relation)
    # a mean over pairs, blind to token order: where a token sits comes from its own features
    reordered = tokens[:, torch.randperm(n)]
    assert torch.allclose(model.relation(reordered, text, obs.text_valid), relation, atol=1e-5)
    shifted = tokens + torch.randn_like(tokens) * 0.1
    assert not torch.allclose(model.relation(shifted, text, obs.text_valid), relation)
    answers = torch.tensor([[10, 2, 2], [11, 12, 2]])
    loss, _ = model.compute_vqa_loss(VQABatch(obs, answers))
    loss.backward()
    assert model.relation.pair[1].weight.grad.abs().sum() > 0
    assert model.vision.backbone.conv1[0].weight.grad.abs().sum() > 0
    decode = DecodeConfig(steps=2)
    assert model.eval().answer_ids(obs, decode).tokens.shape == (2, model.config.answer_tokens)


def test_referent_pointers_learn_to_point_at_and_place_the_named_objects():
    """Three more prefix tokens after the image tokens: the two tokens the question's pointers pick
    and their comparison. The referent targets alone teach the pointers to point at given cells and
    the places to match (so the gradient reaches the pointers and the encoder); questions without a
    pair (-1) add nothing; the comparison token is trained to read as the answer."""
    torch.manual_seed(0)
    model = tiny_vla(cameras=("scene",), referent_pointers=True)
    obs = fake_observation(4, ["scene"], 32, 6, 50, None)
    embeds, _ = model.prefix_embeds(obs)
    n = model.vision.tokens_per_camera
    assert model.referent_grid == 2 and embeds.shape[1] == n + 3 + obs.text_ids.shape[1]
    text = model.backbone.embed(obs.text_ids)
    found = model.referents(model.vision(obs.images), text, obs.text_valid)
    assert found.tokens.shape == (4, 3, 64) and found.logits.shape == (4, 2, n)
    assert found.places.shape == (4, 2, 3)
    torch.testing.assert_close(embeds[:, n : n + 3], found.tokens)
    cells = torch.tensor([[0, 3], [2, 1], [-1, -1], [1, 0]])
    places = torch.rand(4, 2, 3) * 2
    targets = torch.cat([cells[..., None].float(), places], -1)  # (B, 2, 4)
    targets[2, :, 1:] = float("nan")
    answers = torch.tensor([[10, 2, 2], [11, 12, 2], [10, 2, 2], [11, 2, 2]])
    extras = {}
    model.prefix_embeds(obs, extras=extras)
    none = torch.full((4, 2, 4), float("nan"))
    none[..., 0] = -1
    assert model.referent_loss(extras["referents"], none, answers)[0].item() == 0.0
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        extras = {}
        model.prefix_embeds(obs, train=True, extras=extras)
        loss, metrics = model.referent_loss(extras["referents"], targets, answers)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.prefix_embeds(obs, extras=extras)
    found = extras["referents"]
    assert torch.equal(found.logits.argmax(-1)[[0, 1, 3]], cells[[0, 1, 3]])
    torch.testing.assert_close(found.places[[0, 1, 3]], places[[0, 1, 3]], atol=0.1, rtol=0)
    assert metrics["comparison_ce"] < 0.1 and not math.isnan(metrics["referent_place_mse"])
    opt.zero_grad()
    loss, metrics = model.compute_vqa_loss(VQABatch(obs, answers, referents=targets))
    loss.backward()
    assert {"referent_ce", "referent_place_mse", "comparison_ce"} <= set(metrics)
    assert metrics["answer_loss"] < loss.item()
    assert model.referents.compare[-1].weight.grad.abs().sum() > 0
    assert model.vision.backbone.conv1[0].weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="referent_weight"):
        DiffusionVLAConfig(referent_weight=-1)
    with pytest.raises(ValueError, match="square grid"):
        tiny_vla(cameras=("scene",), referent_pointers=True, vision=VisionConfig(tokens_per_camera=3))


def test_robot_observations_skip_the_question_modules():
    """A co-trained model's question modules (FiLM, relation token, referent pointers) act on
    questions only: a robot observation's prefix is that of the same model without them, and the
    action loss leaves them untouched, while a question still gets all three."""
    torch.manual_seed(0)
    modules = dict(text_film=True, relation_token=True, referent_pointers=True)
    both = tiny_vla(cameras=("scene",), **modules)
    for layer in (both.text_film.to_scale_shift[-1], both.relation.out[-1]):
        torch.nn.init.normal_(layer.weight, std=0.5)  # FiLM off the identity, so it would show
    plain = tiny_vla(cameras=("scene",))
    plain.load_state_dict(both.state_dict(), strict=False)  # all but the question modules
    data = batch(cameras=("scene",))
    robot = data.observation
    torch.testing.assert_close(both.prefix_embeds(robot)[0], plain.prefix_embeds(robot)[0])
    loss, _ = both.compute_loss(data)
    loss.backward()
    for module in (both.text_film, both.relation, both.referents):
        assert all(p.grad is None for p in module.parameters())
    assert both.vision.projector[0].weight.grad is not None
    question = fake_observation(2, ["scene"], 32, 6, 50, None)
    n = both.vision.tokens_per_camera
    assert both.prefix_embeds(question)[0].shape[1] == n + 1 + 3 + question.text_ids.shape[1]


def test_bad_model_configs():
    with pytest.raises(ValueError, match="unknown action_head"):
        DiffusionVLAConfig(action_head="diffusion")
    with pytest.raises(ValueError, match="chunk_size"):
        DiffusionVLAConfig(chunk_size=0)


def test_vla_adapts_a_pretrained_causal_lm_with_its_tokenizer(tmp_path):
    """init_from: weights from a (tiny, offline) Llama, its own tokenizer, bins and [MASK] appended."""
    from transformers import PreTrainedTokenizerFast

    from dvla.backbone.pretrained import pretrained_text

    torch.manual_seed(5)
    tok = train_text_tokenizer(["open the door", "pick the cube"], vocab_size=64)
    PreTrainedTokenizerFast.save_pretrained(tok, tmp_path)
    source = tiny_causal_lm("llama")
    source.save_pretrained(tmp_path)
    tokenizer, text_vocab = pretrained_text(tmp_path)
    text = TextSpecials(text_vocab, tokenizer.pad_token_id, tokenizer.eos_token_id)
    model = tiny_vla(text=text, backbone=BackboneSize(init_from=str(tmp_path)))
    assert model.backbone.config.hidden_size == 32  # the causal LM's size, not BackboneSize's
    assert model.mask_id == 64 + 32 and model.backbone.config.vocab_size == 64 + 32 + 1
    q = model.backbone.model.layers[1].self_attn.q_proj.weight
    assert torch.equal(q, source.model.layers[1].self_attn.q_proj.weight)
    loss, _ = model.compute_loss(batch())
    assert torch.isfinite(loss)
    save_checkpoint(tmp_path / "ckpt", model.eval(), tokenizer, {})
    loaded, _, _ = load_checkpoint(tmp_path / "ckpt")  # rebuilt from the saved architecture
    assert torch.equal(loaded.backbone.model.layers[1].self_attn.q_proj.weight, q)
    with pytest.raises(ValueError, match="does not fit"):
        tiny_vla(text=TextSpecials(60, 0, 2), backbone=BackboneSize(init_from=str(tmp_path)))


def test_first_step_nll_is_the_fully_hidden_loss_per_sample():
    """first_step_nll equals the training loss of samples drawn with the whole chunk hidden (t = 1),
    depends on each sample's own inputs only, and refuses the flow head."""
    torch.manual_seed(0)
    model = tiny_vla(full_mask_fraction=1.0).eval()
    data = batch(size=4)
    per_sample = model.first_step_nll(data)  # (B,)
    assert per_sample.shape == (4,) and (per_sample > 0).all()
    with torch.no_grad():
        loss, _ = model.compute_loss(data, generator=torch.Generator().manual_seed(0))
    valid = (~data.actions_is_pad).sum(1).float()  # the training loss averages over valid tokens
    assert float(loss) == pytest.approx(float((per_sample * valid).sum() / valid.sum()), rel=1e-4)
    data.observation.images = {c: img.flip(0) for c, img in data.observation.images.items()}
    swapped = model.first_step_nll(data)
    assert swapped[0] != pytest.approx(float(per_sample[0]), abs=1e-6)
    with pytest.raises(ValueError, match="discrete"):
        tiny_vla("flow").first_step_nll(data)


def test_co_trained_model_normalises_questions_with_their_own_statistics(tmp_path):
    """A VQA batch (no state) trains the question batch-norm statistics, a robot batch the shared
    ones; both survive a checkpoint and an EMA copy."""
    from torch.optim.swa_utils import AveragedModel

    from dvla.vision.norm_stats import batch_norms

    torch.manual_seed(0)
    vision = VisionConfig(image_size=32, tokens_per_camera=4, cameras=["a", "scene"], shift_fraction=0.0,
                          question_norm_stats=True)  # fmt: skip
    model = tiny_vla(cameras=("a", "scene"), vision=vision).train()
    first_norm, question = batch_norms(model.vision.backbone)[0], model.vision.question_norm_stats
    shared = first_norm.running_mean
    obs = fake_observation(3, ["scene"], 32, 6, 50, None)
    before = shared.clone()
    model(VQABatch(obs, torch.tensor([[10, 2, 2], [11, 12, 2], [13, 2, 2]])))
    torch.testing.assert_close(first_norm.running_mean, before)
    after_question = question.running_mean_0.clone()
    assert not torch.equal(after_question, before)
    model(batch(cameras=("a",)))
    assert not torch.equal(first_norm.running_mean, before)
    torch.testing.assert_close(question.running_mean_0, after_question)
    tokenizer = train_text_tokenizer(["open the door"], vocab_size=60)
    save_checkpoint(tmp_path / "ckpt", model.eval(), tokenizer, {})
    loaded, _, _ = load_checkpoint(tmp_path / "ckpt")
    torch.testing.assert_close(loaded.vision.question_norm_stats.running_mean_0, after_question)
    torch.testing.assert_close(
        loaded.vision(obs.images, question=True), model.vision(obs.images, question=True)
    )
    copy = AveragedModel(model, use_buffers=True).module
    with copy.vision.question_norm_stats.active():  # the copy swaps its own batch norms' buffers
        torch.testing.assert_close(batch_norms(copy.vision.backbone)[0].running_mean, after_question)
    torch.testing.assert_close(first_norm.running_mean, shared)
