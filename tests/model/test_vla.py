"""The core model: shapes for every encoder and head, the exact prefix cache, decoding costs, that
both heads learn, questions through the same backbone, configs, pretrained init, question norm stats."""

import pytest
import torch
from conftest import tiny_causal_lm
from tiny_models import TEXT, batch, overfit, questions, tiny_vla

from dvla.backbone import layout
from dvla.backbone.decoder import DecodeConfig
from dvla.backbone.tokenizer import train_text_tokenizer
from dvla.checkpoint import load_checkpoint, save_checkpoint
from dvla.model import BackboneSize, DiffusionVLAConfig, TextSpecials
from dvla.types import VQABatch
from dvla.vision import VisionConfig


@pytest.mark.parametrize("head", ["discrete", "flow"])
@pytest.mark.parametrize("model_name", ["resnet10t", "vit_tiny_patch16_224"])
def test_shapes_for_every_encoder_and_head(head, model_name):
    torch.manual_seed(0)
    model = tiny_vla(head, model_name)
    data = batch()
    loss, metrics = model.compute_loss(data)
    assert loss.ndim == 0 and torch.isfinite(loss) and metrics
    assert not any("/" in name for name in metrics)  # no adapter, no namespaced metric
    loss.backward()
    assert model.vision.projector[0].weight.grad is not None  # gradients reach the vision adapter
    actions, forwards = model.eval().sample_actions(data.observation, DecodeConfig(steps=2))
    assert actions.shape == (3, 4, 3) and torch.isfinite(actions).all()
    if head == "discrete":
        assert actions.abs().max() <= 1 and forwards == 3  # the prefix pass + 2 steps
    else:
        assert forwards == 2  # the prefix pass + one pass over the action queries


def test_prefix_is_images_text_state():
    """Without adapters the prefix is [image tokens | text | state], all valid but the padding."""
    model = tiny_vla()
    obs = batch().observation
    embeds, valid, inputs = model.prefix_embeds(obs)
    assert embeds.shape[:2] == valid.shape == (3, 8 + 6 + 1)
    torch.testing.assert_close(valid[:, 8:14], obs.text_valid)
    assert inputs.state_position == 14
    torch.testing.assert_close(embeds[:, 14], model.state_proj(obs.state))
    torch.testing.assert_close(embeds[:, 8:14], model.backbone.embed(obs.text_ids))
    question_embeds, _, question_inputs = model.prefix_embeds(questions(cameras=("a", "b")))
    assert question_embeds.shape[1] == 8 + 6 and question_inputs.state_position is None


def test_cached_prefix_decoding_logits_equal_the_full_pass():
    torch.manual_seed(1)
    model = tiny_vla().eval()
    obs = batch().observation
    tokens = torch.randint(0, 33, (3, 12))  # bins, with 32 = hidden
    head = model.head
    with torch.no_grad():
        prefix = model.encode_prefix(obs)
        cached = head.vocab.bin_logits(model.target_hidden(prefix, head.embed(tokens)))
        full = model.full_pass(obs, head.embed(tokens), train=False)[0][:, -12:]
        full = head.vocab.bin_logits(full)
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=0)


def test_autoregressive_kv_cache_matches_recomputing_each_step():
    """Each AR step's logits equal a fresh pass over [prefix | chosen tokens | hidden token k]."""
    torch.manual_seed(2)
    model = tiny_vla().eval()
    obs = batch().observation
    chosen = torch.randint(0, 32, (3, 12))
    head = model.head
    with torch.no_grad():
        prefix = model.encode_prefix(obs)
        step = head._autoregressive_step(prefix)
        embeds, valid, _ = model.prefix_embeds(obs)
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
                inputs_embeds=torch.cat([embeds, head.embed(tokens)], 1),
                position_ids=positions,
                attention_mask=mask,
                return_logits=False,
            )
            torch.testing.assert_close(ar, head.vocab.bin_logits(out.hidden_states[:, -1]), atol=1e-5, rtol=0)


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


def test_discrete_model_overfits_four_chunks_to_within_one_bin():
    torch.manual_seed(0)
    model = tiny_vla(cameras=("a",))
    data = batch(cameras=("a",), size=4)
    data.actions_is_pad[:] = False
    overfit(model, data, 250, model.compute_loss)
    for steps in (1, 4):
        actions, _ = model.sample_actions(data.observation, DecodeConfig(steps=steps))
        assert ((actions - data.actions).abs() <= 2 / 32).all(), steps  # one bin of [-1, 1] / 32


def test_flow_model_overfits_four_chunks():
    torch.manual_seed(0)
    model = tiny_vla("flow", cameras=("a",))
    data = batch(cameras=("a",), size=4)
    data.actions_is_pad[:] = False
    overfit(model, data, 400, model.compute_loss, anneal=True)  # flow regression wants a decaying rate
    actions, _ = model.sample_actions(
        data.observation, DecodeConfig(), generator=torch.Generator().manual_seed(0)
    )
    assert (actions - data.actions).abs().mean() < 0.1


def test_vqa_answers_through_the_same_backbone():
    torch.manual_seed(0)
    model = tiny_vla(cameras=("scene",))
    obs = questions(4)
    answers = torch.tensor([[10, 2, 2], [11, 12, 2], [13, 2, 2], [14, 15, 16]])  # padded with EOS (2)
    overfit(model, VQABatch(obs, answers), 300, model.compute_vqa_loss)
    result = model.answer(obs, DecodeConfig(steps=3))
    assert torch.equal(result.tokens, answers) and result.forwards == 3
    assert (result.tokens < TEXT.vocab_size).all()  # answers are text tokens only


def test_questions_sharing_an_image_equal_each_with_its_own_copy():
    """obs.image_index reads each image once for several questions: the answer loss and the
    answers equal those of a batch where every question has its own copy of the image."""
    torch.manual_seed(0)
    model = tiny_vla(cameras=("scene",)).eval()  # eval: batch norm as at inference
    shared = questions(5)
    index = torch.tensor([0, 0, 1, 1, 1])  # 5 questions about 2 images
    images = {"scene": shared.images["scene"][:2]}
    grouped = type(shared)(images, shared.text_ids, shared.text_valid, None, index)
    copied = type(shared)({"scene": images["scene"][index]}, shared.text_ids, shared.text_valid)
    answers = torch.randint(4, 50, (5, 3))
    loss, _ = model.compute_vqa_loss(VQABatch(grouped, answers), generator=torch.Generator().manual_seed(2))
    plain, _ = model.compute_vqa_loss(VQABatch(copied, answers), generator=torch.Generator().manual_seed(2))
    assert float(loss.detach()) == pytest.approx(float(plain.detach()), rel=1e-5)
    decode = DecodeConfig(steps=3)
    torch.testing.assert_close(model.answer(grouped, decode).tokens, model.answer(copied, decode).tokens)


def test_bad_model_configs():
    with pytest.raises(ValueError, match="chunk_size"):
        DiffusionVLAConfig(chunk_size=0)
    with pytest.raises(ValueError, match="state_clip"):
        DiffusionVLAConfig(state_clip=0.5)


def test_core_config_holds_only_the_architecture():
    """At most 12 fields: research options live under `adapters`, head options under `head`."""
    import dataclasses

    names = [f.name for f in dataclasses.fields(DiffusionVLAConfig)]
    assert len(names) <= 12 and {"head", "adapters", "vision", "backbone"} <= set(names)


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
    obs = questions(3)
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
