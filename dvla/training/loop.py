"""`dvla train`: AdamW + warmup/cosine, bf16 autocast where it is fast, gradient accumulation,
accelerate (one CPU process by default, `accelerate launch` or torchrun for DDP; FSDP is refused),
atomic checkpoints and exact resume."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

import draccus
import torch

from dvla.adapters.base import fit_to_data
from dvla.backbone.tokenizer import train_text_tokenizer
from dvla.checkpoint import STEP_FILE, TRAINING_STATE, checkpoint_format, load_checkpoint, save_checkpoint
from dvla.data import (
    LeRobotChunks,
    VQAScenes,
    VQAScenesByImage,
    collate_by_image,
    dataset_name,
    robot_dataset,
)
from dvla.data.mixing import PERCEPTION, ROBOT, VQA, MixedBatches, make_loader, mixing_ratio
from dvla.locks import exclusive_output
from dvla.model import DiffusionVLA, TextSpecials
from dvla.processor import Processor
from dvla.training.checks import check_fits, check_perception_fits, note_shared_norm_stats
from dvla.training.config import TrainConfig
from dvla.training.finetune import init_from_checkpoint
from dvla.training.from_data import fill_from_data
from dvla.training.precision import resolve_precision

CHECKPOINTS = "checkpoints"
MAIN_LOSSES = ("action_loss", "answer_loss")  # the head's loss alone, when adapters add theirs


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


@dataclass
class RunData:
    """The data of a run: robot chunks, VQA scenes and perception frames (each may be None)."""

    robot: object
    vqa: VQAScenes | None
    perception: LeRobotChunks | None
    ratio: float  # fraction of VQA micro-batches

    @classmethod
    def load(cls, config: TrainConfig) -> RunData:
        robot = robot_dataset(config.robot_datasets)
        perception = LeRobotChunks(config.perception) if config.perception is not None else None
        vqa = VQAScenes(config.vqa.root, config.vqa.split, config.vqa.image_size) if config.vqa.root else None
        return cls(robot, vqa, perception, mixing_ratio(robot is not None, vqa is not None, config.vqa.ratio))

    def facts(self) -> dict:
        """What adapters' configs take from the data (`fit`)."""
        facts = {"sim_state_dim": self.robot.sim_state_dim if self.robot else 0}
        return facts | (VQAScenes.facts() if self.vqa is not None else {})

    def info(self, config: TrainConfig) -> dict:
        """What the checkpoint records about its training data."""
        robot = self.robot
        return {
            "tasks": robot.tasks if robot else [],
            "dataset": ", ".join(dataset_name(d) for d in config.robot_datasets) or None,
            "vqa": config.vqa.root,
            "fps": robot.fps if robot else None,
            "robot_type": robot.robot_type if robot else None,
            "cameras": robot.cameras if robot else {},
            "init_from": config.init_from,
            "perception": dataset_name(config.perception) if self.perception is not None else None,
        }


def checkpoint_dirs(output_dir: Path) -> list[Path]:
    """Finished checkpoints, oldest first (a folder is finished once renamed into place)."""
    root = output_dir / CHECKPOINTS
    return sorted(p for p in root.glob("step-*") if p.is_dir()) if root.exists() else []


def train(config: TrainConfig) -> TrainResult:
    """Train, holding output_dir for this run (the main process of a multi-process run holds it)."""
    main = int(os.environ.get("RANK", "0")) == 0
    with exclusive_output(config.output_dir, "dvla train") if main else contextlib.nullcontext():
        return _train(config)


