"""Between raw data and the model: text tokens, answer blocks, quantile normalisation, and the
`Processor` that turns dataset samples and raw observations into typed batches (training and the
policy share it)."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from dvla.types import ActionBatch, Observation, PerceptionFrames, VQABatch

# Names of the state and action statistics in a checkpoint (whatever the dataset calls the features),
# and of the simulator-state target's (the sim_state adapter).
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
    longest = max(len(ids) for ids in encoded)
    if longest > max_tokens:
        warnings.warn(
            f"a text of {longest} tokens is cut to the model's max_text_tokens={max_tokens}: "
            f"{texts[[len(ids) for ids in encoded].index(longest)][:60]!r}...",
            stacklevel=2,
        )
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


def to_float_chw(image: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) float in [0, 1], or (B, H, W, 3) uint8 camera frames -> (B, 3, H, W) float."""
    image = torch.as_tensor(image)
    if image.dtype == torch.uint8:
        return image.permute(0, 3, 1, 2).float() / 255
    return image.float()


class Processor:
    """Raw observations and collated dataset samples -> the model's typed inputs, on `device`.

    `config` is the model's DiffusionVLAConfig (text lengths, state clip); `stats` the run's
    normalisation statistics (a VQA-only run has no robot statistics and cannot act)."""

    def __init__(self, tokenizer, stats: dict, config, device: torch.device | str = "cpu"):
        self.tokenizer, self.stats, self.config = tokenizer, stats, config
        self.device = torch.device(device)
        self.acts = STATE_KEY in stats and ACTION_KEY in stats
        self.state_norm = QuantileNormalizer(stats, STATE_KEY, clip=config.state_clip) if self.acts else None
        self.action_norm = QuantileNormalizer(stats, ACTION_KEY) if self.acts else None
        self.sim_state_norm = QuantileNormalizer(stats, SIM_STATE_KEY) if SIM_STATE_KEY in stats else None

    def observation(self, images: dict, texts: list[str], state) -> Observation:
        """images {camera: (B, 3, H, W) float in [0, 1] or (B, H, W, 3) uint8}, raw state (B, S) or
        None for questions."""
        images = {name: to_float_chw(img).to(self.device) for name, img in images.items()}
        ids, valid = encode_text(self.tokenizer, texts, self.config.max_text_tokens)
        if state is not None:
            if not self.acts:
                raise ValueError("this checkpoint was trained on VQA only (no robot data): it cannot act")
            state = self.state_norm.normalize(torch.as_tensor(state, dtype=torch.float32)).to(self.device)
        return Observation(images, ids.to(self.device), valid.to(self.device), state)

    def action_batch(self, sample: dict) -> ActionBatch:
        """A collated robot batch (dvla.data.LeRobotChunks) -> the model's training batch."""
        obs = self.observation(sample["images"], sample["task"], sample["state"])
        actions = self.action_norm.normalize(sample["actions"].float()).to(self.device)
        targets = {}
        if "sim_state" in sample:
            targets["sim_state"] = self.sim_state(sample)
        if "perception" in sample:  # scenes for the simulator-state target only
            frames = sample["perception"]
            images = {name: to_float_chw(img).to(self.device) for name, img in frames["images"].items()}
            targets["sim_state_frames"] = PerceptionFrames(images, self.sim_state(frames))
        return ActionBatch(obs, actions, sample["actions_is_pad"].to(self.device), targets)

    def sim_state(self, sample: dict) -> torch.Tensor:
        """The sample's simulator state (B, E) normalised with the run's statistics."""
        if "sim_state" not in sample:
            raise ValueError("perception frames need a simulator state: set perception.sim_state_key")
        if self.sim_state_norm is None:
            raise ValueError("the batch has a simulator state but the run's statistics have none")
        return self.sim_state_norm.normalize(sample["sim_state"].float()).to(self.device)

    def vqa_batch(self, sample: dict) -> VQABatch:
        """A collated VQA batch (dvla.data.VQAScenes) -> the model's VQA training batch; the
        adapters' targets ("scene_map", "referents") pass through."""
        obs = self.observation(sample["images"], sample["question"], None)
        if "image_index" in sample:  # questions grouped by image (VQAScenesByImage)
            obs.image_index = sample["image_index"].to(self.device)
        answers = encode_answers(self.tokenizer, sample["answer"], self.config.answer_tokens)
        targets = {k: sample[k].to(self.device) for k in TARGET_KEYS if k in sample}
        return VQABatch(obs, answers.to(self.device), targets)

    def robot_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Normalised actions (..., D) -> robot units."""
        return self.action_norm.unnormalize(actions.float())

    def answers(self, ids: torch.Tensor) -> list[str]:
        return decode_answers(self.tokenizer, ids)


TARGET_KEYS = ("scene_map", "referents")  # adapters' VQA targets a sample may carry
