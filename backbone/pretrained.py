"""Initialise the diffusion backbone from a Hugging Face causal LM (Llama / Qwen2 / Mistral weights).

DiffuLLaMA-style adaptation: same weights, the causal mask replaced by dvla's prefix/target layout,
plus one new `[MASK]` token appended to the vocabulary (its embedding starts at the mean embedding).
"""

from __future__ import annotations

from pathlib import Path

import torch

from dvla.backbone.configuration import DiffusionLMConfig
from dvla.backbone.modeling import DiffusionLM

SUPPORTED = {"llama": "q/k/v/o bias = attention_bias", "qwen2": "q/k/v bias", "mistral": "no biases"}


def config_from_causal_lm(hf_config, new_tokens: int = 1) -> DiffusionLMConfig:
    """Our config for the same architecture, with `new_tokens` appended to the vocabulary (the last
    one is [MASK]; others, e.g. action bins, sit between the original vocabulary and it)."""
    kind = hf_config.model_type
    if kind not in SUPPORTED:
        raise ValueError(f"cannot adapt a {kind!r} model; supported causal LMs: {sorted(SUPPORTED)}")
    rope = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    kind_of_rope = rope.get("rope_type", rope.get("type", "default"))
    if kind_of_rope not in ("default", "llama3"):
        raise ValueError(
            f"RoPE scaling {kind_of_rope!r} is not supported; plain RoPE and Llama 3's ('llama3') are"
        )
    llama3 = None
    if kind_of_rope == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        llama3 = {key: rope[key] for key in keys}
    theta = rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    qkv_bias = {"llama": getattr(hf_config, "attention_bias", False), "qwen2": True, "mistral": False}[kind]
    return DiffusionLMConfig(
        vocab_size=hf_config.vocab_size + new_tokens,
        hidden_size=hf_config.hidden_size,
        intermediate_size=hf_config.intermediate_size,
        num_hidden_layers=hf_config.num_hidden_layers,
        num_attention_heads=hf_config.num_attention_heads,
        num_key_value_heads=hf_config.num_key_value_heads,
        head_dim=getattr(hf_config, "head_dim", None),
        rms_norm_eps=hf_config.rms_norm_eps,
        rope_theta=theta,
        llama3_rope=llama3,
        max_position_embeddings=hf_config.max_position_embeddings,
        attention_bias=qkv_bias,
        attention_out_bias=kind == "llama" and qkv_bias,
        mask_token_id=hf_config.vocab_size + new_tokens - 1,
        pad_token_id=hf_config.pad_token_id,
        bos_token_id=hf_config.bos_token_id,
        eos_token_id=hf_config.eos_token_id if isinstance(hf_config.eos_token_id, int) else None,
        tie_word_embeddings=getattr(hf_config, "tie_word_embeddings", False),
    )


def from_causal_lm(path: str | Path, new_tokens: int = 1, **load_kwargs) -> DiffusionLM:
    """Load a Llama/Qwen2/Mistral causal LM checkpoint (local folder or hub id) into a DiffusionLM,
    appending `new_tokens` rows (initialised to the mean embedding) to the vocabulary."""
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be >= 1 (the [MASK] token), got {new_tokens}")
    from transformers import AutoModelForCausalLM

    source = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, **load_kwargs)
    config = config_from_causal_lm(source.config, new_tokens)
    model = DiffusionLM(config)
    src = source.state_dict()
    ours = model.state_dict()
    missing = [k for k in ours if k not in src]
    unexpected = [k for k in src if k not in ours and not k.endswith("inv_freq")]
    if missing or unexpected:
        raise ValueError(f"weights do not match: missing {missing[:5]}, unexpected {unexpected[:5]}")
    with torch.no_grad():
        for key, tensor in ours.items():
            value = src[key]
            if key in ("model.embed_tokens.weight", "lm_head.weight"):
                n = value.shape[0]
                tensor[:n].copy_(value)
                tensor[n:].copy_(value.mean(0))  # new rows ([MASK], action bins) start at the mean
            else:
                tensor.copy_(value)
    return model


def pretrained_text(path: str | Path):
    """The causal LM's own tokenizer and the text vocabulary size of its embedding table."""
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.eos_token_id is None:
        raise ValueError(f"the tokenizer of {path} has no EOS token; dvla pads answers with it")
    return tokenizer, AutoConfig.from_pretrained(path).vocab_size
