"""DiffusionVLA: camera images + instruction + state -> an action chunk in a few parallel steps;
the same backbone answers questions about images.

Sequence: [prefix: image tokens | text tokens | state token] [target: H*D action tokens, H flow
queries, or A answer tokens]. The prefix attends within itself, the target to everything, so the
prefix KV cache is computed once per observation and reused at every denoising step.

Vocabulary (from scratch): [text tokens (V_text) | action bins | MASK].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dvla.action_head.flow import FlowMatchingHead
from dvla.action_head.tokenizer import ActionTokenizer
from dvla.backbone import layout
from dvla.backbone.configuration import DiffusionLMConfig
from dvla.backbone.decoder import DecodeConfig, decode, decode_autoregressive
from dvla.backbone.loss import masked_diffusion_loss
from dvla.backbone.modeling import DiffusionLM, KVCache
from dvla.backbone.schedule import mask_tokens, sample_times
from dvla.batch import ActionBatch, Observation, VQABatch
from dvla.model_config import DiffusionVLAConfig
from dvla.sim_state_head import (
    ReadingOffsets,
    VisionStateHead,
    emphasis_weights,
    parse_offsets,
    weighted_mse,
)
from dvla.vision.encoder import VisionEncoder
from dvla.vision.film import TextFiLM
from dvla.vision.referents import ReferentPointers
from dvla.vision.relation import RelationToken

RELATION_QUERIES = 4  # attention queries the relation token pools the question with


@dataclass
class TextSpecials:
    """Ids the model needs from the text tokenizer (looked up by name there, never literals)."""

    vocab_size: int
    pad_id: int
    eos_id: int

    @classmethod
    def from_tokenizer(cls, tokenizer) -> TextSpecials:
        return cls(len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)


@dataclass
class Prefix:
    cache: KVCache  # per layer keys/values of the prefix
    valid: torch.Tensor  # (B, P) bool


class DiffusionVLA(nn.Module):
    def __init__(
        self, config: DiffusionVLAConfig, text: TextSpecials, backbone_config: DiffusionLMConfig | None = None
    ):
        """`backbone_config` rebuilds a saved backbone exactly (checkpoints); otherwise the backbone
        starts from scratch, or from `config.backbone.init_from` (a causal LM) when set."""
        super().__init__()
        self.config, self.text = config, text
        bins = config.action_bins
        self.action_offset = text.vocab_size
        self.mask_id = text.vocab_size + bins
        size = config.backbone
        if backbone_config is not None:
            self.backbone = DiffusionLM(backbone_config)
        elif size.init_from:
            from dvla.backbone.pretrained import from_causal_lm

            self.backbone = from_causal_lm(size.init_from, new_tokens=bins + 1)
        else:
            self.backbone = DiffusionLM(
                DiffusionLMConfig(
                    vocab_size=text.vocab_size + bins + 1,
                    hidden_size=size.hidden_size,
                    intermediate_size=size.intermediate_size,
                    num_hidden_layers=size.num_hidden_layers,
                    num_attention_heads=size.num_attention_heads,
                    num_key_value_heads=size.num_key_value_heads,
                    mask_token_id=self.mask_id,
                    pad_token_id=text.pad_id,
                    eos_token_id=text.eos_id,
                )
            )
        if self.backbone.config.mask_token_id != self.mask_id:
            vocab = self.backbone.config.vocab_size
            raise ValueError(
                f"the backbone's vocabulary ({vocab}) does not fit {text.vocab_size} text tokens + {bins} "
                "action bins + [MASK]; use the text vocabulary of the backbone's own tokenizer"
            )
        d = self.backbone.config.hidden_size
        self.vision = VisionEncoder(config.vision, d)
        self.state_proj = nn.Sequential(nn.Linear(config.state_dim, d), nn.GELU(), nn.Linear(d, d))
        # stands in for the state token of samples whose state is hidden in training (state_dropout)
        self.state_hidden_embed = nn.Parameter(torch.zeros(d)) if config.state_dropout > 0 else None
        self.action_tokens = ActionTokenizer(
            -torch.ones(config.action_dim), torch.ones(config.action_dim), bins
        )
        self.action_step_embed = nn.Embedding(config.chunk_size, d)  # which step of the chunk
        self.action_dim_embed = nn.Embedding(config.action_dim, d)  # which action dimension
        nn.init.normal_(self.action_step_embed.weight, std=0.02)
        nn.init.normal_(self.action_dim_embed.weight, std=0.02)
        self.flow = (
            FlowMatchingHead(config.flow, d, config.action_dim, config.chunk_size)
            if config.action_head == "flow"
            else None
        )
        # Auxiliary: the simulator state read off the image tokens (or the state token), so that the
        # vision encoder learns to locate objects and goals (training only; never a policy input).
        self.sim_state_head = None
        if config.sim_state_dim and config.sim_state_reads == "vision":
            per_camera = self.vision.tokens_per_camera + config.vision.keypoints
            self.sim_state_head = VisionStateHead(config.vision.cameras, per_camera, d, config.sim_state_dim)
        elif config.sim_state_dim:
            self.sim_state_head = nn.Sequential(
                nn.Linear(d, d), nn.GELU(), nn.Linear(d, config.sim_state_dim)
            )
        self.scene_map_head = self._scene_map_head(d) if config.scene_map_weight > 0 else None
        self.text_film = (
            TextFiLM(d, config.text_film_queries, config.max_text_tokens) if config.text_film else None
        )
        self.relation = (
            RelationToken(d, RELATION_QUERIES, config.max_text_tokens) if config.relation_token else None
        )
        self.referents = ReferentPointers(d, config.max_text_tokens) if config.referent_pointers else None
        if self.referents is not None and config.referent_weight > 0:
            self._square_grid("referent_pointers with referent_weight > 0")
        if config.sim_state_input and not config.sim_state_dim:
            raise ValueError(
                "model.sim_state_input needs a simulator-state target: "
                "set dataset.sim_state_key (e.g. sim.state)"
            )
        # the head's reading as one more prefix token (robot observations only)
        self.sim_state_proj = (
            nn.Sequential(nn.Linear(config.sim_state_dim, d), nn.GELU(), nn.Linear(d, d))
            if config.sim_state_input
            else None
        )
        # where the head reads objects, relative to the hand, as one more prefix token
        self.reading_offsets, self.offset_proj = None, None
        offset_slices = parse_offsets(config.reading_offsets)
        if offset_slices:
            if self.sim_state_head is None:
                raise ValueError(
                    "model.reading_offsets needs a simulator-state target: "
                    "set dataset.sim_state_key (e.g. sim.state)"
                )
            self.reading_offsets = ReadingOffsets(offset_slices, config.state_dim, config.sim_state_dim)
            self.offset_proj = nn.Sequential(
                nn.Linear(self.reading_offsets.out_dim, d), nn.GELU(), nn.Linear(d, d)
            )
        if config.sim_state_dim:
            weights = emphasis_weights(config.sim_state_emphasis, config.sim_state_dim)  # (E,)
            self.register_buffer("sim_state_dim_weights", weights, persistent=False)

    def _scene_map_head(self, d: int) -> nn.Module:
        from dvla.sim.vqa_scene_map import CHANNELS, POSITION_CHANNELS

        self._square_grid("scene_map_weight")
        outputs = len(CHANNELS) + (len(POSITION_CHANNELS) if self.config.scene_map_positions else 0)
        return nn.Sequential(nn.LayerNorm(d), nn.Linear(d, outputs))

    def _square_grid(self, what: str) -> int:
        k = self.vision.tokens_per_camera
        if math.isqrt(k) ** 2 != k:
            raise ValueError(
                f"{what} needs a square grid of image tokens; tokens_per_camera is {k} (use 16, 64, ...)"
            )
        return math.isqrt(k)

    @property
    def referent_grid(self) -> int | None:
        """Side of the grid the referent target's cells are on, or None without that target."""
        if self.referents is None or self.config.referent_weight <= 0:
            return None
        return math.isqrt(self.vision.tokens_per_camera)

    @property
    def scene_map_grid(self) -> int | None:
        """Side of the scene-map grid the data must provide, or None without the head."""
        return math.isqrt(self.vision.tokens_per_camera) if self.scene_map_head is not None else None

    # ---- prefix ---------------------------------------------------------------------------------
    def prefix_embeds(
        self,
        obs: Observation,
        train: bool = False,
        image_tokens: torch.Tensor | None = None,
        hide_state: torch.Tensor | None = None,
        extras: dict | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, P, d) embeddings of [images | text | state | simulator-state reading] and their
        validity (B, P). `image_tokens` (I, N, d) are the encoder's tokens of obs.images when already
        computed. The reading token exists with sim_state_input, for robot observations only; the
        question modules' tokens for questions (observations without a state) only.
        `hide_state` (B,) bool replaces those samples' state token by the learned "no state" one.
        `extras`, when given, receives the referent pointers' output as "referents"."""
        if image_tokens is None:
            image_tokens = self.vision(obs.images, train=train, question=obs.state is None)  # (I, N, d)
        encoded = image_tokens
        if obs.image_index is not None:
            image_tokens = image_tokens[obs.image_index]  # (B, N, d): several samples share an image
        text = self.backbone.embed(obs.text_ids)  # (B, L, d)
        # The question modules (FiLM, relation token, referent pointers) serve questions about the
        # scene camera; robot observations (those with a state) skip them, so a co-trained model's
        # robot path is that of an action-only model and the robot loss never trains them.
        question = obs.state is None
        referents = None
        if self.referents is not None and question:  # pointers read the encoder's tokens, before FiLM
            found = self.referents(image_tokens, text, obs.text_valid)
            referents = found.tokens  # (B, 3, d)
            if extras is not None:
                extras["referents"] = found
        if self.text_film is not None and question:
            image_tokens = self.text_film(image_tokens, text, obs.text_valid)  # (B, N, d)
        if self.relation is not None and question:  # (B, N + 1, d): the relation token after them
            image_tokens = torch.cat([image_tokens, self.relation(image_tokens, text, obs.text_valid)], 1)
        if referents is not None:  # (B, N [+ 1] + 3, d)
            image_tokens = torch.cat([image_tokens, referents], 1)
        parts, valid = (
            [image_tokens, text],
            [torch.ones(image_tokens.shape[:2], dtype=torch.bool), obs.text_valid],
        )
        if obs.state is not None:
            state_token = self.state_proj(obs.state)  # (B, d)
            if hide_state is not None:
                hidden_token = self.state_hidden_embed.to(state_token)  # (d,)
                state_token = torch.where(hide_state[:, None], hidden_token, state_token)
            parts.append(state_token[:, None])  # (B, 1, d)
            valid.append(torch.ones(obs.batch_size, 1, dtype=torch.bool))
            reading = None
            if self.sim_state_proj is not None or self.offset_proj is not None:
                reading = self._read_sim_state(encoded, obs).detach()  # (B, E), trained by its own loss
                if obs.reading_override is not None:  # values held from earlier in the episode
                    held = obs.reading_override.to(reading.dtype)
                    reading = torch.where(torch.isnan(held), reading, held)
            if self.sim_state_proj is not None:
                parts.append(self.sim_state_proj(reading)[:, None])  # (B, 1, d)
                valid.append(torch.ones(obs.batch_size, 1, dtype=torch.bool))
            if self.offset_proj is not None:
                offsets = self.reading_offsets(reading, obs.state)  # (B, 3n) decimetres
                parts.append(self.offset_proj(offsets.to(state_token.dtype))[:, None])  # (B, 1, d)
                valid.append(torch.ones(obs.batch_size, 1, dtype=torch.bool))
        valid = torch.cat([v.to(text.device) for v in valid], dim=1)
        return torch.cat(parts, dim=1), valid

    def _prefix_pass(self, obs: Observation):
        embeds, valid = self.prefix_embeds(obs)
        out = self.backbone(
            inputs_embeds=embeds,
            position_ids=layout.prefix_positions(valid),
            attention_mask=layout.prefix_mask(valid),
            return_logits=False,
        )
        return out, valid

    def encode_prefix(self, obs: Observation) -> Prefix:
        """One backbone pass over the prefix; its keys/values serve every later step."""
        out, valid = self._prefix_pass(obs)
        return Prefix(out.past_key_values, valid)

    @torch.no_grad()
    def predict_sim_state(self, obs: Observation) -> torch.Tensor:
        """The auxiliary head's reading of the simulator state, (B, E) normalised to [-1, 1]: what
        the model has learned to see of objects and goals. Read off the image tokens, or off the
        state token: the prefix's last position, which never attends to the target, so this equals
        the training readout."""
        if self.sim_state_head is None:
            raise ValueError(
                "this checkpoint has no simulator-state head; train with --dataset.sim_state_key sim.state"
            )
        if self.config.sim_state_reads == "vision":
            return self._read_sim_state(self.vision(obs.images), obs)
        if obs.state is None:
            raise ValueError("the simulator state is read off the state token; give the robot state")
        out, _ = self._prefix_pass(obs)
        return self.sim_state_head(out.hidden_states[:, -1])

    def _target_hidden(self, prefix: Prefix, target_embeds: torch.Tensor) -> torch.Tensor:
        t = target_embeds.shape[1]
        out = self.backbone(
            inputs_embeds=target_embeds,
            position_ids=layout.target_positions(prefix.valid, t),
            attention_mask=layout.target_mask(prefix.valid, t),
            past_key_values=prefix.cache,
            return_logits=False,
        )
        return out.hidden_states  # (B, T, d)

    def _full_hidden(self, obs: Observation, target_embeds: torch.Tensor, train: bool) -> torch.Tensor:
        """Training: prefix and target in one pass with the same layout. Returns target states (B, T, d)."""
        return self._full_pass(obs, target_embeds, train)[0][:, -target_embeds.shape[1] :]

    def _full_pass(
        self,
        obs: Observation,
        target_embeds: torch.Tensor,
        train: bool,
        hide_state: torch.Tensor | None = None,
        extras: dict | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden states of [prefix | target] in one pass (B, P + T, d), and the encoder's tokens
        of the images (I, N, d; I = B unless samples share images through obs.image_index).
        `extras` as in `prefix_embeds`."""
        image_tokens = self.vision(obs.images, train=train, question=obs.state is None)  # (I, N, d)
        prefix, valid = self.prefix_embeds(
            obs, image_tokens=image_tokens, hide_state=hide_state, extras=extras
        )
        t = target_embeds.shape[1]
        out = self.backbone(
            inputs_embeds=torch.cat([prefix, target_embeds], dim=1),
            position_ids=torch.cat(
                [layout.prefix_positions(valid), layout.target_positions(valid, t)], dim=1
            ),
            attention_mask=layout.full_mask(valid, t),
            return_logits=False,
        )
        return out.hidden_states, image_tokens

    def _read_sim_state(self, image_tokens: torch.Tensor, obs: Observation) -> torch.Tensor:
        """The vision-side head on image tokens (B, N, d) of the cameras in `obs`: (B, E)."""
        present = [c for c in self.config.vision.cameras if c in obs.images]
        return self.sim_state_head(image_tokens, present)

    def sim_state_loss(
        self, hidden: torch.Tensor, image_tokens: torch.Tensor, batch: ActionBatch
    ) -> torch.Tensor | None:
        """Weighted MSE (`sim_state_emphasis`) of the simulator state predicted from the image tokens
        (B, N, d) or from the state token (the prefix's last position in hidden (B, P + T, d)); None
        when the model or the batch has no simulator state. The batch's perception frames, when it
        has some, are read by the vision-side head too and share the same mean."""
        if self.sim_state_head is None or batch.sim_state is None:
            return None
        if self.config.sim_state_reads == "vision":
            predicted = self._read_sim_state(image_tokens, batch.observation)  # (B, E)
            if batch.perception is not None:
                frames = batch.perception
                tokens = self.vision(frames.images, train=True)  # (P, N, d)
                present = [c for c in self.config.vision.cameras if c in frames.images]
                predicted = torch.cat([predicted, self.sim_state_head(tokens, present)])  # (B + P, E)
                target = torch.cat([batch.sim_state, frames.sim_state])  # (B + P, E)
                return weighted_mse(predicted, target, self.sim_state_dim_weights)
        else:
            if batch.perception is not None:
                raise ValueError(
                    "perception frames train the image-token head: set --model.sim_state_reads vision"
                )
            if batch.observation.state is None:
                raise ValueError(
                    "the simulator-state target is read off the state token; the batch has no state"
                )
            t = batch.actions.shape[1] * (1 if self.flow is not None else self.config.action_dim)
            predicted = self.sim_state_head(hidden[:, -t - 1])  # (B, E)
        return weighted_mse(predicted, batch.sim_state, self.sim_state_dim_weights)

    # ---- discrete actions -----------------------------------------------------------------------
    def action_embeds(self, bin_tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Embed action tokens at flattened chunk positions start .. start+n-1: (B, n) bins, with the
        value `bins` for hidden ones -> (B, n, d), plus chunk-step and action-dimension embeddings."""
        d = self.config.action_dim
        hidden = bin_tokens == self.config.action_bins
        ids = torch.where(hidden, torch.full_like(bin_tokens, self.mask_id), bin_tokens + self.action_offset)
        pos = torch.arange(start, start + bin_tokens.shape[1], device=ids.device)
        return self.backbone.embed(ids) + self.action_step_embed(pos // d) + self.action_dim_embed(pos % d)

    def bin_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the action bins only: (B, T, d) -> (B, T, bins)."""
        w = self.backbone.lm_head.weight[self.action_offset : self.action_offset + self.config.action_bins]
        return hidden @ w.T

    def text_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the text vocabulary only (answers): (B, T, d) -> (B, T, V_text)."""
        return hidden @ self.backbone.lm_head.weight[: self.text.vocab_size].T

    # ---- training -------------------------------------------------------------------------------
    def forward(self, batch: ActionBatch | VQABatch, generator=None) -> tuple[torch.Tensor, dict[str, float]]:
        """The training loss of either kind of batch (calling the module lets DDP/FSDP wrappers hook in)."""
        if isinstance(batch, VQABatch):
            return self.compute_vqa_loss(batch, generator)
        return self.compute_loss(batch, generator)

    def _draw_hidden_states(self, batch_size: int, device, generator=None) -> torch.Tensor | None:
        """(B,) bool: which samples of a training batch act without their robot state."""
        if self.config.state_dropout <= 0:
            return None
        return (torch.rand(batch_size, generator=generator) < self.config.state_dropout).to(device)

    def compute_loss(self, batch: ActionBatch, generator=None) -> tuple[torch.Tensor, dict[str, float]]:
        valid = ~batch.actions_is_pad  # (B, H)
        hide = self._draw_hidden_states(batch.actions.shape[0], batch.actions.device, generator)
        if self.flow is not None:
            queries = self.flow.queries.expand(batch.actions.shape[0], -1, -1)  # (B, H, d)
            hidden, image_tokens = self._full_pass(batch.observation, queries, train=True, hide_state=hide)
            cond = hidden[:, -queries.shape[1] :]  # (B, H, d)
            loss = self.flow.loss(cond, batch.actions, batch.actions_is_pad, generator)
            metrics = {"flow_mse": float(loss.detach())}
        else:
            bins = self.action_tokens.encode(batch.actions).flatten(1)  # (B, H*D) in [0, bins)
            valid = valid.repeat_interleave(self.config.action_dim, dim=1)  # (B, H*D)
            t = sample_times(bins.shape[0], generator=generator)  # (B,)
            if self.config.full_mask_fraction > 0:  # these samples hide the whole chunk
                full = torch.rand(t.shape, generator=generator) < self.config.full_mask_fraction  # (B,)
                t = torch.where(full, torch.ones_like(t), t)
            t = t.to(bins.device)
            noisy, masked = mask_tokens(bins, t, self.config.action_bins, generator=generator)
            noisy = noisy.masked_fill(~valid, self.config.action_bins)  # past the episode end: always hidden
            hidden, image_tokens = self._full_pass(
                batch.observation, self.action_embeds(noisy), train=True, hide_state=hide
            )
            logits = self.bin_logits(hidden[:, -bins.shape[1] :])
            loss, metrics = masked_diffusion_loss(logits, bins, masked & valid, t, valid)
        aux = self.sim_state_loss(hidden, image_tokens, batch)
        if aux is not None:
            metrics = {**metrics, "action_loss": float(loss.detach()), "sim_state_mse": float(aux.detach())}
            loss = loss + self.config.sim_state_weight * aux
        return loss, metrics

    @torch.no_grad()
    def first_step_nll(self, batch: ActionBatch, hide_state: torch.Tensor | None = None) -> torch.Tensor:
        """(B,) mean cross-entropy of each sample's true action bins with the whole chunk hidden: what
        the first denoising step knows. Compared across swapped inputs it shows what the policy reads
        (benchmarks/input_use.py). Discrete action head only."""
        if self.flow is not None:
            raise ValueError("first_step_nll needs the discrete action head; this model has the flow head")
        bins = self.action_tokens.encode(batch.actions).flatten(1)  # (B, H*D)
        valid = (~batch.actions_is_pad).repeat_interleave(self.config.action_dim, dim=1)  # (B, H*D)
        hidden_bins = torch.full_like(bins, self.config.action_bins)  # every token hidden
        hidden, _ = self._full_pass(
            batch.observation, self.action_embeds(hidden_bins), train=False, hide_state=hide_state
        )
        logits = self.bin_logits(hidden[:, -bins.shape[1] :]).float()  # (B, H*D, bins)
        ce = F.cross_entropy(logits.transpose(1, 2), bins, reduction="none")  # (B, H*D)
        return (ce * valid).sum(1) / valid.sum(1).clamp(min=1)

    def compute_vqa_loss(self, batch: VQABatch, generator=None) -> tuple[torch.Tensor, dict[str, float]]:
        answers = batch.answer_ids  # (B, A)
        t = sample_times(answers.shape[0], generator=generator).to(answers.device)
        noisy, masked = mask_tokens(answers, t, self.mask_id, generator=generator)
        target = self.backbone.embed(noisy)  # (B, A, d)
        extras = {}
        hidden, image_tokens = self._full_pass(batch.observation, target, train=True, extras=extras)
        logits = self.text_logits(hidden[:, -target.shape[1] :])  # (B, A, V)
        loss, metrics = masked_diffusion_loss(logits, answers, masked, t)
        answer_loss = float(loss.detach())
        if self.scene_map_head is not None and batch.scene_map is not None:
            aux, aux_metrics = self.scene_map_loss(image_tokens, batch.scene_map)
            metrics = {**metrics, "answer_loss": answer_loss, **aux_metrics}
            loss = loss + self.config.scene_map_weight * aux
        if self.referent_grid is not None and batch.referents is not None:
            aux, aux_metrics = self.referent_loss(extras["referents"], batch.referents, answers)
            metrics = {**metrics, "answer_loss": answer_loss, **aux_metrics}
            loss = loss + self.config.referent_weight * aux
        return loss, metrics

    def referent_loss(
        self, found, targets: torch.Tensor, answers: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The referent pointers' targets, for the questions that name a pair (targets (B, 2, 4):
        cell, then column, row, depth; cell -1 elsewhere): the cross-entropy of each pointer's
        attention over the scene camera's grid against its object's cell, the squared error of the
        place read for it, and the cross-entropy of the answer's first token read off the comparison
        token through the answer head (deep supervision: the answer is an interaction of relation
        word and positions that the answer loss alone, four layers on, did not teach)."""
        k = self.vision.tokens_per_camera
        targets = targets.to(found.logits.device)
        asks = targets[:, 0, 0] >= 0  # (B,)
        if not asks.any():
            zero = found.tokens.sum() * 0.0 + found.logits.sum() * 0.0 + found.places.sum() * 0.0
            return zero, {"referent_ce": 0.0, "referent_place_mse": 0.0, "comparison_ce": 0.0}
        logits = found.logits[asks][..., :k].float().flatten(0, 1)  # (B'*2, K)
        pointed = F.cross_entropy(logits, targets[asks][..., 0].long().flatten())
        placed = (found.places[asks].float() - targets[asks][..., 1:]).square().mean()
        compared = F.cross_entropy(self.text_logits(found.tokens[asks, 2]).float(), answers[asks, 0])
        metrics = {
            "referent_ce": float(pointed.detach()),
            "referent_place_mse": float(placed.detach()),
            "comparison_ce": float(compared.detach()),
        }
        return pointed + placed + compared, metrics

    def scene_map_loss(
        self, image_tokens: torch.Tensor, scene_map: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The scene map read off the first camera's grid tokens (I, N, d), one row per image (a VQA
        batch carries only the scene camera): mean binary cross-entropy of the multi-hot channels of
        scene_map (I, K, C + P), plus with scene_map_positions the mean squared error of the
        positions present (the NaN-free entries)."""
        from dvla.sim.vqa_scene_map import CHANNELS

        k, c = self.vision.tokens_per_camera, len(CHANNELS)
        if scene_map.shape[1] != k:
            raise ValueError(f"a scene map of {scene_map.shape[1]} cells for {k} image tokens per camera")
        out = self.scene_map_head(image_tokens[:, :k]).float()  # (I, K, C [+ P])
        target = scene_map.float()
        loss = F.binary_cross_entropy_with_logits(out[..., :c], target[..., :c])
        metrics = {"scene_map_bce": float(loss.detach())}
        if self.config.scene_map_positions:
            present = target[..., c:].isfinite()  # (I, K, P)
            error = (out[..., c:] - target[..., c:].nan_to_num()).square()[present]
            mse = error.mean() if error.numel() else out[..., c:].sum() * 0.0
            metrics["scene_map_position_mse"] = float(mse.detach())
            loss = loss + mse
        return loss, metrics

    # ---- inference ------------------------------------------------------------------------------
    @torch.no_grad()
    def sample_actions(self, obs: Observation, decode_config: DecodeConfig, generator=None, use_cache=True):
        """Action chunk (B, H, D) in [-1, 1] and the number of backbone forwards (prefix pass included).

        use_cache=False recomputes the prefix at every step (for comparison; same result)."""
        if not use_cache and (self.flow is not None or decode_config.autoregressive):
            raise ValueError("use_cache=False is only for parallel decoding of discrete actions")
        prefix = self.encode_prefix(obs)
        h, d = self.config.chunk_size, self.config.action_dim
        if self.flow is not None:
            cond = self._target_hidden(prefix, self.flow.queries.expand(obs.batch_size, -1, -1))
            return self.flow.sample(cond, generator=generator), 2
        blank = torch.full((obs.batch_size, h * d), self.config.action_bins, device=prefix.valid.device)
        if decode_config.autoregressive:
            result = decode_autoregressive(
                self._ar_step_fn(prefix), blank, self.config.action_bins, decode_config, generator=generator
            )
        else:
            if use_cache:
                hidden_fn = lambda tokens: self._target_hidden(prefix, self.action_embeds(tokens))  # noqa: E731
            else:
                hidden_fn = lambda tokens: self._full_hidden(obs, self.action_embeds(tokens), train=False)  # noqa: E731
            result = decode(
                lambda tokens: self.bin_logits(hidden_fn(tokens)),
                blank,
                self.config.action_bins,
                decode_config,
                generator=generator,
            )
        actions = self.action_tokens.decode(result.tokens.view(-1, h, d))
        return actions, result.forwards + (1 if use_cache else 0)

    def _ar_step_fn(self, prefix: Prefix):
        """Left-to-right decoding with a KV cache: each forward feeds the token chosen at k-1 (cached
        for later steps) and a hidden token at k (whose logits are returned, then dropped)."""
        state = {"cache": prefix.cache, "length": 0}
        mask_bin = self.config.action_bins

        def step(k: int, previous: torch.Tensor | None) -> torch.Tensor:
            b = prefix.valid.shape[0]
            hidden_k = torch.full((b, 1), mask_bin, device=prefix.valid.device)
            tokens = hidden_k if previous is None else torch.cat([previous[:, None], hidden_k], dim=1)
            embeds = self.action_embeds(tokens, start=k - (tokens.shape[1] - 1))
            n_new, cached = tokens.shape[1], state["length"]
            keys = torch.cat(
                [prefix.valid, torch.ones(b, cached + n_new, dtype=torch.bool, device=prefix.valid.device)], 1
            )
            mask = keys[:, None, None, :].expand(-1, 1, n_new, -1).clone()
            if n_new == 2:
                mask[:, :, 0, -1] = False  # the chosen token does not see the hidden one after it
            positions = layout.target_positions(prefix.valid, cached + n_new)[:, cached:]
            out = self.backbone(
                inputs_embeds=embeds,
                position_ids=positions,
                attention_mask=mask,
                past_key_values=state["cache"],
                return_logits=False,
            )
            state["cache"] = [(keys_[:, :, :-1], values[:, :, :-1]) for keys_, values in out.past_key_values]
            state["length"] = cached + n_new - 1  # the chosen token is cached, the hidden one dropped
            return self.bin_logits(out.hidden_states[:, -1])  # (B, bins)

        return step

    @torch.no_grad()
    def answer_ids(self, obs: Observation, decode_config: DecodeConfig, generator=None):
        """Answer token ids (B, A) for questions (text in `obs`) and the decode result."""
        prefix = self.encode_prefix(obs)
        blank = torch.full(
            (obs.batch_size, self.config.answer_tokens), self.mask_id, device=prefix.valid.device
        )
        result = decode(
            lambda tokens: self._full_vocab_text_logits(prefix, tokens),
            blank,
            self.mask_id,
            decode_config,
            generator=generator,
        )
        return result

    def _full_vocab_text_logits(self, prefix: Prefix, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (B, A, vocab) with everything but text tokens forbidden (answers are text)."""
        hidden = self._target_hidden(prefix, self.backbone.embed(tokens))
        logits = torch.full(
            (*tokens.shape, self.backbone.config.vocab_size), float("-inf"), device=hidden.device
        )
        logits[..., : self.text.vocab_size] = self.text_logits(hidden)
        return logits
