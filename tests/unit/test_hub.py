"""Checkpoints on the hub, offline: loading `user/repo` from a populated hub cache, clear errors when
it is not there, and what `dvla push` would upload (the staged folder and its model card)."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from dvla.checkpoint import load_checkpoint, resolve_checkpoint
from dvla.cli import main
from dvla.hub import is_repo_id
from dvla.push import PushConfig, push

FIXTURE = Path(__file__).parents[1] / "fixtures" / "checkpoint_v1"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A hub cache holding the fixture checkpoint as model `lab/tiny` (main and tag v1), offline."""
    import huggingface_hub.constants as constants

    cache = tmp_path / "hub"
    repo = cache / "models--lab--tiny"
    shutil.copytree(FIXTURE, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    for ref in ("main", "v1"):
        (repo / "refs" / ref).write_text(COMMIT)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)  # `lab/tiny` is not a local folder here
    return repo / "snapshots" / COMMIT


def test_a_hub_id_loads_from_the_cache_offline(hub_cache):
    assert resolve_checkpoint("lab/tiny") == hub_cache
    assert resolve_checkpoint("lab/tiny@v1") == hub_cache
    from_hub, _, stats = load_checkpoint("lab/tiny")
    local, _, _ = load_checkpoint(FIXTURE)
    for (name, a), (_, b) in zip(from_hub.state_dict().items(), local.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert stats


def test_a_hub_id_missing_from_the_cache_is_a_clear_error(hub_cache, capsys):
    with pytest.raises(FileNotFoundError, match="neither a local folder nor in the hub cache"):
        resolve_checkpoint("lab/absent")
    assert main(["rollout", "--checkpoint", "lab/absent", "--tasks", "reach-v3"]) == 1
    assert "lab/absent is neither a local folder" in capsys.readouterr().err
    local = hub_cache.parents[3] / "lab" / "tiny"  # a local folder of that name comes first
    shutil.copytree(FIXTURE, local)
    assert resolve_checkpoint("lab/tiny") == Path("lab/tiny")


def test_repo_ids_are_told_from_paths():
    assert is_repo_id("lerobot/pi0") and is_repo_id("user/my-policy_2@main")
    assert not is_repo_id("outputs/train/mt10") and not is_repo_id("/abs/path") and not is_repo_id("x")


def test_push_stages_what_loading_needs_with_a_model_card(tmp_path):
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(FIXTURE, checkpoint)
    torch.save({}, checkpoint / "training_state.pt")  # the optimiser state stays behind
    rollout = {
        "per_task": {"reach-v3": {"success_rate": 0.9, "wilson95": [0.7, 0.97], "episodes": 20}},
        "decode": {"steps": 1},
    }
    vqa = {"exact_match": 0.935, "wilson95": [0.92, 0.95], "questions": 1000, "split": "test"}
    reports = []
    for name, report in (("rollout.json", rollout), ("vqa.json", vqa)):
        (tmp_path / name).write_text(json.dumps(report))
        reports.append(str(tmp_path / name))
    staged = tmp_path / "staged"
    push(PushConfig(str(checkpoint), "lab/tiny", reports, dry_run=str(staged)))
    assert sorted(p.name for p in staged.iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
        "stats.json",
        "tokenizer",
    ]
    card = (staged / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: dvla\npipeline_tag: robotics")
    assert "| reach-v3 success, 1 denoising step | 90% | 70%-97% | 20 |" in card
    assert "--tasks reach-v3 --episodes 50" in card
    assert "| VQA exact match (test) | 93.5% | 92.0%-95.0% | 1000 |" in card
    assert 'DiffusionVLAPolicy.from_pretrained("lab/tiny")' in card
    model, _, _ = load_checkpoint(staged)  # the staged folder is a complete checkpoint
    assert model.config.chunk_size > 0


def test_push_refuses_bad_arguments(tmp_path, capsys):
    assert main(["push", "--checkpoint", str(FIXTURE), "--repo_id", "not a repo"]) == 1
    assert "--repo_id must be a hub model id" in capsys.readouterr().err
    assert (
        main(["push", "--checkpoint", str(FIXTURE), "--repo_id", "a/b", "--results", "[missing.json]"]) == 1
    )
    assert "no results file missing.json" in capsys.readouterr().err