def _train(config: TrainConfig) -> TrainResult:
    from accelerate.utils import set_seed

    _refuse_fsdp()
    output = Path(config.output_dir)
    existing = checkpoint_dirs(output)
    if existing and not config.resume:
        raise FileExistsError(
            f"{output} already has checkpoints; pass --resume to continue or use another output_dir"
        )
    data = RunData.load(config)
    accelerator = _accelerator(config, output, data.ratio)
    set_seed(config.seed)
    start_step, state = 0, None
    if config.resume and existing:
        model, tokenizer, stats, start_step, state = _resume_latest_intact(
            config, output, existing, accelerator
        )
    else:
        model, tokenizer = _new_model(config, data, accelerator)
        stats = data.robot.stats if data.robot else {}
        model.bind_stats(stats)
    model.train()
    note_shared_norm_stats(model, data.ratio, accelerator)
    check_fits(config, data.robot, data.vqa, model)
    check_perception_fits(config, data.robot, data.perception)
    if data.vqa is not None:
        data.vqa = data.vqa.with_targets(model.data_targets())
    processor = Processor(tokenizer, stats, model.config, accelerator.device)
    ema = _ema(config, model, state)
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=config.optim.lr,
        weight_decay=config.optim.weight_decay,
        betas=config.optim.betas,
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, config.optim.warmup_steps, config.steps, config.optim.min_lr_ratio)
    )
    if state is not None:
        opt.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["scheduler"])
    loaders = _loaders(config, data, start_step * config.grad_accum)
    model, opt, *prepared = accelerator.prepare(model, opt, *loaders.values())
    prepared = dict(zip(loaders, prepared, strict=True))
    batches = MixedBatches(
        prepared, data.ratio, start_step * config.grad_accum, perception=prepared.pop(PERCEPTION, None)
    )
    if accelerator.is_main_process:
        output.mkdir(parents=True, exist_ok=True)
        (output / "train_config.yaml").write_text(draccus.dump(config))
    if state is not None:
        torch.set_rng_state(state["torch_rng"])
    stop = (
        config.steps
        if config.steps_this_run is None
        else min(config.steps, start_step + config.steps_this_run)
    )
    run = _Run(config, accelerator, model, opt, schedule, ema, processor, batches)
    saved = run.steps(start_step, stop, output, (tokenizer, stats, data.info(config)))
    _check_ranks_agree(accelerator, model)
    del model, prepared, batches, run
    _end_distributed(accelerator)
    return TrainResult(stop, saved.last_loss, saved.path)


def _accelerator(config: TrainConfig, output: Path, ratio: float):
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision = resolve_precision(config.mixed_precision, device)
    if precision != config.mixed_precision:
        print(f"mixed_precision {config.mixed_precision} -> {precision} on this {device.type}")
    accelerator = Accelerator(
        cpu=device.type == "cpu",
        mixed_precision=precision,
        log_with=config.trackers or None,
        project_dir=str(output / "logs"),
        # co-training batches leave the action (or answer) layers unused; DDP must not wait for them
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=0 < ratio < 1)],
    )
    if config.trackers:
        accelerator.init_trackers(config.wandb_project, config=_flat_config(config))
    return accelerator


def _refuse_fsdp() -> None:
    """FSDP (`accelerate launch --use_fsdp`, which sets ACCELERATE_USE_FSDP) is refused: on a CPU
    accelerate silently trains plain DDP instead, and dvla's EMA, checkpoints and cross-rank check
    read whole parameters, which FSDP shards."""
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("1", "true", "yes"):
        raise ValueError(
            "FSDP is not supported by dvla train (ACCELERATE_USE_FSDP is set, e.g. by `accelerate launch "
            "--use_fsdp`): its EMA, checkpoints and cross-rank check need every rank to hold whole "
            "parameters, and on a CPU accelerate would run DDP instead. Launch data-parallel without "
            "--use_fsdp (`accelerate launch -m dvla.cli train ...` or torchrun); dvla's models fit one GPU."
        )


def _resume_latest_intact(config: TrainConfig, output: Path, existing: list[Path], accelerator):
    """(model, tokenizer, stats, step, training state) of the newest checkpoint that loads; a damaged
    newer one is set aside (renamed broken-step-N, never deleted) with a warning."""
    _check_resume_config(config, output)
    for last in reversed(existing):
        try:
            version = checkpoint_format(last)
        except (ValueError, FileNotFoundError) as err:
            _set_aside(last, err, accelerator)
            continue
        if version != 2:
            raise ValueError(
                f"{last} is a format-{version} checkpoint (before adapters): its optimizer state cannot be "
                f"resumed. Start a new run from its weights with --init_from {last} and another output_dir"
            )
        try:
            model, tokenizer, stats = load_checkpoint(last)
            step = int(json.loads((last / STEP_FILE).read_text())["step"])
            state = torch.load(last / TRAINING_STATE, weights_only=True)
        except Exception as err:  # a damaged file fails in many ways (IndexError from a torn pickle...)
            _set_aside(last, err, accelerator)
            continue
        return model, tokenizer, stats, step, state
    raise FileNotFoundError(f"no intact checkpoint left in {output / CHECKPOINTS} to resume from")


