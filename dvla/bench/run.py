"""`dvla bench`: run the sections, save bench.json, bench.md and PNG plots under output_dir.

Every rollout goes through `dvla rollout`'s harness (same environments, seeds and success rule) and
is saved in its own folder under rollouts/; a finished one with the same settings is reused, so an
interrupted benchmark resumes where it stopped.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import replace
from pathlib import Path

import draccus
import torch

from dvla.action_head.flow import FlowHeadConfig
from dvla.backbone.decoder import DecodeConfig
from dvla.bench import latency as lat
from dvla.bench.config import BenchConfig
from dvla.bench.peers import task_episodes, train_peer
from dvla.bench.report import FEW_STEPS, markdown, plots, plural_steps, targets
from dvla.bench.throughput import measure
from dvla.checkpoint import checkpoint_info, load_checkpoint, resolve_checkpoint
from dvla.eval.metrics import episode_outcomes, paired_comparison, wilson_interval
from dvla.eval.rollout import check_fits_environment, environment_name, resolve_device
from dvla.eval.rollout_config import RolloutConfig
from dvla.locks import exclusive_output
from dvla.model import DiffusionVLA
from dvla.training.precision import resolve_precision
from dvla.types import VQA_CAMERA


def _machine(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()})"


DISCRETE_HEADS = ("discrete", "factored")  # heads with the masked-diffusion decoder


class Bench:
    def __init__(self, config: BenchConfig):
        from dvla.sim.environments import get_environment

        self.config, self.device = config, resolve_device(config.device)
        self.precision = resolve_precision(config.mixed_precision, self.device)  # "bf16" or "no"
        self.out = Path(config.output_dir)
        self.checkpoint = resolve_checkpoint(config.checkpoint)
        self.model, self.tokenizer, _ = load_checkpoint(self.checkpoint, self.device)
        head = self.model.config.head.type
        if head not in DISCRETE_HEADS:
            raise ValueError(
                f"{self.checkpoint} has the {head!r} head; --checkpoint takes a discrete or factored "
                "head checkpoint (give a flow one as --flow_checkpoint)"
            )
        # the factored head has no left-to-right mode: its sequential baseline is one value per
        # forward (H*D denoising steps), timed in the latency section
        self.autoregressive = head == "discrete"
        if config.autoregressive and not self.autoregressive:
            print("bench: the factored head decodes in parallel only; no autoregressive rollouts")
        info = checkpoint_info(self.checkpoint)
        self.environment = get_environment(environment_name(config.env, info))
        model = self.model.config
        cameras = [c for c in model.vision.cameras if c != VQA_CAMERA]
        check_fits_environment(self.environment, model.state_dim, model.action_dim, cameras)
        self.max_steps = config.max_steps or self.environment.default_episode_steps
        suite = None if config.tasks else self.environment.default_suite
        tasks = self.environment.resolve_tasks(config.tasks, suite)
        self.tasks = tasks[:1] if config.quick else tasks
        self.instructions = {task: self.environment.instruction(task) for task in self.tasks}
        trained = info.get("tasks") or []
        unseen = [task for task, text in self.instructions.items() if trained and text not in trained]
        if unseen:
            raise ValueError(f"{self.checkpoint} was not trained on {unseen}; pick --tasks from its data")
        self.tokens = self.model.config.chunk_size * self.model.config.action_dim
        self.n_action_steps = max(1, self.model.config.chunk_size // 2)
        self.results: dict = {
            "run": {
                "command": "dvla " + " ".join(sys.argv[1:]),
                "checkpoint": str(self.checkpoint),
                "head": head,
                "env": self.environment.name,
                "tasks": self.tasks,
                "episodes": config.episodes,
                "seed_start": config.seed_start,
                "max_steps": self.max_steps,
                "machine": _machine(self.device),
                "precision": self.precision,
                "torch": torch.__version__,
            },
            "config": draccus.encode(config),
        }

    # ---- rollouts -------------------------------------------------------------------------------
    def evaluate(self, name: str, checkpoint, tasks: list[str], decode: DecodeConfig | None = None) -> dict:
        """Roll out one policy on `tasks` (reusing a finished identical run); returns its report."""
        from dvla.eval.rollout import rollout

        c = self.config
        config = RolloutConfig(
            checkpoint=str(checkpoint),
            env=self.environment.name,  # resolved up front: a finished run's saved config has it set
            tasks=",".join(tasks),
            episodes=c.episodes,
            seed_start=c.seed_start,
            max_steps=self.max_steps,
            workers=c.workers,
            decode=decode or DecodeConfig(),  # none only for LeRobot peers, which ignore it
            output_dir=str(self.out / "rollouts" / name),
            videos_per_task=0,
            device=c.device,
            resume=True,  # an interrupted bench continues its rollouts instead of starting them over
        )
        saved = Path(config.output_dir) / "report.json"
        if saved.exists():
            report = json.loads(saved.read_text())
            if _settings(report["config"]) == _settings(draccus.encode(config)):
                print(f"bench: reusing {saved}")
                return report
        print(f"bench: rolling out {name} on {len(tasks)} task(s) x {c.episodes} episodes")
        return rollout(config)

    @staticmethod
    def success(report: dict) -> dict:
        pooled = report["pooled"]
        return {
            "success": pooled["successes"] / pooled["episodes"],
            "successes": pooled["successes"],
            "episodes": pooled["episodes"],
            "wilson95": pooled["wilson95"],
            "per_task": {t: r["success_rate"] for t, r in report["per_task"].items()},
        }

    def decode_setting(self, steps: int | None) -> tuple[str, str, DecodeConfig]:
        """(name, plot label, decode config); steps None = autoregressive."""
        if steps is None:
            return "dvla discrete, autoregressive", "AR", DecodeConfig(autoregressive=True)
        return f"dvla discrete, {plural_steps(steps)}", str(steps), DecodeConfig(steps=steps)

    def time_decode(self, decode: DecodeConfig, use_cache: bool = True, model=None) -> lat.Timing:
        return lat.time_dvla(
            model or self.model,
            decode,
            use_cache,
            self.config.latency_repeats,
            self.n_action_steps,
            self.precision,
        )

    # ---- sections -------------------------------------------------------------------------------
    def decode_sweep(self) -> None:
        rows = []
        settings = [s or self.tokens for s in self.config.decode_steps]
        autoregressive = self.config.autoregressive and self.autoregressive
        for steps in sorted(set(settings)) + ([None] if autoregressive else []):
            name, label, decode = self.decode_setting(steps)
            report = self.evaluate(f"dvla_{'ar' if steps is None else f'steps{steps}'}", self.checkpoint,
                                   self.tasks, decode)  # fmt: skip
            timing = self.time_decode(decode)
            rows.append(
                {
                    "name": name,
                    "label": label,
                    "autoregressive": steps is None,
                    "steps": self.tokens if steps is None else min(steps, self.tokens),
                    "forwards": timing.forwards,
                    "ms_batch1": timing.ms_per_chunk,
                    "ms_per_chunk_in_rollout": report["decode"]["ms_per_chunk"],
                    **self.success(report),
                }
            )
            print(f"bench: {name}: {rows[-1]['success']:.0%}, {timing.ms_per_chunk:.1f} ms per chunk")
        self.results["decode"] = {"rows": rows}

    def heads(self) -> None:
        if not self.config.flow_checkpoint:
            print("bench: heads skipped (no --flow_checkpoint)")
            return
        flow, _, _ = load_checkpoint(self.config.flow_checkpoint, self.device)
        if flow.config.head.type != "flow":
            raise ValueError(f"--flow_checkpoint {self.config.flow_checkpoint} has the discrete head")
        rows, outcomes = [], []
        discrete = self.decode_setting(self.config.default_steps)[0].removeprefix("dvla ")
        for name, checkpoint, model, decode in (
            (discrete, self.checkpoint, self.model, DecodeConfig(steps=self.config.default_steps)),
            (f"flow, {flow.config.head.integration_steps} Euler steps", self.config.flow_checkpoint, flow,
             DecodeConfig()),
        ):  # fmt: skip
            key = "flow" if model is flow else f"steps{self.config.default_steps}"
            report = self.evaluate(f"dvla_{key}", checkpoint, self.tasks, decode)
            timing = self.time_decode(decode, model=model)
            rows.append({"name": name, "ms_batch1": timing.ms_per_chunk, **self.success(report)})
            outcomes.append(episode_outcomes(report))
        # the same seeds for both heads: a paired test (first = discrete)
        self.results["heads"] = {"rows": rows, "paired": paired_comparison(*outcomes)}

    def peers(self) -> None:
        peers = self.config.peers
        trained = []  # (policy, task, folder, training record or None)
        for entry in peers.trained:
            policy, task, folder = entry.split(":", 2)
            trained.append((policy, task, Path(folder), None))
        if peers.dataset_root:
            episodes = task_episodes(peers.dataset_root, self.instructions)
            for policy in peers.policies:
                for task in self.tasks:
                    folder = self.out / "peers" / policy / task
                    print(f"bench: training {policy} on {task} ({len(episodes[task])} episodes, "
                          f"{peers.steps_for(policy)} steps, log {folder}.log)")  # fmt: skip
                    control = peers.control(self.model.config.chunk_size)
                    record = train_peer(policy, task, episodes[task], peers, folder, control,
                                        self.device.type, amp=self.precision == "bf16")  # fmt: skip
                    trained.append((policy, task, folder, record))
        if not trained:
            print("bench: peers skipped (give --peers.dataset_root to train them, or --peers.trained)")
            return
        rows, outcomes = [], {}
        for policy, task, folder, record in trained:
            report = self.evaluate(f"{policy}_{task}", folder, [task])
            outcomes.setdefault(policy, {}).update(episode_outcomes(report))
            rows.append(
                {
                    "policy": policy,
                    "task": task,
                    "folder": str(folder),
                    "train_seconds": record["seconds"] if record else None,
                    "command": record["command"] if record else None,
                    **self.success(report),
                }
            )
        name, _, decode = self.decode_setting(self.config.default_steps)
        report = self.evaluate(f"dvla_steps{self.config.default_steps}", self.checkpoint, self.tasks, decode)
        summary, ours = {}, episode_outcomes(report)
        for policy in sorted({r["policy"] for r in rows}):
            mine = [r for r in rows if r["policy"] == policy]
            wins, trials = sum(r["successes"] for r in mine), sum(r["episodes"] for r in mine)
            summary[policy] = {
                "success": wins / trials,
                "wilson95": list(wilson_interval(wins, trials)),
                "tasks": [r["task"] for r in mine],
                # dvla against this peer on the episodes both ran (first = dvla)
                "paired_vs_dvla": paired_comparison(ours, outcomes[policy]),
            }
        steps = ", ".join(f"{p} {peers.steps_for(p)}" for p in peers.policies)
        chunk, executed = peers.control(self.model.config.chunk_size)
        budget = (
            f"each peer: {steps} optimizer steps at batch {peers.batch_size} on its one task "
            f"(LeRobot '{peers.size}' size, chunks of {chunk} with {executed} executed); dvla: one "
            "model for all tasks (see its training config)"
        )
        self.results["peers"] = {"rows": rows, "summary": summary, "budget": budget,
                                 "dvla": {"name": name, **self.success(report)}}  # fmt: skip
        self._peer_folders = {policy: folder for policy, _, folder, _ in trained}

    def latency(self) -> None:
        from dvla.eval.actors import LeRobotActor, resolve_lerobot_policy

        rows, notes = [], []
        default_steps = self.config.default_steps
        # every other few-step sweep setting too: the AR-ratio target is judged at the best of them
        few = sorted({s for s in self.config.decode_steps if 0 < s <= FEW_STEPS and s != default_steps})
        settings = [(default_steps, True), (default_steps, False), *((s, True) for s in few),
                    (self.tokens, True)] + ([(None, True)] if self.autoregressive else [])  # fmt: skip
        for steps, use_cache in settings:
            name, _, decode = self.decode_setting(steps)
            timing = self.time_decode(decode, use_cache)
            rows.append(timing.row(name=name + ("" if use_cache else ", no prefix cache"), cache=use_cache))
        flow_model = self._flow_model()
        timing = self.time_decode(DecodeConfig(), model=flow_model)
        rows.append(timing.row(name=f"dvla flow, {flow_model.config.head.integration_steps} Euler steps"))
        folders = getattr(self, "_peer_folders", {})
        for policy in self.config.peers.policies:
            # a peer trained in this run, else one an earlier run trained on the first task
            folder = folders.get(policy) or self.out / "peers" / policy / self.tasks[0]
            path = resolve_lerobot_policy(folder)
            if path is None:
                notes.append(f"{policy}: no trained peer to time (run the peers section)")
                continue
            actor = LeRobotActor(path, self.device)
            rows.append(
                lat.time_lerobot(actor, self.config.latency_repeats, self.device, self.precision).row(
                    name=policy
                )
            )
        default = self.decode_setting(self.config.default_steps)[0]  # what the targets compare
        # the sequential baseline of the speed-up target: left to right, else one value per forward
        sequential = self.decode_setting(None if self.autoregressive else self.tokens)[0]
        self.results["latency"] = {"rows": rows, "notes": notes, "default": default, "sequential": sequential}

    def _flow_model(self):
        """The flow checkpoint, or an untrained flow-head twin of the checkpoint (latency only)."""
        if self.config.flow_checkpoint:
            return load_checkpoint(self.config.flow_checkpoint, self.device)[0]
        twin = replace(self.model.config, head=FlowHeadConfig())
        return DiffusionVLA(twin, self.model.text, self.model.backbone.config).to(self.device).eval()

    def throughput(self) -> None:
        batch = 4 if self.config.quick else 32
        self.results["throughput"] = measure(self.device, self.precision, batch, self.config.throughput_steps)

    # ---- output ---------------------------------------------------------------------------------
    def save(self) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        self.results["plots"] = plots(self.results, self.out)
        self.results["targets"] = targets(self.results)
        (self.out / "bench.json").write_text(json.dumps(self.results, indent=2))
        (self.out / "bench.md").write_text(markdown(self.results))
        return self.out / "bench.md"


def run(config: BenchConfig) -> dict:
    with exclusive_output(config.output_dir, "dvla bench"):
        return _run(config)


def _run(config: BenchConfig) -> dict:
    bench = Bench(config)
    order = ["throughput", "decode", "heads", "peers", "latency"]  # peers before latency (it times them)
    for section in order:
        if section in config.sections:
            print(f"bench: section {section}")
            {"throughput": bench.throughput, "decode": bench.decode_sweep, "heads": bench.heads,
             "peers": bench.peers, "latency": bench.latency}[section]()  # fmt: skip
            bench.save()  # after every section: an interrupted run keeps what it measured
    report = bench.save()
    print(report.read_text())
    print(f"saved {report}, {bench.out / 'bench.json'} and plots")
    return bench.results


def _settings(encoded: dict) -> dict:
    """A rollout's settings without `resume`, which does not change its result."""
    return {key: value for key, value in encoded.items() if key != "resume"}
