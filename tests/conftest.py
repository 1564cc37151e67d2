"""Shared fixtures: tests run offline, render headless and use tiny datasets."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MUJOCO_GL", "egl")

import pytest

from dvla.sim.collect import CollectSpec, collect_demos

TINY_TASKS = ["reach-v3", "door-open-v3"]


def tiny_spec(**overrides) -> CollectSpec:
    values = dict(
        tasks=list(TINY_TASKS),
        episodes=2,
        cameras=["corner2", "gripperPOV"],
        image_size=64,
        use_videos=True,
        shadow_size=0,
        max_episode_steps=200,
    )
    values.update(overrides)
    return CollectSpec(**values)


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """Two easy tasks x two expert episodes, two cameras at 64 px, recorded by two workers."""
    root = tmp_path_factory.mktemp("collect") / "tiny"
    report = collect_demos(root, tiny_spec(), workers=2, episodes_per_part=1)
    return root, report


@pytest.fixture(scope="session")
def tiny_scenes(tmp_path_factory):
    """The same two tasks x two scenes without an expert (seeds 100, 101), three frames each."""
    root = tmp_path_factory.mktemp("collect") / "scenes"
    spec = tiny_spec(kind="scenes", scene_frames=3, scene_walk_steps=4, seed_start=100)
    report = collect_demos(root, spec, workers=1)
    return root, report


def tiny_causal_lm(kind: str = "llama", **overrides):
    """A randomly initialised, tiny Llama or Qwen2 causal LM (vocabulary 64) for offline tests;
    `overrides` go to its config (e.g. rope_scaling)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_class, model_class = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }[kind]
    config = config_class(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        **overrides,
    )
    return model_class(config).eval()