def _set_aside(path: Path, err: BaseException, accelerator) -> None:
    aside = path.with_name(f"broken-{path.name}")
    if accelerator.is_main_process:
        path.rename(aside)
    accelerator.wait_for_everyone()
    accelerator.print(f"warning: {path} is damaged ({err}); set aside as {aside.name}, trying the one before")


def _new_model(config: TrainConfig, data: RunData, accelerator):
    """A fresh model (tokenizer trained on the run's text, or a causal LM's weights and tokenizer
    with `model.backbone.init_from`) or one initialised from a dvla checkpoint, with the adapters'
    data-dependent settings taken from the data."""
    model_config, notes = fill_from_data(config.model, data.robot, data.vqa)
    for note in notes:
        accelerator.print(f"from the data: {note}")
    model_config = replace(model_config, adapters=fit_to_data(model_config.adapters, data.facts()))
    if config.init_from:
        model, tokenizer, report = init_from_checkpoint(config.init_from, model_config)
        accelerator.print(f"init_from {config.init_from}: {report.summary()}")
        return model, tokenizer
    if model_config.backbone.init_from:  # a causal LM's weights read text with its own tokenizer
        from dvla.backbone.pretrained import pretrained_text

        source = model_config.backbone.init_from
        tokenizer, text_vocab = pretrained_text(source)
        accelerator.print(f"backbone: {source}, with its tokenizer ({text_vocab} tokens)")
        text = TextSpecials(text_vocab, tokenizer.pad_token_id, tokenizer.eos_token_id)
        return DiffusionVLA(model_config, text), tokenizer
    texts = list(data.robot.tasks) if data.robot else []
    if data.vqa is not None:
        texts += [*data.vqa.data["question"], *data.vqa.data["answer"]]
    tokenizer = train_text_tokenizer(texts, vocab_size=config.model.text_vocab_size)
    return DiffusionVLA(model_config, TextSpecials.from_tokenizer(tokenizer)), tokenizer


def _loaders(config: TrainConfig, data: RunData, first: int) -> dict:
    """One resumable loader per source, starting at micro-batch `first` of the run."""
    vqa_done = math.floor(first * data.ratio)
    loaders = {}
    if data.robot is not None:
        loaders[ROBOT] = make_loader(
            data.robot, config.batch_size, config.seed, first - vqa_done, config.num_workers
        )
    if data.vqa is not None:
        loaders[VQA] = _vqa_loader(config, data.vqa, vqa_done)
    if data.perception is not None:  # rides along the robot batches, so it starts where they are
        loaders[PERCEPTION] = make_loader(
            data.perception, config.perception_batch_size or config.batch_size, config.seed + 2,
            first - vqa_done, config.num_workers,
        )  # fmt: skip
    return loaders


def _vqa_loader(config: TrainConfig, vqa: VQAScenes, start_batch: int):
    """batch_size questions per VQA batch, or with vqa.images_per_batch that many scenes and all
    their questions."""
    seed = config.seed + 1
    if config.vqa.images_per_batch is None:
        return make_loader(vqa, config.batch_size, seed, start_batch, config.num_workers)
    scenes = VQAScenesByImage(vqa, config.vqa.extra_spatial_questions, seed=config.seed)
    return make_loader(
        scenes, config.vqa.images_per_batch, seed, start_batch, config.num_workers, collate_by_image
    )


@dataclass
class Saved:
    path: Path | None = None
    last_loss: float = float("nan")


