"""Start a new training run from a trained dvla checkpoint (`dvla train --init_from DIR`).

Kept: the checkpoint's architecture (backbone size, vision model, action head, answer length), its
tokenizer, and every weight whose name and shape fit the new model. Set by the new run: chunk size,
action and state dimensions, cameras, image size, whether question images keep their own
batch-norm statistics, the head's training settings (its `RUN_FIELDS`) and every adapter (the new
run's `model.adapters`, whatever they are). Re-initialised: weights whose shape changed (e.g. the
state projection for another state dimension, the action-dimension embedding, flow-head layers),
adapters and question statistics the checkpoint lacks; camera embeddings are matched by camera
name, so a new camera starts fresh.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from dvla.checkpoint import load_checkpoint
from dvla.model import DiffusionVLA, DiffusionVLAConfig

CAMERA_EMBED = "vision.camera_embed.weight"


@dataclass
class TransferReport:
    kept: list[str]
    reinitialised: list[str]
    kept_parameters: int
    total_parameters: int

    def summary(self) -> str:
        share = self.kept_parameters / max(1, self.total_parameters)
        fresh = ", ".join(self.reinitialised) or "nothing"
        return (
            f"kept {len(self.kept)} tensors ({share:.1%} of {self.total_parameters:,} parameters); "
            f"re-initialised: {fresh}"
        )


def finetune_config(old: DiffusionVLAConfig, new: DiffusionVLAConfig) -> DiffusionVLAConfig:
    """The checkpoint's architecture with the new run's data-facing settings and adapters (those
    the new run leaves unset, None, stay the checkpoint's)."""

    def new_or_old(a, b):
        return a if a is not None else b

    vision = replace(
        old.vision,
        cameras=list(new_or_old(new.vision.cameras, old.vision.cameras)),
        image_size=new.vision.image_size,
        image_width=new_or_old(new.vision.image_width, old.vision.image_width),
        shift_fraction=new.vision.shift_fraction,
        question_norm_stats=new.vision.question_norm_stats,
    )
    return replace(
        old,
        vision=vision,
        chunk_size=new.chunk_size,
        action_dim=new_or_old(new.action_dim, old.action_dim),
        state_dim=new_or_old(new.state_dim, old.state_dim),
        state_clip=new.state_clip,
        head=_head(old.head, new.head),
        adapters=new.adapters,
    )


def _head(old, new):
    """The checkpoint's head, with the new run's training settings when both are the same kind."""
    if type(old) is not type(new):
        return old
    return replace(old, **{name: getattr(new, name) for name in type(old).RUN_FIELDS})


def transfer_weights(old: DiffusionVLA, new: DiffusionVLA) -> TransferReport:
    """Copy into `new` every tensor of `old` with the same name and shape; camera rows by name."""
    source, target = old.state_dict(), new.state_dict()
    kept, fresh, kept_params = [], [], 0
    with torch.no_grad():
        for name, tensor in target.items():
            if name == CAMERA_EMBED:
                old_cams, new_cams = old.config.vision.cameras, new.config.vision.cameras
                for row, camera in enumerate(new_cams):
                    if camera in old_cams:
                        tensor[row] = source[name][old_cams.index(camera)]
                        kept_params += tensor[row].numel()
                    else:
                        fresh.append(f"{name}[{camera}]")
                kept.append(name)
            elif name in source and source[name].shape == tensor.shape:
                tensor.copy_(source[name])
                kept.append(name)
                kept_params += tensor.numel()
            else:
                fresh.append(name)
    total = sum(t.numel() for t in target.values())
    return TransferReport(kept, fresh, kept_params, total)


def init_from_checkpoint(path: str, new_config: DiffusionVLAConfig):
    """(model, tokenizer, report): a model for `new_config`'s data that starts from the checkpoint."""
    old, tokenizer, _ = load_checkpoint(path)
    config = finetune_config(old.config, new_config)
    model = DiffusionVLA(config, old.text, old.backbone.config)
    report = transfer_weights(old, model)
    return model.train(), tokenizer, report
