"""Checkpoints: a bit-exact round trip for both heads and every registered adapter, and format-1
checkpoints (before adapters) read through the migration with the same weights and actions."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from tiny_models import batch, questions, tiny_vla

from dvla.adapters import ADAPTERS
from dvla.adapters.held_reading import HoldReadingConfig  # noqa: F401  (a hook, not an adapter)
from dvla.adapters.reading_offsets import ReadingOffsetsConfig
from dvla.adapters.referent_pointers import ReferentPointersConfig
from dvla.adapters.relation_token import RelationTokenConfig
from dvla.adapters.scene_map import SceneMapConfig
from dvla.adapters.sim_state import SimStateConfig
from dvla.adapters.state_dropout import StateDropoutConfig
from dvla.adapters.text_film import TextFiLMConfig
from dvla.backbone.decoder import DecodeConfig
from dvla.backbone.tokenizer import train_text_tokenizer
from dvla.checkpoint import CONFIG_FILE, FORMAT_VERSION, checkpoint_format, load_checkpoint, save_checkpoint
from dvla.migrate import model_config_v1_to_v2, state_dict_v1_to_v2

FIXTURE = Path(__file__).parents[1] / "fixtures" / "checkpoint_v1"
STATS = {
    "observation.state": {"q01": [-1.0] * 5, "q99": [1.0] * 5},
    "sim.state": {"q01": [0.0] * 6, "q99": [1.0] * 6},
    "action": {"q01": [-1.0, 0.0, 0.5], "q99": [1.0] * 3},
}
SCENE_MAP = SceneMapConfig(0.5, True, channels=5, position_channels=6)
# one model per registered adapter (with what it needs), so every adapter's weights round-trip
ADAPTER_SETS = {
    "state_dropout": {"state_dropout": StateDropoutConfig(0.5)},
    "sim_state": {"sim_state": SimStateConfig(dim=6, emphasis=[(0, 3, 2.0)], input=True)},
    "reading_offsets": {
        "sim_state": SimStateConfig(dim=6),
        "reading_offsets": ReadingOffsetsConfig([(3, 6)]),
    },
    "scene_map": {"scene_map": SCENE_MAP},
    "text_film": {"text_film": TextFiLMConfig(queries=2)},
    "relation_token": {"relation_token": RelationTokenConfig(queries=2, hidden=16)},
    "referent_pointers": {"referent_pointers": ReferentPointersConfig(heads=2, hidden=16)},
}


def test_every_registered_adapter_has_a_round_trip_case():
    assert set(ADAPTERS) == set(ADAPTER_SETS)


@pytest.mark.parametrize("head", ["discrete", "flow"])
@pytest.mark.parametrize("name", sorted(ADAPTER_SETS))
def test_round_trip_is_bit_exact(tmp_path, head, name):
    torch.manual_seed(3)
    model = tiny_vla(head, cameras=("a", "scene"), adapters=ADAPTER_SETS[name]).eval()
    model.bind_stats({k: {q: torch.tensor(v).numpy() for q, v in s.items()} for k, s in STATS.items()})
    tokenizer = train_text_tokenizer(["pick the red cube", "open the door"], vocab_size=60)
    stats = {k: {q: torch.tensor(v).numpy() for q, v in s.items()} for k, s in STATS.items()}
    save_checkpoint(tmp_path / "ckpt", model, tokenizer, stats)
    assert checkpoint_format(tmp_path / "ckpt") == FORMAT_VERSION == 2
    loaded, loaded_tokenizer, loaded_stats = load_checkpoint(tmp_path / "ckpt")
    assert loaded.state_dict().keys() == model.state_dict().keys()
    for key, value in model.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key
    assert loaded.config == model.config and loaded.text == model.text
    robot, question = batch(cameras=("a", "scene")).observation, questions(3)
    gen = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    decode = DecodeConfig(steps=2)
    assert torch.equal(
        model.sample_actions(robot, decode, gen())[0], loaded.sample_actions(robot, decode, gen())[0]
    )
    assert torch.equal(
        model.answer(question, decode, gen()).tokens, loaded.answer(question, decode, gen()).tokens
    )
    assert loaded_tokenizer("open the door")["input_ids"] == tokenizer("open the door")["input_ids"]
    assert loaded_stats["action"]["q01"].tolist() == [-1.0, 0.0, 0.5]


def test_missing_checkpoint_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a dvla checkpoint"):
        load_checkpoint(tmp_path / "nowhere")


def test_format_1_checkpoint_loads_and_saves_as_format_2(tmp_path):
    """The committed format-1 checkpoint loads through the migration (strict: every weight placed),
    gives the same actions after saving it again as format 2, and says how to continue its run."""
    assert checkpoint_format(FIXTURE) == 1
    model, tokenizer, stats = load_checkpoint(FIXTURE)
    config = model.config
    assert (
        config.head.type == "discrete" and config.head.bins == 16 and config.head.full_mask_fraction == 0.25
    )
    assert sorted(config.adapters.active()) == [
        "reading_offsets", "scene_map", "sim_state", "state_dropout", "text_film",
    ]  # fmt: skip
    assert [list(e) for e in config.adapters.sim_state.emphasis] == [[9, 12, 5.0], [3, 6, 2.0]]
    assert [list(s) for s in config.adapters.reading_offsets.slices] == [[3, 6], [9, 12]]
    save_checkpoint(tmp_path / "v2", model, tokenizer, stats)
    again, _, _ = load_checkpoint(tmp_path / "v2")
    assert checkpoint_format(tmp_path / "v2") == 2
    saved = json.loads((tmp_path / "v2" / CONFIG_FILE).read_text())["model"]
    assert "sim_state_emphasis" not in saved and saved["adapters"]["sim_state"]["input"] is True
    from golden_data import robot_sample

    from dvla.processor import Processor

    processor = Processor(tokenizer, stats, config)
    obs = processor.action_batch(robot_sample(torch.Generator().manual_seed(4), 3, False)).observation
    decode, gen = DecodeConfig(steps=2), lambda: torch.Generator().manual_seed(0)
    model.eval(), again.eval()
    assert torch.equal(
        model.sample_actions(obs, decode, gen())[0], again.sample_actions(obs, decode, gen())[0]
    )


def test_format_1_config_renames():
    old = {
        "action_head": "discrete", "action_bins": 64, "full_mask_fraction": 0.5, "state_dropout": 0.1,
        "sim_state_dim": 39, "sim_state_emphasis": "36:39=40,4:7=10", "sim_state_input": True,
        "reading_offsets": "4:7,36:39,", "text_film": True, "text_film_queries": 4, "relation_token": True,
        "referent_pointers": True, "referent_weight": 0.5, "chunk_size": 16,
    }  # fmt: skip
    new = model_config_v1_to_v2(old)
    assert new["head"] == {"type": "discrete", "bins": 64, "full_mask_fraction": 0.5}
    adapters = new["adapters"]
    assert adapters["sim_state"] == {
        "dim": 39,
        "reads": "state_token",
        "weight": 1.0,
        "emphasis": [[36, 39, 40.0], [4, 7, 10.0]],
        "input": True,
    }  # fmt: skip  (no sim_state_reads: saved before the choice, when the state token was read)
    assert adapters["reading_offsets"] == {"slices": [[4, 7], [36, 39]]}
    assert adapters["state_dropout"] == {"fraction": 0.1}
    assert adapters["text_film"] == {"queries": 4} and adapters["referent_pointers"] == {"weight": 0.5}
    assert "relation_token" in adapters and "scene_map" not in adapters and new["chunk_size"] == 16
    flow = model_config_v1_to_v2({"action_head": "flow", "flow": {"integration_steps": 5}})
    assert flow["head"] == {"type": "flow", "integration_steps": 5} and flow["adapters"] == {}


def test_format_1_weight_renames():
    names = ("state_hidden_embed", "flow.queries", "action_step_embed.weight", "sim_state_proj.0.weight")
    state = {name: torch.zeros(1) for name in (*names, "backbone.x")}
    assert sorted(state_dict_v1_to_v2(state, flow=True)) == [
        "adapters.sim_state.input_proj.0.weight",
        "adapters.state_dropout.hidden_embed",
        "backbone.x",
        "head.queries",
    ]  # fmt: skip  (a flow model's unused action-token embeddings are dropped)
    assert "head.step_embed.weight" in state_dict_v1_to_v2(state, flow=False)


def test_a_format_1_config_with_a_stray_weight_is_refused(tmp_path):
    """Strict loading: a weight the migrated model has no place for is named, never dropped."""
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "ckpt"
    shutil.copytree(FIXTURE, copy)
    weights = load_file(copy / "model.safetensors")
    weights["mystery.weight"] = torch.zeros(2)
    save_file(weights, copy / "model.safetensors")
    with pytest.raises(ValueError, match="mystery"):
        load_checkpoint(copy)