class _Run:
    """The optimisation steps of one invocation: forward/backward per micro-batch, logging, saving."""

    def __init__(self, config, accelerator, model, opt, schedule, ema, processor, batches):
        self.config, self.accelerator, self.model = config, accelerator, model
        self.opt, self.schedule, self.ema = opt, schedule, ema
        self.processor, self.batches = processor, batches
        self.losses: dict[str, float] = {}  # the head's loss per source
        self.aux: dict[str, float] = {}  # the adapters' metrics ("<adapter>/<metric>")
        self.samples, self.started = 0, time.perf_counter()
        self.nonfinite = 0  # skipped steps in a row (NaN or inf loss or gradient)
        # running statistics (batch norm) change in the forward pass: a skipped step restores them
        unwrapped = accelerator.unwrap_model(model)
        self.buffers = [b for b in unwrapped.buffers() if b.is_floating_point()]

    def steps(self, start: int, stop: int, output: Path, checkpoint_parts) -> Saved:
        from tqdm import tqdm

        config, accelerator = self.config, self.accelerator
        saved = Saved()
        bar = tqdm(range(start, stop), initial=start, total=config.steps, desc="train",
                   disable=not accelerator.is_main_process)  # fmt: skip
        for step in bar:
            self._step(step)
            lr = self.schedule.get_last_lr()[0]
            rate = self.samples / (time.perf_counter() - self.started)
            shown = {("loss" if k == ROBOT else "vqa_loss"): f"{v:.3f}" for k, v in self.losses.items()}
            shown.update({k.replace("/", "."): f"{v:.3f}" for k, v in self.aux.items()})
            bar.set_postfix(**shown, lr=f"{lr:.2e}", samples_s=f"{rate:.1f}")
            if (step + 1) % config.log_every == 0 and config.trackers:
                logs = {f"train/{k}_loss": v for k, v in self.losses.items()}
                logs.update({f"train/{k}": v for k, v in self.aux.items()})
                accelerator.log({**logs, "train/lr": lr, "train/samples_per_s": rate}, step=step + 1)
            done = step + 1
            if accelerator.is_main_process and (done % config.save_every == 0 or done == stop):
                saved.path = self._save(output, done, *checkpoint_parts)
        saved.last_loss = self.losses.get(ROBOT, self.losses.get(VQA, float("nan")))
        return saved

    def _step(self, step: int) -> None:
        config, accelerator, model = self.config, self.accelerator, self.model
        sources, buffers = [], [b.detach().clone() for b in self.buffers]
        for _ in range(config.grad_accum):
            source, sample = next(self.batches)
            batch = self.processor.vqa_batch(sample) if source == VQA else self.processor.action_batch(sample)
            self.samples += batch.observation.batch_size * accelerator.num_processes
            sources.append(source)
            with accelerator.autocast():
                loss, metrics = model(batch)  # through the DDP wrapper, which syncs gradients
            accelerator.backward(loss / config.grad_accum)
            # the head's loss alone, comparable with runs without auxiliary targets
            main = [metrics[k] for k in MAIN_LOSSES if k in metrics]
            self.losses[source] = main[0] if main else float(loss.detach())
            self.aux.update({k: v for k, v in metrics.items() if "/" in k})
        norm = accelerator.clip_grad_norm_(model.parameters(), config.optim.grad_clip)
        if not torch.isfinite(torch.as_tensor(norm)):  # the same on every rank: gradients are synced
            with torch.no_grad():
                for buffer, before in zip(self.buffers, buffers, strict=True):
                    buffer.copy_(before)
            self._skip(step, sources)
            return
        self.nonfinite = 0
        self.opt.step()
        self.schedule.step()
        self.opt.zero_grad()
        if self.ema is not None:
            self.ema.update_parameters(accelerator.unwrap_model(model))

    def _skip(self, step: int, sources: list[str]) -> None:
        """Leave the weights as they are after a NaN or inf gradient; stop after too many in a row."""
        self.opt.zero_grad()
        self.schedule.step()  # the schedule keeps its place, as a resumed run expects
        self.nonfinite += 1
        what = f"step {step + 1}: the loss or gradient is NaN or inf (batches from {sorted(set(sources))})"
        if self.nonfinite >= self.config.max_nonfinite_steps:
            raise RuntimeError(
                f"{what}, {self.nonfinite} steps in a row; stopped without saving. Check the data "
                "(NaN or huge values), lower optim.lr, or try --mixed_precision no"
            )
        self.accelerator.print(f"warning: {what}; step skipped, weights unchanged")

    def _save(self, output: Path, step: int, tokenizer, stats, info) -> Path:
        """Write step-N atomically (save_checkpoint renames a finished folder into place), keep the
        last K. With EMA the checkpoint's model is the average and the raw weights go into the
        training state."""
        model, ema = self.accelerator.unwrap_model(self.model), self.ema
        path = output / CHECKPOINTS / f"step-{step:08d}"
        staging = output / CHECKPOINTS / f".staging-{step:08d}"
        shutil.rmtree(staging, ignore_errors=True)
        save_checkpoint(staging / "model", ema.module if ema else model, tokenizer, stats, info)
        training_state = {
            "optimizer": self.opt.state_dict(),
            "scheduler": self.schedule.state_dict(),
            "torch_rng": torch.get_rng_state(),
        }
        if ema is not None:
            training_state |= {"raw_model": model.state_dict(), "ema_n_averaged": ema.n_averaged.clone()}
        torch.save(training_state, staging / "model" / TRAINING_STATE)
        (staging / "model" / STEP_FILE).write_text(json.dumps({"step": step}))
        (staging / "model").rename(path)
        shutil.rmtree(staging)
        for old in checkpoint_dirs(output)[: -self.config.keep_last]:
            shutil.rmtree(old)
        return path


