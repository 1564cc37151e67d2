"""`dvla train`: AdamW + warmup/cosine, bf16 autocast, gradient accumulation, accelerate (one CPU
process by default, `accelerate launch` for DDP/FSDP), atomic checkpoints and exact resume."""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import draccus
import torch
from torch.utils.data import DataLoader, Sampler

from dvla.train_config import TrainConfig

CHECKPOINTS = "checkpoints"
TRAINING_STATE = "training_state.pt"


class ResumableBatchSampler(Sampler[list[int]]):
    """Shuffled batches whose order depends only on (seed, epoch): batch g of the run is always the
    same, so a resumed run starts exactly where the interrupted one stopped."""

    def __init__(self, size: int, batch_size: int, seed: int, start_batch: int = 0):
        if size < batch_size:
            raise ValueError(f"the dataset has {size} samples, fewer than batch_size={batch_size}")
        self.size, self.batch_size, self.seed, self.start = size, batch_size, seed, start_batch
        self.per_epoch = size // batch_size  # the last partial batch is dropped

    def __len__(self) -> int:
        return 10**12  # endless: the training loop decides when to stop

    def __iter__(self):
        g = self.start
        while True:
            epoch, offset = divmod(g, self.per_epoch)
            order = torch.randperm(
                self.size, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            )
            for b in range(offset, self.per_epoch):
                yield order[b * self.batch_size : (b + 1) * self.batch_size].tolist()
                g += 1


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine decay to min_ratio at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass
class TrainResult:
    step: int
    last_loss: float
    checkpoint: Path | None


def checkpoint_dirs(output_dir: Path) -> list[Path]:
    """Finished checkpoints, oldest first (a folder is finished once renamed into place)."""
    root = output_dir / CHECKPOINTS
    return sorted(p for p in root.glob("step-*") if p.is_dir()) if root.exists() else []


def train(config: TrainConfig) -> TrainResult:
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    from dvla.backbone.tokenizer import train_text_tokenizer
    from dvla.checkpoint import load_checkpoint
    from dvla.data import LeRobotChunks, collate
    from dvla.model import DiffusionVLA, TextSpecials
    from dvla.policy import DiffusionVLAPolicy

    output = Path(config.output_dir)
    existing = checkpoint_dirs(output)
    if existing and not config.resume:
        raise FileExistsError(
            f"{output} already has checkpoints; pass --resume to continue or use another output_dir"
        )
    accelerator = Accelerator(
        cpu=not torch.cuda.is_available(),
        mixed_precision=config.mixed_precision,
        log_with="tensorboard" if config.tensorboard else None,
        project_dir=str(output / "logs"),
    )
    if config.tensorboard:
        accelerator.init_trackers("dvla")
    set_seed(config.seed)
    data = LeRobotChunks(config.dataset)
    start_step = 0
    if config.resume and existing:
        model, tokenizer, stats = load_checkpoint(existing[-1])
        start_step = int(json.loads((existing[-1] / "step.json").read_text())["step"])
    else:
        tokenizer = train_text_tokenizer(data.tasks, vocab_size=config.model.text_vocab_size)
        model = DiffusionVLA(config.model, TextSpecials.from_tokenizer(tokenizer))
        stats = data.stats
    _check_fits(config, data, model)
    info = {
        "tasks": data.tasks,
        "dataset": config.dataset.repo_id or config.dataset.root,
        "fps": data.fps,
        "cameras": data.cameras,
    }
    policy = DiffusionVLAPolicy(model, tokenizer, stats)
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=config.optim.lr,
        weight_decay=config.optim.weight_decay,
        betas=config.optim.betas,
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: lr_factor(s, config.optim.warmup_steps, config.steps, config.optim.min_lr_ratio),
    )
    state = torch.load(existing[-1] / TRAINING_STATE, weights_only=True) if start_step else None
    if state is not None:
        opt.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["scheduler"])
    sampler = ResumableBatchSampler(len(data), config.batch_size, config.seed, start_step * config.grad_accum)
    loader = DataLoader(
        data,
        batch_sampler=sampler,
        collate_fn=collate,
        num_workers=config.num_workers,
        generator=torch.Generator().manual_seed(config.seed),  # keeps the loader off the global RNG
    )
    model, opt, loader = accelerator.prepare(model, opt, loader)
    if accelerator.is_main_process:
        output.mkdir(parents=True, exist_ok=True)
        (output / "train_config.yaml").write_text(draccus.dump(config))
    model.train()
    batches = iter(loader)
    if state is not None:
        torch.set_rng_state(state["torch_rng"])
    loss_value, saved = float("nan"), None
    from tqdm import tqdm

    stop = (
        config.steps
        if config.steps_this_run is None
        else min(config.steps, start_step + config.steps_this_run)
    )
    bar = tqdm(range(start_step, stop), initial=start_step, total=config.steps, desc="train",
               disable=not accelerator.is_main_process)  # fmt: skip
    started = time.perf_counter()
    for step in bar:
        for _ in range(config.grad_accum):
            batch = policy.action_batch(next(batches))
            with accelerator.autocast():
                loss, _ = model(batch)  # through the DDP/FSDP wrapper, which syncs gradients
            accelerator.backward(loss / config.grad_accum)
        accelerator.clip_grad_norm_(model.parameters(), config.optim.grad_clip)
        opt.step()
        schedule.step()
        opt.zero_grad()
        loss_value = float(loss.detach())
        samples = (step + 1 - start_step) * config.batch_size * config.grad_accum * accelerator.num_processes
        rate = samples / (time.perf_counter() - started)
        lr = schedule.get_last_lr()[0]
        bar.set_postfix(loss=f"{loss_value:.3f}", lr=f"{lr:.2e}", samples_s=f"{rate:.1f}")
        if (step + 1) % config.log_every == 0 and config.tensorboard:
            accelerator.log(
                {"train/loss": loss_value, "train/lr": lr, "train/samples_per_s": rate}, step=step + 1
            )
        done = step + 1
        if accelerator.is_main_process and (done % config.save_every == 0 or done == stop):
            saved = _save(
                output, done, accelerator.unwrap_model(model), tokenizer, stats, opt, schedule, config, info
            )
    _check_ranks_agree(accelerator, model)
    accelerator.end_training()
    return TrainResult(stop, loss_value, saved)


