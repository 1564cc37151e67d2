"""Configuration of the core model: the architecture only. Research options live in `adapters`."""

from __future__ import annotations

from dataclasses import dataclass, field

from dvla.action_head import DiscreteHeadConfig, HeadConfig
from dvla.adapters import AdaptersConfig
from dvla.vision.encoder import VisionConfig


@dataclass
class BackboneSize:
    """Size of a backbone trained from scratch (ignored when `init_from` names a causal LM)."""

    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int | None = None
    # A Llama/Qwen2/Mistral causal LM (folder or hub id) to adapt instead (DiffuLLaMA-style).
    init_from: str | None = None


@dataclass
class DiffusionVLAConfig:
    """Everything that shapes the model; saved with every checkpoint (`type` tags the class)."""

    type: str = "dvla"
    vision: VisionConfig = field(default_factory=VisionConfig)
    backbone: BackboneSize = field(default_factory=BackboneSize)
    # The action head, picked by `type`: discrete (bins filled by the parallel decoder, default)
    # or flow (H action queries, one backbone pass, a rectified flow integrated by a small head).
    head: HeadConfig = field(default_factory=DiscreteHeadConfig)
    # Research options (auxiliary targets, extra prefix tokens, ...), each off unless set;
    # docs/adapters.md describes each one and its measured effect.
    adapters: AdaptersConfig = field(default_factory=AdaptersConfig)
    # Action chunk length H and action / state dimensions D and S (None = the dataset's, filled in
    # when training starts).
    chunk_size: int = 16
    action_dim: int | None = None
    state_dim: int | None = None
    # The state is normalised so that the data's q01..q99 spans [-1, 1], then clipped to
    # [-state_clip, state_clip]: at 1 a hand beyond the demonstrated range reads as standing still.
    state_clip: float = 1.0
    # Instruction / question length in text tokens (longer text is cut).
    max_text_tokens: int = 32
    # Fixed answer block length for VQA (answers padded with EOS).
    answer_tokens: int = 4
    # Size of the text tokenizer trained on the data when the backbone starts from scratch.
    text_vocab_size: int = 1000

    def __post_init__(self):
        for name in ("chunk_size", "action_dim", "state_dim", "max_text_tokens", "answer_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.state_clip < 1.0:
            raise ValueError(f"state_clip must be >= 1 (the data's own range), got {self.state_clip}")
