"""Between raw data and the model: text tokens, answer blocks and quantile normalisation."""

from __future__ import annotations

import numpy as np
import torch

# Names of the state and action statistics in a checkpoint (whatever the dataset calls the features),
# and of the auxiliary simulator-state target's (see DiffusionVLAConfig.sim_state_dim).
STATE_KEY, ACTION_KEY, SIM_STATE_KEY = "observation.state", "action", "sim.state"
# Narrowest q01-q99 range of a simulator-state dimension (metres for positions): a narrower one is
# solver noise (a resting puck's quaternion wobbles by 1e-4) that must not become a full-scale target.
SIM_STATE_MIN_SPAN = 0.05


def encode_text(tokenizer, texts: list[str], max_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Instructions or questions -> ids (B, L) padded with the tokenizer's pad token, valid mask (B, L)."""
    encoded = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    length = max(1, min(max_tokens, max(len(ids) for ids in encoded)))
    ids = torch.full((len(texts), length), tokenizer.pad_token_id, dtype=torch.long)
    valid = torch.zeros(len(texts), length, dtype=torch.bool)
    for i, seq in enumerate(encoded):
        seq = seq[:length]  # longer text is cut to max_tokens
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        valid[i, : len(seq)] = True
    return ids, valid


def encode_answers(tokenizer, answers: list[str], length: int) -> torch.Tensor:
    """Answers -> a fixed block (B, length): the answer tokens, then EOS to the end."""
    out = torch.full((len(answers), length), tokenizer.eos_token_id, dtype=torch.long)
    for i, answer in enumerate(answers):
        ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
        if len(ids) > length:
            raise ValueError(
                f"answer {answer!r} has {len(ids)} tokens but the answer block holds {length}; "
                "raise model.answer_tokens"
            )
        out[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


def decode_answers(tokenizer, ids: torch.Tensor) -> list[str]:
    """Answer blocks (B, A) -> strings, stopping at the first EOS."""
    texts = []
    for row in ids.tolist():
        if tokenizer.eos_token_id in row:
            row = row[: row.index(tokenizer.eos_token_id)]
        texts.append(tokenizer.decode(row, skip_special_tokens=True).strip())
    return texts


class QuantileNormalizer:
    """Maps a feature's q01..q99 to [-1, 1] and back; values beyond are clipped to [-clip, clip]."""

    def __init__(self, stats: dict[str, dict[str, np.ndarray]], key: str, clip: float = 1.0):
        if key not in stats or not {"q01", "q99"} <= set(stats[key]):
            raise KeyError(
                f"normalisation stats for {key!r} (q01 and q99) are missing; have {sorted(stats)}. "
                "Stats come from the training dataset (dvla.data.low_dim_stats)."
            )
        if clip < 1.0:
            raise ValueError(f"the normalised range must include [-1, 1]: clip must be >= 1, got {clip}")
        self.key, self.clip = key, clip
        self.low = torch.as_tensor(np.asarray(stats[key]["q01"]), dtype=torch.float32)
        self.span = (torch.as_tensor(np.asarray(stats[key]["q99"]), dtype=torch.float32) - self.low).clamp(
            min=1e-8
        )

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.low.numel():
            raise ValueError(f"{self.key} has {x.shape[-1]} dimensions, its stats {self.low.numel()}")
        return ((x - self.low.to(x.device)) / self.span.to(x.device) * 2 - 1).clamp(-self.clip, self.clip)

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x + 1) / 2 * self.span.to(x.device) + self.low.to(x.device)
