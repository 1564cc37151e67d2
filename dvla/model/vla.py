"""DiffusionVLA: camera images + instruction + state -> an action chunk in a few parallel steps;
the same backbone answers questions about images.

Sequence: [prefix: image tokens | text tokens | state token] [target: the action head's block, or
A answer tokens]. The prefix attends within itself, the target to everything, so the prefix KV
cache is computed once per observation and reused at every denoising step.

Vocabulary (from scratch): [text tokens (V_text) | action bins | MASK].

Adapters (`dvla.adapters`) add prefix tokens, modulate tokens or add auxiliary losses; the core
runs their hooks in registry order and knows nothing of any one of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dvla.action_head import build_head
from dvla.action_head.base import Backbone, ChunkConstraint, HeadSpec, Vocabulary
from dvla.adapters.base import CoreSpec, LossInputs, PrefixInputs, Slot, build_adapters
from dvla.backbone import layout
from dvla.backbone.configuration import DiffusionLMConfig
from dvla.backbone.decoder import DecodeConfig, DecodeResult, decode
from dvla.backbone.loss import masked_diffusion_loss
from dvla.backbone.modeling import DiffusionLM, KVCache
from dvla.backbone.schedule import mask_tokens, sample_times
from dvla.model.config import DiffusionVLAConfig
from dvla.types import ActionBatch, Observation, VQABatch
from dvla.vision.encoder import VisionEncoder


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
        unset = [n for n in ("action_dim", "state_dim") if getattr(config, n) is None]
        unset += ["vision.cameras"] if config.vision.cameras is None else []
        if unset:
            raise ValueError(
                f"the model's {unset} are unset: "
                "training fills them from the dataset (dvla.training.from_data); set them to build a model "
                "without data"
            )
        self.config, self.text = config, text
        bins = getattr(config.head, "bins", 0)  # action-bin tokens the head needs in the vocabulary
        self.backbone = self._build_backbone(config, text, bins, backbone_config)
        self.mask_id = self.backbone.config.mask_token_id
        # bins sit right after the text tokens; a head without bins only needs [MASK] after the text
        if self.mask_id != text.vocab_size + bins and not (bins == 0 and self.mask_id > text.vocab_size):
            vocab = self.backbone.config.vocab_size
            raise ValueError(
                f"the backbone's vocabulary ({vocab}) does not fit {text.vocab_size} text tokens + {bins} "
                "action bins + [MASK]; use the text vocabulary of the backbone's own tokenizer"
            )
        d = self.backbone.config.hidden_size
        self.vision = VisionEncoder(config.vision, d)
        self.state_proj = nn.Sequential(nn.Linear(config.state_dim, d), nn.GELU(), nn.Linear(d, d))
        vocabulary = Vocabulary(self.backbone, text.vocab_size, bins)
        self.head = build_head(config.head, HeadSpec(d, config.chunk_size, config.action_dim, vocabulary))
        tokens = self.vision.tokens_per_camera
        core = CoreSpec(
            d, list(config.vision.cameras), tokens, tokens + config.vision.keypoints, config.state_dim,
            config.max_text_tokens, config.adapters,
        )  # fmt: skip
        self.adapters = build_adapters(config.adapters, core)

    @staticmethod
    def _build_backbone(
        config, text: TextSpecials, bins: int, saved: DiffusionLMConfig | None
    ) -> DiffusionLM:
        if saved is not None:
            return DiffusionLM(saved)
        if config.backbone.init_from:
            from dvla.backbone.pretrained import from_causal_lm

            return from_causal_lm(config.backbone.init_from, new_tokens=bins + 1)
        size = config.backbone
        return DiffusionLM(
            DiffusionLMConfig(
                vocab_size=text.vocab_size + bins + 1,
                hidden_size=size.hidden_size,
                intermediate_size=size.intermediate_size,
                num_hidden_layers=size.num_hidden_layers,
                num_attention_heads=size.num_attention_heads,
                num_key_value_heads=size.num_key_value_heads,
                mask_token_id=text.vocab_size + bins,
                pad_token_id=text.pad_id,
                eos_token_id=text.eos_id,
            )
        )

    def bind_stats(self, stats: dict) -> None:
        """Give adapters what they need of the run's normalisation statistics."""
        for adapter in self.adapters.values():
            adapter.bind_stats(stats)

    def data_targets(self) -> dict[str, dict]:
        """The targets the VQA data must provide for the adapters' losses, {name: options}."""
        return {k: v for adapter in self.adapters.values() for k, v in adapter.vqa_targets().items()}

    def _serving(self, obs: Observation) -> list:
        return [a for a in self.adapters.values() if a.serves(obs)]

    # ---- prefix ---------------------------------------------------------------------------------
    def prefix_embeds(
        self, obs: Observation, train: bool = False, encoded: torch.Tensor | None = None, draws=None
    ) -> tuple[torch.Tensor, torch.Tensor, PrefixInputs]:
        """(B, P, d) embeddings of [images | after-image tokens | text | state | after-state tokens],
        their validity (B, P) and what the pass computed (for auxiliary losses). `encoded` (I, N, d)
        are the encoder's tokens of obs.images when already computed; `draws` the adapters' random
        choices of a training batch."""
        if encoded is None:
            encoded = self.vision(obs.images, train=train, question=obs.is_question)  # (I, N, d)
        images = encoded if obs.image_index is None else encoded[obs.image_index]  # (B, N, d)
        text = self.backbone.embed(obs.text_ids)  # (B, L, d)
        active = self._serving(obs)
        inputs = PrefixInputs(obs, encoded, images, text, train, dict(self.adapters), draws or {})
        for adapter in active:
            adapter.prepare(inputs)
        for adapter in active:
            modulated = adapter.modulate_images(inputs)
            inputs.images = inputs.images if modulated is None else modulated
        parts = [inputs.images, *self._slot_tokens(active, Slot.AFTER_IMAGES, inputs)]
        n_images = sum(p.shape[1] for p in parts)
        parts.append(text)
        ones = [torch.ones(obs.batch_size, n_images, dtype=torch.bool), obs.text_valid]
        if obs.state is not None:
            token = self.state_proj(obs.state)  # (B, d)
            for adapter in active:
                token = adapter.state_token(token, inputs)
            inputs.state_token, inputs.state_position = token, n_images + text.shape[1]
            extra = [token[:, None], *self._slot_tokens(active, Slot.AFTER_STATE, inputs)]  # (B, 1, d) each
            parts += extra
            ones.append(torch.ones(obs.batch_size, sum(p.shape[1] for p in extra), dtype=torch.bool))
        inputs.valid = torch.cat([v.to(text.device) for v in ones], dim=1)
        return torch.cat(parts, dim=1), inputs.valid, inputs

    @staticmethod
    def _slot_tokens(active: list, slot: Slot, inputs: PrefixInputs) -> list[torch.Tensor]:
        tokens = [a.prefix_tokens(inputs) if a.slot == slot else None for a in active]
        return [t for t in tokens if t is not None]

    def prefix_pass(self, obs: Observation):
        """One backbone pass over the prefix: its output (keys/values, hidden states) and inputs."""
        embeds, valid, inputs = self.prefix_embeds(obs)
        out = self.backbone(
            inputs_embeds=embeds,
            position_ids=layout.prefix_positions(valid),
            attention_mask=layout.prefix_mask(valid),
            return_logits=False,
        )
        return out, inputs

    def encode_prefix(self, obs: Observation) -> Prefix:
        """The prefix's keys/values, which serve every later denoising step."""
        out, inputs = self.prefix_pass(obs)
        return Prefix(out.past_key_values, inputs.valid)

    def target_hidden(self, prefix: Prefix, target_embeds: torch.Tensor) -> torch.Tensor:
        """Hidden states (B, T, d) of a target block over a cached prefix."""
        t = target_embeds.shape[1]
        out = self.backbone(
            inputs_embeds=target_embeds,
            position_ids=layout.target_positions(prefix.valid, t),
            attention_mask=layout.target_mask(prefix.valid, t),
            past_key_values=prefix.cache,
            return_logits=False,
        )
        return out.hidden_states

    def full_pass(
        self, obs: Observation, target_embeds: torch.Tensor, train: bool, draws=None
    ) -> tuple[torch.Tensor, PrefixInputs]:
        """Hidden states of [prefix | target] in one pass (B, P + T, d), as in training, and the
        prefix inputs (the encoder's tokens among them)."""
        embeds, valid, inputs = self.prefix_embeds(obs, train=train, draws=draws)
        t = target_embeds.shape[1]
        out = self.backbone(
            inputs_embeds=torch.cat([embeds, target_embeds], dim=1),
            position_ids=torch.cat(
                [layout.prefix_positions(valid), layout.target_positions(valid, t)], dim=1
            ),
            attention_mask=layout.full_mask(valid, t),
            return_logits=False,
        )
        return out.hidden_states, inputs

    def text_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the text vocabulary only (answers): (B, T, d) -> (B, T, V_text)."""
        return hidden @ self.backbone.lm_head.weight[: self.text.vocab_size].T

    # ---- training -------------------------------------------------------------------------------
    def forward(self, batch: ActionBatch | VQABatch, generator=None) -> tuple[torch.Tensor, dict[str, float]]:
        """The training loss of either kind of batch (calling the module lets the DDP wrapper hook in)."""
        if isinstance(batch, VQABatch):
            return self.compute_vqa_loss(batch, generator)
        return self.compute_loss(batch, generator)

    def compute_loss(self, batch: ActionBatch, generator=None) -> tuple[torch.Tensor, dict[str, float]]:
        """The action head's loss plus the adapters' weighted auxiliary losses, with metrics."""
        obs, b = batch.observation, batch.actions.shape[0]
        draws = {a.name: a.draw(b, batch.actions.device, generator) for a in self._serving(obs)}
        target = self.head.training_target(batch.actions, batch.actions_is_pad, generator)
        hidden, inputs = self.full_pass(obs, target.embeds, train=True, draws=draws)
        t = target.embeds.shape[1]
        loss, metrics = self.head.loss(hidden[:, -t:], target, batch.actions, batch.actions_is_pad, generator)
        return self._add_aux_losses(loss, metrics, LossInputs(inputs, hidden, t, batch, self), "action_loss")

    def compute_vqa_loss(self, batch: VQABatch, generator=None) -> tuple[torch.Tensor, dict[str, float]]:
        """The masked-diffusion loss of the answer block plus the adapters' auxiliary losses."""
        answers = batch.answer_ids  # (B, A)
        t = sample_times(answers.shape[0], generator=generator).to(answers.device)
        noisy, masked = mask_tokens(answers, t, self.mask_id, generator=generator)
        target = self.backbone.embed(noisy)  # (B, A, d)
        hidden, inputs = self.full_pass(batch.observation, target, train=True)
        logits = self.text_logits(hidden[:, -target.shape[1] :])  # (B, A, V)
        loss, metrics = masked_diffusion_loss(logits, answers, masked, t)
        aux_inputs = LossInputs(inputs, hidden, target.shape[1], batch, self)
        return self._add_aux_losses(loss, metrics, aux_inputs, "answer_loss")

    def _add_aux_losses(self, loss, metrics: dict, inputs: LossInputs, main: str):
        """loss + sum of weight * auxiliary loss; adapter metrics as "<adapter>/<metric>", and the
        main loss alone under `main` once an auxiliary loss is added."""
        main_loss = float(loss.detach())
        for adapter in self._serving(inputs.prefix.obs):
            out = adapter.aux_loss(inputs)
            if out is None:
                continue
            aux, aux_metrics = out
            metrics = {
                **metrics,
                main: main_loss,
                **{f"{adapter.name}/{k}": v for k, v in aux_metrics.items()},
            }
            loss = loss + adapter.weight * aux
        return loss, metrics

    # ---- inference ------------------------------------------------------------------------------
    @torch.no_grad()
    def sample_actions(
        self,
        obs: Observation,
        decode_config: DecodeConfig,
        generator=None,
        use_cache: bool = True,
        constraint: ChunkConstraint | None = None,
    ) -> tuple[torch.Tensor, int]:
        """Action chunk (B, H, D) in [-1, 1] and the number of backbone forwards (prefix pass included).

        use_cache=False recomputes the prefix at every step (for comparison; same result).
        `constraint`: known first steps (inpainting) and per-dimension bounds, normalised units."""
        if not use_cache and decode_config.autoregressive:
            raise ValueError("use_cache=False is only for parallel decoding")
        prefix = self.encode_prefix(obs)
        backbone = Backbone(
            target_hidden=lambda embeds: self.target_hidden(prefix, embeds),
            full_hidden=lambda embeds: self.full_pass(obs, embeds, train=False)[0][:, -embeds.shape[1] :],
            prefix=prefix,
            batch_size=obs.batch_size,
        )
        actions, forwards = self.head.sample(
            backbone, decode_config, generator=generator, use_cache=use_cache, constraint=constraint
        )
        return actions, forwards + (1 if use_cache else 0)

    @torch.no_grad()
    def answer(self, obs: Observation, decode_config: DecodeConfig, generator=None) -> DecodeResult:
        """Answer blocks (B, A) for questions (text in `obs`), filled by the parallel decoder."""
        prefix = self.encode_prefix(obs)
        blank = torch.full(
            (obs.batch_size, self.config.answer_tokens), self.mask_id, device=prefix.valid.device
        )
        return decode(
            lambda tokens: self._answer_logits(prefix, tokens),
            blank,
            self.mask_id,
            decode_config,
            generator=generator,
        )

    def _answer_logits(self, prefix: Prefix, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (B, A, vocab) with everything but text tokens forbidden (answers are text)."""
        hidden = self.target_hidden(prefix, self.backbone.embed(tokens))
        logits = torch.full(
            (*tokens.shape, self.backbone.config.vocab_size), float("-inf"), device=hidden.device
        )
        logits[..., : self.text.vocab_size] = self.text_logits(hidden)
        return logits
