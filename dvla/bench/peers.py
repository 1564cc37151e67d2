"""LeRobot peers trained with `lerobot-train`, one model per task (they take no instruction).

Settings work offline (no pretrained backbone download) and by default match the dvla checkpoint's
control: the same chunk length H, of which H/2 actions are executed before re-planning. A peer whose training
finished is reused; one that stopped part-way resumes from its last checkpoint (lerobot-train's own
--resume).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from dvla.bench.config import PeerConfig

DONE_FILE = "dvla_peer.json"


def control_args(policy: str, chunk: int, steps: int) -> list[str]:
    """`chunk` actions predicted, `steps` of them executed before re-planning."""
    if policy == "act":
        return [f"--policy.chunk_size={chunk}", f"--policy.n_action_steps={steps}"]
    n_obs = 2  # Diffusion Policy's default observation history
    return [
        f"--policy.horizon={chunk}",
        f"--policy.n_action_steps={steps}",
        f"--policy.drop_n_last_frames={chunk - steps - n_obs + 1}",
    ]


OFFLINE_ARGS = {  # ResNet-18 from scratch: no ImageNet download
    "act": ["--policy.pretrained_backbone_weights=null"],
    "diffusion": ["--policy.pretrained_backbone_weights=null", "--policy.use_group_norm=true"],
}
DIFFUSION_WARMUP = 500  # LeRobot's default warmup of Diffusion Policy's cosine schedule
CROP = 0.9  # Diffusion Policy's random-crop augmentation keeps this fraction of the image side
SIZE_ARGS = {
    "default": {"act": [], "diffusion": []},
    "small": {
        "act": ["--policy.dim_model=256", "--policy.n_heads=4", "--policy.dim_feedforward=1024"],
        "diffusion": ["--policy.down_dims=[128,256,512]", "--policy.diffusion_step_embed_dim=64"],
    },
    "tiny": {
        "act": [
            "--policy.dim_model=32",
            "--policy.n_heads=2",
            "--policy.dim_feedforward=64",
            "--policy.n_encoder_layers=1",
            "--policy.n_vae_encoder_layers=1",
            "--policy.latent_dim=8",
        ],
        "diffusion": [
            "--policy.down_dims=[16,32]",
            "--policy.diffusion_step_embed_dim=16",
            "--policy.spatial_softmax_num_keypoints=4",
            "--policy.num_train_timesteps=4",
        ],
    },
}


def _metadata(dataset_root: str | Path):
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

    return LeRobotDatasetMetadata("local/" + Path(dataset_root).name, root=dataset_root)


def task_episodes(dataset_root: str | Path, instructions: dict[str, str]) -> dict[str, list[int]]:
    """{task: indices of its episodes} in a LeRobot dataset (matched by instruction)."""
    meta = _metadata(dataset_root)
    by_text: dict[str, list[int]] = {}
    for row in meta.episodes:
        for text in row["tasks"]:
            by_text.setdefault(text, []).append(int(row["episode_index"]))
    missing = {task: text for task, text in instructions.items() if text not in by_text}
    if missing:
        raise ValueError(
            f"{dataset_root} has no episodes of {sorted(missing)}; it holds {sorted(by_text)}. "
            "Point --peers.dataset_root at the dataset the dvla checkpoint was trained on."
        )
    return {task: sorted(by_text[text]) for task, text in instructions.items()}


def train_args(policy: str, task: str, episodes: list[int], config: PeerConfig, out: Path,
               control: tuple[int, int], device: str, amp: bool = True) -> list[str]:  # fmt: skip
    """The `lerobot-train` command line of one per-task peer; `control`: (chunk length, actions
    executed per chunk); `amp`: autocast as dvla's training does on this machine (bf16 on a CPU with
    native bf16, fp16 on CUDA; off where dvla trains in fp32)."""
    root = Path(config.dataset_root).resolve()  # the peer's train_config.json must find it from anywhere
    size_args = list(SIZE_ARGS[config.size][policy])
    steps = config.steps_for(policy)
    if policy == "diffusion":
        meta = _metadata(root)
        side = min(meta.features[key]["shape"][0] for key in meta.camera_keys)  # (H, W, 3)
        size_args.append(f"--policy.crop_shape=[{int(side * CROP)},{int(side * CROP)}]")
        # LeRobot's 500 warmup steps would fill a short budget: keep them to at most a tenth of it
        warmup = min(DIFFUSION_WARMUP, max(1, steps // 10))
        size_args.append(f"--policy.scheduler_warmup_steps={warmup}")
    return [
        _lerobot_train(),
        f"--dataset.repo_id=local/{root.name}",
        f"--dataset.root={root}",
        f"--dataset.episodes=[{','.join(map(str, episodes))}]",
        f"--policy.type={policy}",
        f"--policy.device={device}",
        "--policy.push_to_hub=false",
        f"--policy.use_amp={str(amp).lower()}",
        *OFFLINE_ARGS[policy],
        *control_args(policy, *control),
        *size_args,
        f"--steps={steps}",
        f"--batch_size={config.batch_size}",
        f"--save_freq={max(1, steps // 4)}",
        "--env_eval_freq=0",
        f"--log_freq={max(1, steps // 20)}",
        f"--num_workers={min(4, os.cpu_count() or 1)}",
        "--seed=1000",
        "--wandb.enable=false",
        f"--output_dir={out}",
        f"--job_name={policy}_{task}",
        *config.extra_args,
    ]


def _lerobot_train() -> str:
    script = Path(sys.executable).with_name("lerobot-train")
    return str(script) if script.exists() else "lerobot-train"


def _require_same_args(out: Path, state: str, before: list[str] | None, now: list[str]) -> None:
    """Refuse to reuse or resume a peer whose `lerobot-train` arguments differ from this run's."""
    if before is None:
        raise FileExistsError(
            f"{out} holds a peer {state} by an older dvla that did not record its lerobot-train "
            "arguments; move it away or use another --output_dir"
        )
    if before[1:] == now[1:]:  # the script path may differ between environments
        return
    had = " ".join(a for a in before[1:] if a not in now) or "the same arguments in another order"
    wanted = " ".join(a for a in now[1:] if a not in before)
    raise FileExistsError(
        f"{out} holds a peer {state} with {had}; move it away or use another --output_dir to train "
        f"with {wanted}"
    )


