"""Checkpoint migrations: older formats read by today's code, with identical weights and actions.

Format 1 (before adapters) kept every research option as a flat field of the model config
("sim_state_emphasis": "36:39=30,4:7=10", "action_head": "flow", ...) and its modules at the top
of the model. Format 2 has `head` (a typed choice) and `adapters.<name>`; `migrate` rewrites a
format-1 config.json and state dict into format 2.
"""

from __future__ import annotations

import torch

# format-1 option -> nothing: these were fields of the flat config, now in head/adapters
_FLAT_FIELDS = (
    "action_head", "flow", "action_bins", "full_mask_fraction", "state_dropout", "sim_state_dim",
    "sim_state_reads", "sim_state_weight", "sim_state_emphasis", "sim_state_input", "reading_offsets",
    "scene_map_weight", "scene_map_positions", "text_film", "text_film_queries", "relation_token",
    "referent_pointers", "referent_weight",
)  # fmt: skip
# The scene map's channels as format 1 built them (dvla.sim.vqa_targets: 37 multi-hot, 72 positions).
_SCENE_MAP_CHANNELS, _SCENE_MAP_POSITION_CHANNELS = 37, 72
_RELATION_QUERIES = 4
# format-1 weight-name prefix -> format 2
_RENAMES = (
    ("state_hidden_embed", "adapters.state_dropout.hidden_embed"),
    ("action_step_embed.", "head.step_embed."),
    ("action_dim_embed.", "head.dim_embed."),
    ("flow.", "head."),
    ("sim_state_head.", "adapters.sim_state.head."),
    ("sim_state_proj.", "adapters.sim_state.input_proj."),
    ("reading_offsets.", "adapters.reading_offsets."),
    ("offset_proj.", "adapters.reading_offsets.proj."),
    ("scene_map_head.", "adapters.scene_map.head."),
    ("text_film.", "adapters.text_film."),
    ("relation.", "adapters.relation_token."),
    ("referents.", "adapters.referent_pointers."),
)


def _slices(spec: str) -> list[list[int]]:
    """Format 1's "4:7,36:39" -> [[4, 7], [36, 39]]."""
    return [[int(x) for x in part.split(":")] for part in filter(None, (p.strip() for p in spec.split(",")))]


def _emphasis(spec: str) -> list[list[float]]:
    """Format 1's "36:39=30,4:7=10" -> [[36, 39, 30.0], [4, 7, 10.0]]."""
    out = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        span, weight = part.split("=")
        start, stop = (int(x) for x in span.split(":"))
        out.append([start, stop, float(weight)])
    return out


def model_config_v1_to_v2(old: dict) -> dict:
    """A format-1 model config (draccus-encoded dict) -> format 2."""
    new = {k: v for k, v in old.items() if k not in _FLAT_FIELDS}
    if old.get("action_head", "discrete") == "flow":
        new["head"] = {"type": "flow", **old.get("flow", {})}
    else:
        bins, full = old.get("action_bins", 256), old.get("full_mask_fraction", 0.0)
        new["head"] = {"type": "discrete", "bins": bins, "full_mask_fraction": full}
    adapters = {}
    if old.get("state_dropout", 0.0) > 0:
        adapters["state_dropout"] = {"fraction": old["state_dropout"]}
    if old.get("sim_state_dim"):
        adapters["sim_state"] = {
            "dim": old["sim_state_dim"],
            "reads": old.get("sim_state_reads", "state_token"),  # saved before the choice existed
            "weight": old.get("sim_state_weight", 1.0),
            "emphasis": _emphasis(old.get("sim_state_emphasis", "")),
            "input": old.get("sim_state_input", False),
        }
    if old.get("reading_offsets"):
        adapters["reading_offsets"] = {"slices": _slices(old["reading_offsets"])}
    if old.get("scene_map_weight", 0.0) > 0:
        adapters["scene_map"] = {
            "weight": old["scene_map_weight"],
            "positions": old.get("scene_map_positions", False),
            "channels": _SCENE_MAP_CHANNELS,
            "position_channels": _SCENE_MAP_POSITION_CHANNELS,
        }
    if old.get("text_film"):
        adapters["text_film"] = {"queries": old.get("text_film_queries", 0)}
    if old.get("relation_token"):
        adapters["relation_token"] = {"queries": _RELATION_QUERIES}
    if old.get("referent_pointers"):
        adapters["referent_pointers"] = {"weight": old.get("referent_weight", 1.0)}
    new["adapters"] = adapters
    return new


def state_dict_v1_to_v2(state: dict[str, torch.Tensor], flow: bool) -> dict[str, torch.Tensor]:
    """Rename format-1 weights; a flow model's unused action-token embeddings are dropped."""
    out = {}
    for name, tensor in state.items():
        if flow and name.startswith(("action_step_embed.", "action_dim_embed.")):
            continue
        for old, new in _RENAMES:
            if name.startswith(old):
                name = new + name[len(old) :]
                break
        out[name] = tensor
    return out


def migrate(config: dict, state: dict[str, torch.Tensor], version: int) -> tuple[dict, dict]:
    """(config.json, state dict) of format `version` -> format 2."""
    if version == 1:
        flow = config["model"].get("action_head") == "flow"
        config = {**config, "model": model_config_v1_to_v2(config["model"]), "format_version": 2}
        state = state_dict_v1_to_v2(state, flow)
    return config, state
