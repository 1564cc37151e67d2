"""The diffusion backbone: config checks, save/load, prefix KV cache, init from causal LMs, loss."""

import pytest
import torch
from conftest import tiny_causal_lm

from dvla.backbone.configuration import DiffusionLMConfig
from dvla.backbone.layout import full_mask, prefix_mask, prefix_positions, target_mask, target_positions
from dvla.backbone.loss import masked_diffusion_loss
from dvla.backbone.modeling import DiffusionLM
from dvla.backbone.pretrained import from_causal_lm
from dvla.backbone.schedule import mask_tokens, sample_times


def tiny_config(**overrides) -> DiffusionLMConfig:
    values = dict(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        mask_token_id=49,
    )
    return DiffusionLMConfig(**{**values, **overrides})


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        tiny_config(num_key_value_heads=3)
    with pytest.raises(ValueError, match="mask_token_id=50 is outside"):
        tiny_config(mask_token_id=50)
    with pytest.raises(ValueError, match="even"):
        tiny_config(head_dim=7)


def test_save_load_round_trip_is_bit_exact(tmp_path):
    torch.manual_seed(0)
    model = DiffusionLM(tiny_config()).eval()
    ids = torch.randint(0, 50, (2, 9))
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    loaded = DiffusionLM.from_pretrained(tmp_path).eval()
    for key, value in model.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key
    assert torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits)


def _prefix_and_target(batch=3, p=7, t=5):
    prefix = torch.randint(0, 48, (batch, p))
    valid = torch.ones(batch, p, dtype=torch.bool)
    valid[1, -2:] = False  # a shorter prompt, padded
    valid[2, -4:] = False
    target = torch.randint(0, 48, (batch, t))
    return prefix, valid, target


def test_cached_prefix_gives_the_same_logits_as_one_full_forward():
    torch.manual_seed(1)
    model = DiffusionLM(tiny_config()).eval()
    prefix, valid, target = _prefix_and_target()
    t = target.shape[1]
    with torch.no_grad():
        ids = torch.cat([prefix, target], 1)
        positions = torch.cat([prefix_positions(valid), target_positions(valid, t)], 1)
        full = model(input_ids=ids, position_ids=positions, attention_mask=full_mask(valid, t)).logits[:, -t:]
        cache = model(
            input_ids=prefix, position_ids=prefix_positions(valid), attention_mask=prefix_mask(valid)
        ).past_key_values
        cached = model(
            input_ids=target,
            position_ids=target_positions(valid, t),
            attention_mask=target_mask(valid, t),
            past_key_values=cache,
        ).logits
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=0)


