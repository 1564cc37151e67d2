"""The masked-diffusion transformer: Llama-shaped (RoPE, RMSNorm, SwiGLU, SDPA) but bidirectional.

Attention is given as an explicit boolean mask, so the caller decides the layout: dvla's VLA uses a
prefix (images, text, state) that attends within itself and a target block (actions or answer) that
attends to prefix and target. Because the prefix never looks at the target, its keys/values can be
computed once and reused exactly at every denoising step (`past_key_values`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init

from dvla.backbone.configuration import DiffusionLMConfig

KVCache = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (B, H_kv, L, head_dim) keys and values


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, theta: float, llama3: dict | None = None):
        super().__init__()
        self.head_dim, self.theta, self.llama3 = head_dim, theta, llama3
        self.register_buffer("inv_freq", self.compute_inv_freq(), persistent=False)

    def compute_inv_freq(self) -> torch.Tensor:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim
        inv_freq = 1.0 / (self.theta**exponents)  # (hd/2,)
        return inv_freq if self.llama3 is None else llama3_scaled(inv_freq, **self.llama3)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq  # (B, L, hd/2)
        angles = torch.cat([freqs, freqs], dim=-1)  # (B, L, hd)
        return angles.cos()[:, None], angles.sin()[:, None]  # (B, 1, L, hd)


def llama3_scaled(inv_freq: torch.Tensor, factor: float, low_freq_factor: float, high_freq_factor: float,
                  original_max_position_embeddings: int) -> torch.Tensor:  # fmt: skip
    """Llama 3's long-context RoPE: frequencies whose wavelength exceeds the original context /
    low_freq_factor are divided by `factor`, those below context / high_freq_factor are kept, and
    the band between blends the two linearly in context / wavelength."""
    wavelength = 2 * math.pi / inv_freq
    context = original_max_position_embeddings
    blend = ((context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)).clamp(0, 1)
    return (1 - blend) * inv_freq / factor + blend * inv_freq  # blend 0: long waves, 1: short ones


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return (x * cos + _rotate_half(x) * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: DiffusionLMConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        d = config.hidden_size
        self.q_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, d, bias=config.attention_out_bias)

    def forward(self, x, cos, sin, mask, past: tuple[torch.Tensor, torch.Tensor] | None):
        b, length, _ = x.shape
        q = self.q_proj(x).view(b, length, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, L, hd)
        k = self.k_proj(x).view(b, length, self.n_kv, self.head_dim).transpose(1, 2)  # (B, Hkv, L, hd)
        v = self.v_proj(x).view(b, length, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)  # (B, Hkv, P+L, hd)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.n_kv != self.n_heads)
        out = out.transpose(1, 2).reshape(b, length, self.n_heads * self.head_dim)  # (B, L, H*hd)
        return self.o_proj(out), (k, v)


class MLP(nn.Module):
    def __init__(self, config: DiffusionLMConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: DiffusionLMConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, mask, past):
        attn, kv = self.self_attn(self.input_layernorm(x), cos, sin, mask, past)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class DiffusionLMPreTrainedModel(PreTrainedModel):
    config_class = DiffusionLMConfig
    base_model_prefix = "model"
    _no_split_modules = ("DecoderLayer",)

    def _init_weights(self, module: nn.Module) -> None:
        # transformers' init functions skip tensors already loaded from a checkpoint
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, std=std)
        elif isinstance(module, RMSNorm):
            init.ones_(module.weight)
        elif isinstance(module, RotaryEmbedding):  # a non-persistent buffer: rebuilt after loading
            init.copy_(module.inv_freq, module.compute_inv_freq())


class DiffusionLMModel(DiffusionLMPreTrainedModel):
    """Embeddings + transformer layers + final norm (no LM head)."""

    def __init__(self, config: DiffusionLMConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.llama3_rope)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: KVCache | None = None,
    ) -> tuple[torch.Tensor, KVCache]:
        """inputs_embeds (B, L, d), position_ids (B, L), attention_mask bool (B, 1, L, P+L) where True
        means "may attend" (P = cached length). Returns hidden states (B, L, d) and every layer's KV."""
        cos, sin = self.rotary(position_ids)
        x, cache = inputs_embeds, []
        for i, layer in enumerate(self.layers):
            x, kv = layer(
                x, cos, sin, attention_mask, None if past_key_values is None else past_key_values[i]
            )
            cache.append(kv)
        return self.norm(x), cache


@dataclass
class DiffusionLMOutput:
    hidden_states: torch.Tensor  # (B, L, d) after the final norm
    past_key_values: KVCache  # keys/values of the cached part followed by these tokens
    logits: torch.Tensor | None = None  # (B, L, vocab) when asked for


class DiffusionLM(DiffusionLMPreTrainedModel):
    """The backbone with its LM head; `forward` takes token ids or embeddings and an explicit mask."""

    _tied_weights_keys: ClassVar[dict] = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: DiffusionLMConfig):
        super().__init__(config)
        self.model = DiffusionLMModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)  # (B, L, d)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: KVCache | None = None,
        return_logits: bool = True,
    ) -> DiffusionLMOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed(input_ids)
        b, length, _ = inputs_embeds.shape
        if position_ids is None:
            start = 0 if past_key_values is None else past_key_values[0][0].shape[2]
            position_ids = torch.arange(start, start + length, device=inputs_embeds.device).expand(b, -1)
        hidden, cache = self.model(inputs_embeds, position_ids, attention_mask, past_key_values)
        return DiffusionLMOutput(hidden, cache, self.lm_head(hidden) if return_logits else None)
