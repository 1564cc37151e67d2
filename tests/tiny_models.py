"""Tiny models and batches for tests: a 2-layer backbone of width 64, 32x32 images, 4 tokens per
camera, chunks of 4 x 3 actions in 32 bins, 5-D states, 6 text tokens from a vocabulary of 50."""

from __future__ import annotations

import torch

from dvla.action_head import DiscreteHeadConfig, FlowHeadConfig, HeadConfig
from dvla.adapters import AdaptersConfig
from dvla.model import BackboneSize, DiffusionVLA, DiffusionVLAConfig, TextSpecials
from dvla.training.precision import autocast, resolve_precision
from dvla.types import fake_action_batch, fake_observation
from dvla.vision import VisionConfig

TEXT = TextSpecials(vocab_size=50, pad_id=0, eos_id=2)
TEXT_LEN, STATE_DIM, CHUNK, ACTION_DIM, BINS = 6, 5, 4, 3, 32


def tiny_head(head: str | HeadConfig = "discrete", **options) -> HeadConfig:
    if isinstance(head, HeadConfig):
        return head
    if head == "discrete":
        return DiscreteHeadConfig(**{"bins": BINS, **options})
    return FlowHeadConfig(**options)


def tiny_config(
    head: str | HeadConfig = "discrete",
    model_name: str = "resnet10t",
    cameras=("a", "b"),
    adapters: dict | None = None,
    **overrides,
) -> DiffusionVLAConfig:
    """`adapters` maps adapter names to their configs, e.g. {"sim_state": SimStateConfig(dim=6)}."""
    kwargs = {"img_size": 32} if model_name.startswith("vit") else {}
    vision = VisionConfig(
        model_name=model_name,
        image_size=32,
        tokens_per_camera=4,
        cameras=list(cameras),
        shift_fraction=0.0,
        timm_kwargs=kwargs,
    )
    values = dict(
        vision=vision,
        backbone=BackboneSize(64, 128, 2, 4),
        head=tiny_head(head),
        adapters=AdaptersConfig(**(adapters or {})),
        chunk_size=CHUNK,
        action_dim=ACTION_DIM,
        state_dim=STATE_DIM,
        answer_tokens=3,
    )
    return DiffusionVLAConfig(**{**values, **overrides})


def tiny_vla(
    head="discrete", model_name="resnet10t", cameras=("a", "b"), text=TEXT, adapters=None, **overrides
):
    return DiffusionVLA(tiny_config(head, model_name, cameras, adapters, **overrides), text)


def batch(cameras=("a", "b"), size=3, seed=0):
    """A robot batch of the tiny shapes."""
    return fake_action_batch(size, list(cameras), 32, TEXT_LEN, 50, STATE_DIM, CHUNK, ACTION_DIM, seed)


def questions(size=3, cameras=("scene",), seed=0):
    """Question observations (no state) of the tiny shapes."""
    return fake_observation(size, list(cameras), 32, TEXT_LEN, 50, None, seed)


def overfit(model, data, steps, loss_fn, anneal=False, lr=2e-3):
    """Train `model` on one batch for `steps` AdamW steps, under bf16 autocast where the CPU runs it
    natively (fp32 elsewhere, as `dvla train` does); returns it in eval mode."""
    cpu = torch.device("cpu")
    precision = resolve_precision("auto", cpu)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps) if anneal else None
    for _ in range(steps):
        with autocast(precision, cpu):
            loss, _ = loss_fn(data)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if schedule is not None:
            schedule.step()
    return model.eval()
