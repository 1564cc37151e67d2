"""A checkpoint is one folder: config.json (with type tags), model.safetensors, tokenizer/, stats.json;
a training checkpoint adds training_state.pt and step.json.

Written to a temporary folder and renamed into place, so a crash never leaves a half-written
checkpoint under the final name. No pickle for weights. Older formats are migrated on load
(`dvla.migrate`), giving the same weights and actions.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import draccus
import numpy as np
import torch
from safetensors.torch import load_file, save_model

from dvla.backbone.configuration import DiffusionLMConfig
from dvla.migrate import migrate
from dvla.model import DiffusionVLA, DiffusionVLAConfig, TextSpecials

CONFIG_FILE, WEIGHTS_FILE, STATS_FILE, TOKENIZER_DIR = (
    "config.json",
    "model.safetensors",
    "stats.json",
    "tokenizer",
)
# what a training checkpoint adds: optimizer, schedule and RNG state, and the step it was saved at
TRAINING_STATE, STEP_FILE = "training_state.pt", "step.json"
FORMAT_VERSION = 2  # 2: head and adapters; 1: flat research options (read through dvla.migrate)


def save_checkpoint(
    path: str | Path, model: DiffusionVLA, tokenizer, stats: dict, training: dict | None = None
) -> Path:
    """Save everything needed to rebuild `model` exactly; `stats` maps feature -> {stat: array};
    `training` is JSON-able facts about the training data (tasks, dataset, fps), see checkpoint_info."""
    path = Path(path)
    check_finite(model.state_dict(), "refusing to save")
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    config = {
        "format_version": FORMAT_VERSION,
        "model": draccus.encode(model.config),
        "text": asdict(model.text),
        "backbone": model.backbone.config.to_dict(),
        "training": training or {},
    }
    (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    save_model(model, str(tmp / WEIGHTS_FILE))
    tokenizer.save_pretrained(tmp / TOKENIZER_DIR)
    plain = {k: {s: np.asarray(v).tolist() for s, v in feature.items()} for k, feature in stats.items()}
    (tmp / STATS_FILE).write_text(json.dumps(plain, indent=2))
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
    return path


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, a training run's output_dir (its latest checkpoints/step-N), or a hub
    model `user/repo[@revision]` that is not a local folder (downloaded once, then cached)."""
    from dvla.hub import download_checkpoint, is_repo_id

    if not Path(path).exists() and is_repo_id(str(path)):
        path = download_checkpoint(str(path))
    path = Path(path)
    if not (path / CONFIG_FILE).exists():
        steps = sorted(p for p in (path / "checkpoints").glob("step-*") if (p / CONFIG_FILE).exists())
        if steps:
            return steps[-1]
        raise FileNotFoundError(
            f"{path} is not a dvla checkpoint (no {CONFIG_FILE}) nor a training run with checkpoints/; "
            "train one with `dvla train`"
        )
    return path


def checkpoint_format(path: str | Path) -> int:
    return int(read_json(resolve_checkpoint(path) / CONFIG_FILE).get("format_version", 0))


def checkpoint_info(path: str | Path) -> dict:
    """What the checkpoint was trained on: {"tasks": [instructions], "dataset": ..., "fps": ...}
    (empty for checkpoints saved without it)."""
    path = resolve_checkpoint(path)
    return read_json(path / CONFIG_FILE).get("training", {})


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu"):
    """Rebuild (model, tokenizer, stats) from a folder written by save_checkpoint (any format).
    A damaged or missing part is named, with what to do."""
    from transformers import AutoTokenizer

    path = resolve_checkpoint(path)
    config = read_json(path / CONFIG_FILE)
    version = config.get("format_version")
    if version not in (1, FORMAT_VERSION):
        raise ValueError(f"{path}: checkpoint format {version}, this dvla reads 1 to {FORMAT_VERSION}")
    missing = [key for key in ("model", "text", "backbone") if key not in config]
    if missing:
        raise ValueError(f"{path / CONFIG_FILE} has no {missing}: {DAMAGED}")
    config, state = migrate(config, read_weights(path / WEIGHTS_FILE), version)
    model_config = draccus.decode(DiffusionVLAConfig, config["model"])
    if model_config.type != "dvla":
        raise ValueError(f"{path}: a {model_config.type!r} checkpoint, not a dvla one")
    backbone_config = DiffusionLMConfig.from_dict(config["backbone"])
    model = DiffusionVLA(model_config, TextSpecials(**config["text"]), backbone_config)
    _load_weights(model, state, path)
    if not (path / TOKENIZER_DIR / "tokenizer_config.json").exists():
        raise FileNotFoundError(f"{path / TOKENIZER_DIR} is missing or incomplete: {DAMAGED}")
    tokenizer = AutoTokenizer.from_pretrained(path / TOKENIZER_DIR)
    stats = {
        k: {s: np.asarray(v, dtype=np.float64) for s, v in feature.items()}
        for k, feature in read_json(path / STATS_FILE).items()
    }
    model.bind_stats(stats)  # units some adapters keep as buffers come from the statistics
    check_finite(model.state_dict(), path / WEIGHTS_FILE)
    return model.to(device).eval(), tokenizer, stats


DAMAGED = "the checkpoint is damaged; use another one (e.g. an earlier step) or save it again"


def read_json(path: Path) -> dict:
    """A checkpoint's JSON file, or an error that names it."""
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: {DAMAGED}")
    try:
        value = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}): {DAMAGED}") from err
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds a {type(value).__name__}, not an object: {DAMAGED}")
    return value


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's safetensors file, or an error that names it."""
    from safetensors import SafetensorError

    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: {DAMAGED}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{path} cannot be read ({err}; {path.stat().st_size} bytes): {DAMAGED}") from err


def check_finite(state: dict[str, torch.Tensor], where) -> None:
    """Every floating-point tensor is finite, or an error names the first one that is not."""
    for name, tensor in state.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            bad = int((~torch.isfinite(tensor)).sum())
            raise ValueError(f"{where}: {name} holds {bad} NaN or inf value(s); these weights cannot act")


def _load_weights(model: DiffusionVLA, state: dict[str, torch.Tensor], path: Path) -> None:
    """Every weight of the model from `state`, strictly: a tensor safetensors stored once for
    several names (tied weights) is the only one allowed to be absent."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    tensors = model.state_dict(keep_vars=True)
    loaded = {tensors[k].data_ptr() for k in state if k in tensors}
    missing = [k for k in missing if tensors[k].data_ptr() not in loaded]
    if missing or unexpected:
        raise ValueError(
            f"{path / WEIGHTS_FILE} does not fit its config: missing {missing}, unexpected {unexpected}"
        )


def export_raw_weights(path: str | Path, out: str | Path) -> Path:
    """Write a copy of a training checkpoint whose model holds the raw training weights (kept in its
    training_state.pt) instead of their moving average: to compare the two."""
    path = resolve_checkpoint(path)
    state_file = path / TRAINING_STATE
    if not state_file.exists():
        raise FileNotFoundError(f"{path} has no {TRAINING_STATE}: only training checkpoints keep raw weights")
    if checkpoint_format(path) != FORMAT_VERSION:
        raise ValueError(
            f"{path} is a format-{checkpoint_format(path)} checkpoint; its raw weights use old names"
        )
    state = torch.load(state_file, weights_only=True)
    if "raw_model" not in state:
        raise ValueError(f"{path} was trained without --ema_decay: its model already holds the raw weights")
    model, tokenizer, stats = load_checkpoint(path)
    model.load_state_dict(state["raw_model"], strict=True)
    return save_checkpoint(out, model, tokenizer, stats, checkpoint_info(path))
