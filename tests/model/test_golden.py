"""The golden run: numbers recorded by the format-1 code (before adapters; its recorder was
tests/fixtures/record_golden_v1.py, in the history) come out of today's code.

Model A is a real format-1 checkpoint (tests/fixtures/checkpoint_v1: discrete head, co-trained, the
simulator-state head with emphasis and input token, reading offsets, state dropout, full-mask
fraction, scene map with positions, FiLM with queries, keypoints, question norm stats). Model B
(flow head, state-token simulator-state head, FiLM, relation token, referent pointers) is rebuilt
from its committed format-1 config and weights regenerated from a seed. Both load through the
migration; then fixed-seed training steps reproduce the loss sequences, and decoding reproduces
the actions and answers.

On CPU in fp32. On the machine that recorded them the numbers are equal bit for bit
(DVLA_GOLDEN_EXACT=1). Other CPU kinds run other oneDNN kernels: decoding from the stored weights
and the first training steps stay within 1e-4, but later steps drift as training amplifies the
rounding. With AVX2 kernels only (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2) the first 8
steps agreed to 1e-6, step 16 of 20 was 1.4% off and a decoded value after training 0.004; so
everything after the first steps is held to a drift tolerance, and the first steps, where any
change of the computation shows, to the tight one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from golden_data import robot_sample, seeded_state_dict, vqa_sample
from safetensors.torch import save_file

from dvla.action_head import FlowHead
from dvla.adapters import PolicyHooksConfig
from dvla.adapters.held_reading import HoldReadingConfig
from dvla.backbone.decoder import DecodeConfig
from dvla.checkpoint import load_checkpoint
from dvla.policy import DiffusionVLAPolicy, PolicyConfig

FIXTURES = Path(__file__).parents[1] / "fixtures"
GOLDEN = json.loads((FIXTURES / "golden_v1.json").read_text())
EXACT = bool(os.environ.get("DVLA_GOLDEN_EXACT"))
TOLERANCE = {"rtol": 0.0, "atol": 0.0} if EXACT else {"rtol": 1e-4, "atol": 1e-5}
DRIFT = TOLERANCE if EXACT else {"rtol": 3e-2, "atol": 1e-2}  # after training on other kernels
TIGHT_STEPS = 5  # training steps held to TOLERANCE
# format-1 metric names -> today's (adapter metrics are namespaced by adapter)
METRIC_NAMES = {
    "sim_state_mse": "sim_state/mse",
    "scene_map_bce": "scene_map/bce",
    "scene_map_position_mse": "scene_map/position_mse",
    "referent_ce": "referent_pointers/pointer_ce",
    "referent_place_mse": "referent_pointers/place_mse",
    "comparison_ce": "referent_pointers/comparison_ce",
}


def train_steps(policy: DiffusionVLAPolicy, steps: int, seed: int, referents: bool) -> list[dict]:
    """Fixed-seed AdamW steps on fixed batches; every 4th is a VQA batch, every 3rd robot batch
    brings perception frames. No gradient clipping (its global norm sums in parameter order)."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    model = policy.model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    history = []
    for step in range(steps):
        if step % 4 == 3:
            batch = policy.processor.vqa_batch(vqa_sample(g, 6, scene_map=not referents, referents=referents))
        else:
            perception = step % 3 == 0 and not referents
            batch = policy.processor.action_batch(robot_sample(g, 5, with_perception=perception))
        loss, metrics = model(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append({"loss": float(loss.detach()), **{k: float(v) for k, v in metrics.items()}})
    return history


def inference(policy: DiffusionVLAPolicy, seed: int, hold: bool) -> dict:
    g = torch.Generator().manual_seed(seed)
    robot = robot_sample(g, 3, with_perception=False)
    vqa = vqa_sample(g, 4, scene_map=False, referents=False)
    out = {}
    model = policy.model.eval()
    images, texts, state = robot["images"], robot["task"], robot["state"]
    if isinstance(model.head, FlowHead):
        obs = policy.observation(images, texts, state)
        actions, _ = model.sample_actions(obs, DecodeConfig(), generator=torch.Generator().manual_seed(3))
        out["flow"] = actions.tolist()
    else:
        for name, decode in {
            "steps1": DecodeConfig(steps=1),
            "steps4": DecodeConfig(steps=4),
            "autoregressive": DecodeConfig(autoregressive=True),
        }.items():
            policy.config.decode = decode
            out[name] = policy.predict_action_chunk(images, texts, state, [0, 1, 2]).tolist()
    out["sim_state"] = policy.predict_sim_state(images, texts, state).tolist()
    question = policy.observation(vqa["images"], vqa["question"], None)
    out["answer_ids"] = model.answer(question, DecodeConfig(steps=3)).tokens.tolist()
    if hold:
        hooks = PolicyHooksConfig(hold_reading=HoldReadingConfig([(9, 12)], plans=2))
        held = DiffusionVLAPolicy(
            model, policy.tokenizer, policy.stats, PolicyConfig(decode=DecodeConfig(steps=2), hooks=hooks)
        )
        chunks = []
        for k in range(3):
            moved = {c: (img + 0.1 * k).clamp(0, 1) for c, img in images.items()}
            chunks.append(held.predict_action_chunk(moved, texts, state + 0.05 * k, [0, 1, 2]).tolist())
        out["held_reading"] = chunks
    return out


def close(actual, expected, what: str, tolerance: dict = TOLERANCE) -> None:
    torch.testing.assert_close(
        torch.tensor(actual),
        torch.tensor(expected),
        **tolerance,
        equal_nan=True,
        msg=lambda m: f"{what}: {m}",
    )


def close_outputs(out: dict, expected: dict, tolerance: dict = TOLERANCE) -> None:
    assert out.keys() == expected.keys()
    for key, value in expected.items():
        close(out[key], value, key, tolerance)


def close_history(history: list[dict], expected: list[dict]) -> None:
    """Per step: the same metrics (under today's names), and values within the tolerance."""
    for step, (h, e) in enumerate(zip(history, expected, strict=True)):
        e = {METRIC_NAMES.get(k, k): v for k, v in e.items()}
        assert sorted(h) == sorted(e), f"step {step}"
        keys = sorted(e)
        tolerance = TOLERANCE if step < TIGHT_STEPS else DRIFT
        close([h[k] for k in keys], [e[k] for k in keys], f"step {step} {keys}", tolerance)


def checkpoint_b(folder: Path) -> Path:
    """Model B as the format-1 code saved it: its config.json, seeded weights, A's tokenizer."""
    spec = json.loads((FIXTURES / "model_b_v1.json").read_text())
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(spec["config"]))
    (folder / "stats.json").write_text(json.dumps(spec["stats"]))
    save_file(seeded_state_dict(spec["manifest"], spec["weights_seed"]), str(folder / "model.safetensors"))
    shutil.copytree(FIXTURES / "checkpoint_v1" / "tokenizer", folder / "tokenizer")
    return folder


def policy_of(path: Path) -> DiffusionVLAPolicy:
    return DiffusionVLAPolicy(*load_checkpoint(path))


def test_model_a_decodes_the_golden_actions_and_answers():
    close_outputs(inference(policy_of(FIXTURES / "checkpoint_v1"), 10, hold=True), GOLDEN["a_inference"])


def test_model_a_trains_to_the_golden_losses():
    policy = policy_of(FIXTURES / "checkpoint_v1")
    close_history(train_steps(policy, 20, 11, referents=False), GOLDEN["a_train"])
    close_outputs(inference(policy, 12, hold=False), GOLDEN["a_after_train"], DRIFT)


@pytest.mark.parametrize("part", ["inference", "train"])
def test_model_b_reproduces_the_golden_run(tmp_path, part):
    policy = policy_of(checkpoint_b(tmp_path / "b"))
    if part == "inference":
        close_outputs(inference(policy, 20, hold=False), GOLDEN["b_inference"])
        return
    close_history(train_steps(policy, 8, 21, referents=True), GOLDEN["b_train"])
    close_outputs(inference(policy, 22, hold=False), GOLDEN["b_after_train"], DRIFT)