def _check_ranks_agree(accelerator, model) -> None:
    """With several processes, every rank must end with the same parameters (a cheap checksum)."""
    if accelerator.num_processes == 1:
        return
    checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum().reshape(1)
    sums = accelerator.gather(checksum.to(accelerator.device))
    if not torch.all(sums == sums[0]):
        raise RuntimeError(f"parameters differ across processes: checksums {sums.tolist()}")
    accelerator.print(f"parameters identical across {accelerator.num_processes} processes")


def _check_fits(config: TrainConfig, data, model) -> None:
    if data.action_dim != model.config.action_dim or data.state_dim != model.config.state_dim:
        raise ValueError(
            f"the dataset has state/action dims {data.state_dim}/{data.action_dim}, the model "
            f"{model.config.state_dim}/{model.config.action_dim}: set --model.state_dim/--model.action_dim"
        )
    if sorted(data.cameras) != sorted(model.config.vision.cameras):
        raise ValueError(
            f"the dataset's cameras {sorted(data.cameras)} differ from the model's "
            f"{model.config.vision.cameras}: set --model.vision.cameras or --dataset.cameras"
        )
    if config.dataset.chunk_size != model.config.chunk_size:
        raise ValueError(
            f"dataset.chunk_size {config.dataset.chunk_size} != model.chunk_size {model.config.chunk_size}"
        )


def _save(output, step, model, tokenizer, stats, opt, schedule, config, training_info) -> Path:
    """Write step-N atomically (save_checkpoint renames a finished folder into place), keep the last K."""
    from dvla.checkpoint import save_checkpoint

    path = output / CHECKPOINTS / f"step-{step:08d}"
    staging = output / CHECKPOINTS / f".staging-{step:08d}"
    shutil.rmtree(staging, ignore_errors=True)
    save_checkpoint(staging / "model", model, tokenizer, stats, training_info)
    torch.save(
        {
            "optimizer": opt.state_dict(),
            "scheduler": schedule.state_dict(),
            "torch_rng": torch.get_rng_state(),
        },
        staging / "model" / TRAINING_STATE,
    )
    (staging / "model" / "step.json").write_text(json.dumps({"step": step}))
    (staging / "model").rename(path)
    shutil.rmtree(staging)
    for old in checkpoint_dirs(output)[: -config.keep_last]:
        shutil.rmtree(old)
    return path


def run(config: TrainConfig) -> TrainResult:
    result = train(config)
    print(f"trained to step {result.step}, last loss {result.last_loss:.4f}, checkpoint {result.checkpoint}")
    return result
