"""Question-pointed object tokens, for questions that compare two named objects.

"Is the red cube left of the blue sphere?" needs both objects found, then their positions compared.
Attention in the backbone has to discover that chain with no reward for any single link, and
spatial questions stayed at chance in 10,000 steps (see the README's VQA results). Here two pointers
read off the question (the first and the second object it names) each attend over the image tokens,
a small head reads where each picked object is (image column, row, depth), and the offset between
the two, gated by the question, feeds a comparison. The two picked tokens and the comparison become
three more prefix tokens. The pointers' attention logits and the places are returned so that
training can teach them (`referent_weight`, targets from the scene's ground truth); at run time the
module finds and places the objects itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dvla.vision.film import TextPooling

POINTERS = 2  # the first and the second object a question names
PLACE_AXES = 3  # image column, image row, depth


@dataclass
class Referents:
    tokens: torch.Tensor  # (B, 3, d): first object, second object, comparison
    logits: torch.Tensor  # (B, 2, N): each pointer's attention logits over the image tokens
    places: torch.Tensor  # (B, 2, 3): where each picked object is, in grid cells


class ReferentPointers(nn.Module):
    """image tokens (B, N, d), text embeddings (B, L, d) with validity (B, L) -> `Referents`."""

    def __init__(self, width: int, max_len: int, heads: int = 4, hidden: int = 256):
        super().__init__()
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
