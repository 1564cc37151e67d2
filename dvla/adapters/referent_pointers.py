"""Referent pointers: question-pointed object tokens, for questions that compare two named objects.

"Is the red cube left of the blue sphere?" needs both objects found, then their positions compared.
Attention in the backbone has to discover that chain with no reward for any single link, and
spatial questions stayed at chance in 10,000 steps. Here two pointers read off the question (the
first and the second object it names) each attend over the image tokens, a small head reads where
each picked object is (image column, row, depth), and the offset between the two, gated by the
question, feeds a comparison. The two picked tokens and the comparison become three more prefix
tokens after the image tokens. With `weight` > 0 the pointers, places and comparison are trained
against the scene's ground truth (`dvla.sim.vqa_targets.referent_targets`); at run time the module
finds and places the objects itself. Questions only. Measured effect: docs/adapters.md#referent_pointers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dvla.adapters.base import Adapter, Applies, CoreSpec, LossInputs, PrefixInputs, Slot, register_adapter
from dvla.adapters.scene_map import square_grid
from dvla.adapters.text_pooling import TextPooling

POINTERS = 2  # the first and the second object a question names
PLACE_AXES = 3  # image column, image row, depth


@dataclass
class Referents:
    tokens: torch.Tensor  # (B, 3, d): first object, second object, comparison
    logits: torch.Tensor  # (B, 2, N): each pointer's attention logits over the image tokens
    places: torch.Tensor  # (B, 2, 3): where each picked object is, in grid cells


@dataclass
class ReferentPointersConfig:
    """Two question-pointed object tokens and their comparison."""

    # Weight of the pointers' targets (training only, never inputs, on questions that name two
    # objects; from the scene's ground truth): each pointer's attention against its object's cell,
    # the places against the objects' places, the answer read off the comparison token.
    # 0 leaves the pointers to the answer loss.
    weight: float = 1.0
    heads: int = 4
    hidden: int = 256

    def __post_init__(self):
        if self.weight < 0 or self.heads < 1 or self.hidden < 1:
            raise ValueError("adapters.referent_pointers needs weight >= 0, heads >= 1 and hidden >= 1")


@register_adapter("referent_pointers", ReferentPointersConfig)
class ReferentPointers(Adapter):
    """image tokens (B, N, d), text embeddings (B, L, d) with validity (B, L) -> `Referents`."""

    applies_to = Applies.QUESTION
    slot = Slot.AFTER_IMAGES

    def __init__(self, config: ReferentPointersConfig, core: CoreSpec):
        super().__init__(config, core)
        width, max_len, heads, hidden = core.width, core.max_text_tokens, config.heads, config.hidden
        self.grid = (
            square_grid(core.tokens_per_camera, "adapters.referent_pointers") if config.weight > 0 else None
        )
        self.position = nn.Parameter(torch.randn(max_len, width) * 0.02)
        # one self-attention layer over the question, so "red" in the first name and "red" in the
        # second one differ before the pointers pick them out
        self.context = nn.TransformerEncoderLayer(
            width, heads, 2 * width, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.word_norm = nn.LayerNorm(width)
        self.phrase_queries = nn.Parameter(torch.randn(POINTERS, width) * width**-0.5)
        self.to_pointer = nn.Linear(width, width)
        self.image_norm = nn.LayerNorm(width)
        self.keys = nn.Linear(width, width)
        self.values = nn.Linear(width, width)
        # where the picked object is; it reads the pointer's phrase too, since two objects in one
        # cell share a token
        self.locate = nn.Sequential(nn.Linear(2 * width, hidden), nn.GELU(), nn.Linear(hidden, PLACE_AXES))
        # The answer is an interaction: "left of" is yes when the first object's column is smaller,
        # "right of" when it is larger, so neither the offset nor the relation word alone says
        # anything, and an MLP on their concatenation starts at a saddle (an XOR). The product of the
        # offset with a gate read off the question is that interaction, linear from the first step.
        self.gate = nn.Linear(width, PLACE_AXES)
        self.compare = nn.Sequential(
            nn.Linear(3 * width + PLACE_AXES, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, width),
        )
        self.out_norm = nn.LayerNorm(width)
        self.mean_words = TextPooling(width)  # the mean of the valid words: the whole question

    def forward(self, image_tokens: torch.Tensor, text: torch.Tensor, valid: torch.Tensor) -> Referents:
        valid = valid.to(text.device)
        padding = ~valid & valid.any(1, keepdim=True)  # a text with no valid token attends to all
        words = self.context(text + self.position[: text.shape[1]], src_key_padding_mask=padding)  # (B, L, d)
        words = self.word_norm(words)
        scores = torch.einsum("bld,pd->bpl", words, self.phrase_queries.to(words.dtype))  # (B, 2, L)
        scores = scores.masked_fill(~valid[:, None], float("-inf"))
        phrases = torch.einsum("bpl,bld->bpd", scores.float().softmax(-1).nan_to_num().to(words.dtype), words)
        pointers = self.to_pointer(phrases)  # (B, 2, d)
        x = self.image_norm(image_tokens)
        logits = torch.einsum("bpd,bnd->bpn", pointers, self.keys(x)) * x.shape[-1] ** -0.5  # (B, 2, N)
        picked = torch.einsum("bpn,bnd->bpd", logits.float().softmax(-1).to(x.dtype), self.values(x))
        question = self.mean_words(words, valid)  # (B, d)
        places = self.locate(torch.cat([picked, phrases], dim=-1))  # (B, 2, 3)
        gated = (places[:, 0] - places[:, 1]) * self.gate(question)  # (B, 3)
        compared = self.compare(torch.cat([picked[:, 0], picked[:, 1], question, gated], dim=-1))  # (B, d)
        tokens = torch.cat([picked, compared[:, None]], dim=1)  # (B, 3, d)
        return Referents(self.out_norm(tokens), logits, places)

    def prepare(self, inputs: PrefixInputs) -> None:
        """The pointers read the encoder's tokens, before any modulation."""
        inputs.found[self.name] = self(inputs.images, inputs.text, inputs.obs.text_valid)

    def prefix_tokens(self, inputs: PrefixInputs) -> torch.Tensor:
        return inputs.found[self.name].tokens  # (B, 3, d)

    def vqa_targets(self) -> dict[str, dict]:
        return {"referents": {"grid": self.grid}} if self.grid is not None else {}

    def aux_loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]] | None:
        """For the questions that name a pair (targets (B, 2, 4): cell, then column, row, depth; cell
        -1 elsewhere): the cross-entropy of each pointer's attention over the scene camera's grid
        against its object's cell, the squared error of the place read for it, and the
        cross-entropy of the answer's first token read off the comparison token through the answer
        head (deep supervision: the answer is an interaction of relation word and positions that
        the answer loss alone, four layers on, did not teach)."""
        targets = inputs.batch.targets.get("referents")
        if self.grid is None or targets is None:
            return None
        found, answers = inputs.prefix.found[self.name], inputs.batch.answer_ids
        k = self.core.tokens_per_camera
        targets = targets.to(found.logits.device)
        asks = targets[:, 0, 0] >= 0  # (B,)
        if not asks.any():
            zero = found.tokens.sum() * 0.0 + found.logits.sum() * 0.0 + found.places.sum() * 0.0
            return zero, {"pointer_ce": 0.0, "place_mse": 0.0, "comparison_ce": 0.0}
        logits = found.logits[asks][..., :k].float().flatten(0, 1)  # (B'*2, K)
        pointed = F.cross_entropy(logits, targets[asks][..., 0].long().flatten())
        placed = (found.places[asks].float() - targets[asks][..., 1:]).square().mean()
        compared = F.cross_entropy(inputs.model.text_logits(found.tokens[asks, 2]).float(), answers[asks, 0])
        metrics = {
            "pointer_ce": float(pointed.detach()),
            "place_mse": float(placed.detach()),
            "comparison_ce": float(compared.detach()),
        }
        return pointed + placed + compared, metrics