def trained_step(out: Path) -> int:
    """The step of the last checkpoint a `lerobot-train` run wrote (0 = none)."""
    step_file = out / "checkpoints" / "last" / "training_state" / "training_step.json"
    return json.loads(step_file.read_text())["step"] if step_file.exists() else 0


def train_peer(policy: str, task: str, episodes: list[int], config: PeerConfig, out: Path,
               control: tuple[int, int], device: str, amp: bool = True) -> dict:  # fmt: skip
    """Train (or finish training) one peer; returns its record {policy, task, seconds, command, ...}."""
    done = out / DONE_FILE
    args = train_args(policy, task, episodes, config, out, control, device, amp)
    if done.exists():
        record = json.loads(done.read_text())
        _require_same_args(out, "trained", record.get("args"), args)
        return record
    planned = out.parent / f"{out.name}.args.json"  # the arguments of a run, kept for its resume
    step = trained_step(out)
    run_args = args
    if step:  # resume an interrupted run from its last checkpoint
        before = json.loads(planned.read_text()) if planned.exists() else None
        _require_same_args(out, "partly trained", before, args)
        last = out / "checkpoints" / "last" / "pretrained_model" / "train_config.json"
        run_args = [args[0], f"--config_path={last}", "--resume=true", f"--steps={config.steps_for(policy)}"]
    elif out.exists():
        shutil.rmtree(out)  # started but never reached a checkpoint: nothing to keep
    out.parent.mkdir(parents=True, exist_ok=True)
    planned.write_text(json.dumps(args))
    log = out.parent / f"{out.name}.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    with open(log, "a") as stream:
        stream.write(f"\n$ {' '.join(run_args)}\n")
        stream.flush()
        result = subprocess.run(run_args, stdout=stream, stderr=subprocess.STDOUT, env=env, check=False)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        tail = log.read_text().splitlines()[-15:]
        raise RuntimeError(f"lerobot-train failed for {policy} on {task} (log {log}):\n" + "\n".join(tail))
    record = {
        "policy": policy,
        "task": task,
        "steps": config.steps_for(policy),
        "batch_size": config.batch_size,
        "size": config.size,
        "episodes": len(episodes),
        "args": args,  # what reuse compares
        "seconds": seconds,  # of this run only when it resumed
        "resumed_from_step": step,
        "command": " ".join(args),
        "resumed_with": " ".join(run_args) if step else None,
        "log": str(log),
    }
    done.write_text(json.dumps(record, indent=2))
    return record
