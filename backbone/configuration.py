"""Configuration of the masked-diffusion transformer backbone (a transformers PretrainedConfig)."""

from __future__ import annotations

from transformers import PretrainedConfig


class DiffusionLMConfig(PretrainedConfig):
    """A Llama-shaped bidirectional transformer trained as a masked diffusion LM.

    Weight names match Llama/Qwen2 causal LMs (`model.layers.N.self_attn.q_proj`, ...), so such a
    checkpoint can initialise it (see `DiffusionLM.from_causal_lm`). Special token ids come from here,
    never from literals in the code.
    """

    model_type = "dvla_diffusion_lm"

    def __init__(
        self,
        vocab_size: int = 1024,
        hidden_size: int = 256,
        intermediate_size: int = 768,
        num_hidden_layers: int = 4,
        num_attention_heads: int = 4,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 10000.0,
        llama3_rope: dict | None = None,
        max_position_embeddings: int = 2048,
        attention_bias: bool = False,
        attention_out_bias: bool = False,
        initializer_range: float = 0.02,
        mask_token_id: int | None = None,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        tie_word_embeddings: bool = False,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        # Llama 3's RoPE frequency scaling: {factor, low_freq_factor, high_freq_factor,
        # original_max_position_embeddings}; None = plain RoPE
        self.llama3_rope = dict(llama3_rope) if llama3_rope else None
        self.max_position_embeddings = max_position_embeddings
        self.attention_bias = attention_bias
        self.attention_out_bias = attention_out_bias
        self.initializer_range = initializer_range
        self.mask_token_id = mask_token_id
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        self._check()

    def _check(self) -> None:
        keys = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
        if self.llama3_rope is not None and set(self.llama3_rope) != keys:
            raise ValueError(f"llama3_rope needs exactly {sorted(keys)}, got {sorted(self.llama3_rope)}")
        if self.head_dim <= 0 or self.head_dim % 2:
            raise ValueError(f"head_dim must be a positive even number (RoPE), got {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        for name in ("mask_token_id", "pad_token_id", "bos_token_id", "eos_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"{name}={value} is outside the vocabulary [0, {self.vocab_size})")
