"""Policies as the rollout harness sees them: observations of several episodes in, one action each out.

An actor keeps per-episode state (queued actions, observation history) by env slot and times every
new chunk, so dvla checkpoints and LeRobot policies (ACT, Diffusion Policy, ...) run through the
same harness, seeds and timing.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from dvla.eval.metrics import switch_jerk

LEROBOT_PROCESSOR_FILE = "policy_preprocessor.json"


@dataclass
class PlanStats:
    """Timing of every planning call: one call may plan chunks for several episodes."""

    ms: list[float] = field(default_factory=list)  # wall time of each planning call
    chunks: list[int] = field(default_factory=list)  # new chunks in that call (its batch)
    forwards: list[int] = field(default_factory=list)  # backbone forwards per chunk in that call

    def add(self, ms: float, chunks: int, forwards: int) -> None:
        self.ms.append(ms)
        self.chunks.append(chunks)
        self.forwards.append(forwards)

    def summary(self) -> dict:
        total = sum(self.chunks)
        return {
            "forwards_per_chunk": float(np.mean(self.forwards)) if self.forwards else None,
            "plan_calls": len(self.ms),
            "mean_batch": total / max(1, len(self.ms)),
            "ms_per_plan_call": float(np.mean(self.ms)) if self.ms else None,
            "ms_per_chunk": float(np.sum(self.ms) / max(1, total)),
        }


def is_lerobot_policy(path: str | Path) -> bool:
    """A folder saved by a LeRobot policy (`lerobot-train`'s …/pretrained_model)."""
    return (Path(path) / LEROBOT_PROCESSOR_FILE).exists()


def resolve_lerobot_policy(path: str | Path) -> Path | None:
    """A LeRobot policy folder, or a `lerobot-train` output_dir (its last checkpoint); None otherwise."""
    path = Path(path)
    for candidate in (path, path / "pretrained_model", path / "checkpoints" / "last" / "pretrained_model"):
        if is_lerobot_policy(candidate):
            return candidate
    return None


class DVLAActor:
    """A dvla policy: plans, in one batch, a chunk for every episode whose stream of chunks needs
    one (`dvla.execution`), and records each episode's executed actions and their chunks."""

    def __init__(self, policy, autocast: contextlib.AbstractContextManager | None = None,
                 show_denoising: int = 0, figure_dir: str | Path | None = None):  # fmt: skip
        self.policy = policy
        self.cameras = policy.action_cameras
        self.n_action_steps = policy.n_action_steps
        self.autocast = autocast or contextlib.nullcontext()
        self.stats = PlanStats()
        self._executed: dict[int, list] = {}  # slot -> [(action, chunk index)]
        self._planned_from: dict[int, np.ndarray] = {}  # slot -> the state its latest chunk saw
        # figures of how the first `show_denoising` chunks of labelled episodes form
        self.show_denoising, self.figure_dir = show_denoising, Path(figure_dir or ".")
        self._figures: dict[int, tuple[str, int]] = {}  # slot -> (label, chunks drawn)

    def start(self, slot: int, label: str | None = None) -> None:
        """A new episode begins in `slot`; `label` names the figures of its chunks (if any)."""
        self._executed[slot] = []
        self._planned_from.pop(slot, None)
        self.policy.forget(slot)
        self._figures.pop(slot, None)
        if label and self.show_denoising:
            self._figures[slot] = (label, 0)

    def act(self, slots: list[int], observations: dict[int, dict], texts: dict[int, str]) -> dict:
        planning = self.policy.planning(slots)
        if planning:
            images = {
                c: torch.from_numpy(np.stack([observations[s]["images"][c] for s in planning]))
                for c in self.cameras
            }
            state = torch.from_numpy(np.stack([observations[s]["state"] for s in planning]))
            tick = time.perf_counter()
            with self.autocast:
                self.policy.plan(planning, images, [texts[s] for s in planning], state)
            self.stats.add((time.perf_counter() - tick) * 1000, len(planning), self.policy.last_forwards)
            self._planned_from.update({s: observations[s]["state"] for s in planning})
            self._draw(planning)
        actions = self.policy.pop(slots).float().cpu().numpy()  # (B, D)
        for slot, action in zip(slots, actions, strict=True):
            self._executed[slot].append((action, self.policy.source(slot)))
        return dict(zip(slots, actions, strict=True))

    def _draw(self, planned: list[int]) -> None:
        from dvla.eval.denoising_plot import plot_chunk_forming

        for slot in planned:
            trace = self.policy.traces.pop(slot, None)
            if slot not in self._figures or trace is None:
                continue
            label, drawn = self._figures[slot]
            if drawn >= self.show_denoising:
                continue
            history, confidence, known = trace
            head = self.policy.model.head
            path = self.figure_dir / f"{label}_chunk{drawn:02d}.png"
            title = f"{label}, chunk {drawn}" + (f" ({known} known steps)" if known else "")
            plot_chunk_forming(history, confidence, head.tokens, head.spec.chunk_size, path, title, known)
            self._figures[slot] = (label, drawn + 1)

    def plan_ahead(self, slot: int) -> tuple[np.ndarray, np.ndarray, int] | None:
        """The state the episode's latest chunk was planned from, that chunk (H, D) in robot units
        and the index of the step its next action comes from; None before its first chunk."""
        plan = self.policy.plan_ahead(slot)
        if plan is None:
            return None
        chunk, index = plan
        return self._planned_from[slot], chunk.float().cpu().numpy(), index

    def jerk(self, slot: int) -> dict | None:
        """The episode's jerk within chunks and across switches (None when chunks are ensembled)."""
        executed = self._executed.get(slot, [])
        if not executed or executed[0][1] is None:
            return None
        return switch_jerk(np.stack([a for a, _ in executed]), [s for _, s in executed])


class LeRobotActor:
    """A LeRobot policy driven exactly as `lerobot-eval` drives it: its own pre/post-processors and
    `select_action` every step. Each episode slot gets its own copy (the policy keeps its action queue
    and observation history inside), so episodes run at batch 1."""

    def __init__(self, path: str | Path, device: torch.device, autocast=None):
        from lerobot.configs.policies import PreTrainedConfig
        from lerobot.policies.factory import get_policy_class, make_pre_post_processors

        self.path = Path(path)
        config = PreTrainedConfig.from_pretrained(self.path)
        config.device = device.type
        self.policy = get_policy_class(config.type).from_pretrained(self.path, config=config).eval()
        self.preprocess, self.postprocess = make_pre_post_processors(
            config,
            pretrained_path=str(self.path),
            preprocessor_overrides={"device_processor": {"device": device.type}},
        )
        self.type = config.type
        self.cameras = [key.removeprefix("observation.images.") for key in config.image_features]
        self.image_shape = tuple(int(n) for n in next(iter(config.image_features.values())).shape[1:])
        self.state_dim = int(config.robot_state_feature.shape[0]) if config.robot_state_feature else 0
        self.n_action_steps = getattr(config, "n_action_steps", 1)
        self.forwards_per_chunk = lerobot_forwards_per_chunk(config)
        self.autocast = autocast or contextlib.nullcontext()
        self.stats = PlanStats()
        self._slots: dict[int, object] = {}
        self.trained_tasks = _lerobot_training_tasks(self.path)

    def start(self, slot: int, label: str | None = None) -> None:
        """A new episode begins in `slot` (the policy's own `select_action` keeps its history)."""
        if slot not in self._slots:
            self._slots[slot] = copy.deepcopy(self.policy)
        self._slots[slot].reset()

    def batch(self, observation: dict, text: str) -> dict:
        """One raw observation -> the policy's batch-1 input (LeRobot feature names)."""
        raw = {
            f"observation.images.{c}": torch.from_numpy(observation["images"][c]).permute(2, 0, 1)[None] / 255
            for c in self.cameras
        }  # (1, 3, H, W) float in [0, 1]
        raw["observation.state"] = torch.from_numpy(np.asarray(observation["state"], dtype=np.float32))[None]
        raw["task"] = [text]
        return self.preprocess(raw)

    def act(self, slots: list[int], observations: dict[int, dict], texts: dict[int, str]) -> dict:
        actions = {}
        for slot in slots:
            policy = self._slots[slot]
            planning = lerobot_queue_empty(policy)
            tick = time.perf_counter()
            with torch.no_grad(), self.autocast:
                action = policy.select_action(self.batch(observations[slot], texts[slot]))
            action = self.postprocess(action)
            if planning:
                self.stats.add((time.perf_counter() - tick) * 1000, 1, self.forwards_per_chunk)
            actions[slot] = action[0].float().cpu().numpy()
        return actions


def lerobot_queue_empty(policy) -> bool:
    """Whether `select_action` will predict a new chunk now (ACT and Diffusion Policy queues)."""
    if hasattr(policy, "_action_queue"):  # ACT
        return len(policy._action_queue) == 0
    queues = getattr(policy, "_queues", None)  # Diffusion Policy and most others
    if isinstance(queues, dict) and "action" in queues:
        return len(queues["action"]) == 0
    return True  # unknown policy: count every call as a chunk


def lerobot_forwards_per_chunk(config) -> int:
    """Network forwards per chunk: 1 for ACT, the denoising steps for Diffusion Policy."""
    if config.type == "diffusion":
        return int(config.num_inference_steps or config.num_train_timesteps)
    return 1


def _lerobot_training_tasks(path: Path) -> list[str] | None:
    """Task instructions of the episodes the policy was trained on, from its train_config.json."""
    train_config = path / "train_config.json"
    if not train_config.exists():
        return None
    dataset = json.loads(train_config.read_text()).get("dataset", {})
    root = dataset.get("root")
    if not root or not Path(root).exists():
        return None
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

    meta = LeRobotDatasetMetadata(dataset.get("repo_id") or "local/dataset", root=root)
    episodes = dataset.get("episodes")
    if episodes is None:
        return sorted(meta.tasks.index)
    tasks = set()
    for index in episodes:
        tasks.update(meta.episodes[index]["tasks"])
    return sorted(tasks)