def test_prefix_never_sees_the_target():
    torch.manual_seed(2)
    model = DiffusionLM(tiny_config()).eval()
    prefix, valid, target = _prefix_and_target()
    t = target.shape[1]
    positions = torch.cat([prefix_positions(valid), target_positions(valid, t)], 1)
    with torch.no_grad():
        outs = [
            model(
                input_ids=torch.cat([prefix, tgt], 1),
                position_ids=positions,
                attention_mask=full_mask(valid, t),
            )
            for tgt in (target, torch.randint(0, 48, target.shape))
        ]
    p = prefix.shape[1]
    assert torch.equal(outs[0].hidden_states[:, :p], outs[1].hidden_states[:, :p])
    assert not torch.equal(outs[0].hidden_states[:, p:], outs[1].hidden_states[:, p:])


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_init_from_a_tiny_causal_lm_checkpoint(tmp_path, kind):
    """With a causal mask our backbone reproduces the source causal LM's logits exactly."""
    torch.manual_seed(3)
    source = tiny_causal_lm(kind)
    source.save_pretrained(tmp_path)
    model = from_causal_lm(tmp_path).eval()
    assert model.config.vocab_size == 65 and model.config.mask_token_id == 64
    assert from_causal_lm(tmp_path, new_tokens=9).config.mask_token_id == 72  # bins, then [MASK]
    ids = torch.randint(0, 64, (2, 10))
    causal = torch.ones(10, 10, dtype=torch.bool).tril()[None, None]
    with torch.no_grad():
        ours = model(input_ids=ids, attention_mask=causal).logits[..., :64]
        theirs = source(input_ids=ids).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_init_from_a_llama3_model_keeps_its_rope_scaling(tmp_path):
    """Llama 3's long-context RoPE (its frequencies rescaled) is reproduced, and survives saving."""
    from dvla.backbone.modeling import DiffusionLM

    torch.manual_seed(4)
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}  # fmt: skip
    source = tiny_causal_lm("llama", rope_scaling=scaling)
    source.save_pretrained(tmp_path / "source")
    model = from_causal_lm(tmp_path / "source").eval()
    assert model.config.llama3_rope["factor"] == 8.0
    ids = torch.randint(0, 64, (2, 12))
    causal = torch.ones(12, 12, dtype=torch.bool).tril()[None, None]

    def logits(m):
        with torch.no_grad():
            return m(input_ids=ids, attention_mask=causal).logits[..., :64]

    with torch.no_grad():
        theirs = source(input_ids=ids).logits
    torch.testing.assert_close(logits(model), theirs, atol=1e-5, rtol=1e-5)
    model.save_pretrained(tmp_path / "ours")
    torch.testing.assert_close(
        logits(DiffusionLM.from_pretrained(tmp_path / "ours").eval()), theirs, atol=1e-5, rtol=1e-5
    )
    rotary = model.model.rotary
    scaled = rotary.inv_freq.clone()
    rotary.llama3 = None  # plain RoPE with the same weights: the scaling matters at these positions
    rotary.inv_freq.copy_(rotary.compute_inv_freq())
    assert torch.equal(scaled[:1], rotary.inv_freq[:1]) and (scaled[2:] < rotary.inv_freq[2:] / 7.9).all()
    assert (logits(model) - theirs).abs().max() > 1e-4  # 10x the tolerance it matched within


def test_init_from_an_unsupported_model_is_a_clear_error(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="supported causal LMs"):
        from_causal_lm(tmp_path)


def test_times_are_stratified_and_masking_follows_t():
    t = sample_times(8, eps=0.01, generator=torch.Generator().manual_seed(0))
    gaps = t.sort().values.diff()
    torch.testing.assert_close(gaps, torch.full_like(gaps, 0.99 / 8))
    assert t.min() >= 0.01 and t.max() < 1.0
    targets = torch.zeros(4, 20000, dtype=torch.long)
    times = torch.tensor([0.1, 0.4, 0.7, 0.95])
    noisy, masked = mask_tokens(targets, times, mask_token_id=7, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(masked.float().mean(1), times, atol=0.01, rtol=0)
    assert torch.equal(noisy == 7, masked)
    maskable = torch.zeros_like(masked)
    assert not mask_tokens(targets, times, 7, maskable=maskable)[1].any()


def test_loss_is_cross_entropy_on_hidden_tokens_weighted_by_one_over_t():
    torch.manual_seed(4)
    logits = torch.randn(2, 6, 10)
    targets = torch.randint(0, 10, (2, 6))
    masked = torch.tensor([[1, 0, 1, 0, 0, 0], [0, 1, 1, 1, 0, 0]], dtype=torch.bool)
    t = torch.tensor([0.5, 0.25])
    loss, metrics = masked_diffusion_loss(logits, targets, masked, t)
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(
        2, 6
    )
    expected = (ce[0][masked[0]].sum() / 0.5 + ce[1][masked[1]].sum() / 0.25) / 12
    torch.testing.assert_close(loss, expected)
    assert metrics["mask_fraction"] == pytest.approx(5 / 12)
    perfect = torch.nn.functional.one_hot(targets, 10).float() * 50
    assert masked_diffusion_loss(perfect, targets, masked, t)[0] < 1e-6