def _flat_config(config: TrainConfig) -> dict:
    """The resolved config as flat scalars (a.b.c -> value), as trackers' hyperparameter tables want."""
    import dataclasses

    flat = {}

    def visit(prefix, value):
        if dataclasses.is_dataclass(value):
            for f in dataclasses.fields(value):
                visit(f"{prefix}{f.name}.", getattr(value, f.name))
        elif isinstance(value, (int, float, str, bool)) or value is None:
            flat[prefix[:-1]] = "None" if value is None else value
        else:
            flat[prefix[:-1]] = str(value)

    visit("", config)
    return flat


def _ema(config: TrainConfig, model, state):
    """A bias-corrected exponential moving average of the weights (saved as the checkpoint's model),
    or None."""
    if config.ema_decay is None:
        return None
    from torch.optim.swa_utils import AveragedModel

    from dvla.training.ema import bias_corrected_ema

    ema = AveragedModel(model, multi_avg_fn=bias_corrected_ema(config.ema_decay), use_buffers=True)
    if state is not None:  # the checkpoint's weights are the average; the raw ones are in the state
        model.load_state_dict(state["raw_model"])
        ema.n_averaged.fill_(int(state["ema_n_averaged"]))
    return ema


def _check_resume_config(config: TrainConfig, output: Path) -> None:
    """--resume continues the run with its model: refuse --model settings that differ from the ones
    the run started with (its saved train_config.yaml)."""
    import yaml

    saved_file = output / "train_config.yaml"
    if not saved_file.exists():
        return
    saved = draccus.decode(TrainConfig, yaml.safe_load(saved_file.read_text()))
    if draccus.encode(config.model) != draccus.encode(saved.model):
        raise ValueError(
            f"--resume: the --model settings differ from the ones {output} was started with "
            f"({saved_file}); a resumed run keeps its model (drop the overrides or use another output_dir)"
        )


def _end_distributed(accelerator) -> None:
    """Stop trackers and tear the process group down without the exit hang of gloo.

    Freeing a DDP model frees its process group while holding the GIL; a gloo worker thread that
    still has to release a finished collective's tensors needs the GIL too, so the two wait on each
    other forever (pytorch/pytorch#56297). The Python handle on the group releases the GIL in its
    destructor, so it is kept until every DDP wrapper is gone and dropped last.
    """
    world = torch.distributed.group.WORLD if torch.distributed.is_initialized() else None
    # drops the accelerator's references to the wrapped model, then garbage-collects, so a DDP wrapper
    # caught in a reference cycle is freed too while `world` still holds the group
    accelerator.free_memory()
    accelerator.end_training()
    del world


def _check_ranks_agree(accelerator, model) -> None:
    """With several processes, every rank must end with the same parameters (a cheap checksum)."""
    if accelerator.num_processes == 1:
        return
    checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum().reshape(1)
    sums = accelerator.gather(checksum.to(accelerator.device))
    if not torch.all(sums == sums[0]):
        raise RuntimeError(f"parameters differ across processes: checksums {sums.tolist()}")
    accelerator.print(f"parameters identical across {accelerator.num_processes} processes")


def run(config: TrainConfig) -> TrainResult:
    result = train(config)
    print(f"trained to step {result.step}, last loss {result.last_loss:.4f}, checkpoint {result.checkpoint}")
    return result
