"""`dvla train`: AdamW + warmup/cosine, bf16 autocast, gradient accumulation, accelerate (one CPU
process by default, `accelerate launch` for DDP/FSDP), atomic checkpoints and exact resume."""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

import draccus
import torch

from dvla.precision import resolve_precision
from dvla.train_config import TrainConfig
from dvla.train_data import (
    PERCEPTION,
    ROBOT,
    VQA,
    MixedBatches,
    ResumableBatchSampler,
    make_loader,
    mixing_ratio,
)

__all__ = ["ResumableBatchSampler", "checkpoint_dirs", "lr_factor", "train"]

CHECKPOINTS = "checkpoints"
TRAINING_STATE = "training_state.pt"


# auxiliary-target metrics of the model's loss -> their short name on the progress bar
AUX_METRICS = {
    "sim_state_mse": "sim_mse",
    "scene_map_bce": "map_bce",
    "scene_map_position_mse": "pos_mse",
    "referent_ce": "ref_ce",
    "referent_place_mse": "ref_mse",
    "comparison_ce": "cmp_ce",
}


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
    from accelerate.utils import DistributedDataParallelKwargs, set_seed

    from dvla.checkpoint import load_checkpoint
    from dvla.data import LeRobotChunks, VQAScenes
    from dvla.policy import DiffusionVLAPolicy
    from dvla.robot_data import dataset_name, robot_dataset

    output = Path(config.output_dir)
    existing = checkpoint_dirs(output)
    if existing and not config.resume:
        raise FileExistsError(
            f"{output} already has checkpoints; pass --resume to continue or use another output_dir"
        )
    robot = robot_dataset(config.robot_datasets)
    perception = LeRobotChunks(config.perception) if config.perception is not None else None
    vqa = VQAScenes(config.vqa.root, config.vqa.split, config.vqa.image_size) if config.vqa.root else None
    ratio = mixing_ratio(robot is not None, vqa is not None, config.vqa.ratio)
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
    set_seed(config.seed)
    start_step, state = 0, None
    if config.resume and existing:
        model, tokenizer, stats = load_checkpoint(existing[-1])
        start_step = int(json.loads((existing[-1] / "step.json").read_text())["step"])
        state = torch.load(existing[-1] / TRAINING_STATE, weights_only=True)
        _check_resume_config(config, output)
    else:
        model, tokenizer = _new_model(config, robot, vqa, accelerator)
        stats = robot.stats if robot else {}
    model.train()
    _note_shared_norm_stats(model, ratio, accelerator)
    _check_fits(config, robot, vqa, model)
    _check_perception_fits(config, robot, perception, model)
    if vqa is not None:
        vqa.scene_map_grid = model.scene_map_grid  # the auxiliary target's grid, None without one
        vqa.referent_grid = model.referent_grid  # the pointers' target grid, None without one
    info = {
        "tasks": robot.tasks if robot else [],
        "dataset": ", ".join(dataset_name(d) for d in config.robot_datasets) or None,
        "vqa": config.vqa.root,
        "fps": robot.fps if robot else None,
        "cameras": robot.cameras if robot else {},
        "init_from": config.init_from,
        "perception": dataset_name(config.perception) if perception is not None else None,
    }
    policy = DiffusionVLAPolicy(model, tokenizer, stats)
    ema = _ema(config, model, state)
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
    if state is not None:
        opt.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["scheduler"])
    first = start_step * config.grad_accum  # micro-batches already consumed
    vqa_done = math.floor(first * ratio)
    loaders = {}
    if robot is not None:
        loaders[ROBOT] = make_loader(
            robot, config.batch_size, config.seed, first - vqa_done, config.num_workers
        )
    if vqa is not None:
        loaders[VQA] = _vqa_loader(config, vqa, vqa_done)
    if perception is not None:  # rides along the robot batches, so it starts where they are
        loaders[PERCEPTION] = make_loader(
            perception, config.perception_batch_size or config.batch_size, config.seed + 2,
            first - vqa_done, config.num_workers,
        )  # fmt: skip
    model, opt, *prepared = accelerator.prepare(model, opt, *loaders.values())
    prepared = dict(zip(loaders, prepared, strict=True))
    batches = MixedBatches(prepared, ratio, first, perception=prepared.pop(PERCEPTION, None))
    if accelerator.is_main_process:
        output.mkdir(parents=True, exist_ok=True)
        (output / "train_config.yaml").write_text(draccus.dump(config))
    if state is not None:
        torch.set_rng_state(state["torch_rng"])
    losses: dict[str, float] = {}
    aux: dict[str, float] = {}  # the auxiliary targets' errors, when the run has them
    saved = None
    from tqdm import tqdm

    stop = (
        config.steps
        if config.steps_this_run is None
        else min(config.steps, start_step + config.steps_this_run)
    )
    bar = tqdm(range(start_step, stop), initial=start_step, total=config.steps, desc="train",
               disable=not accelerator.is_main_process)  # fmt: skip
    started, samples = time.perf_counter(), 0
    for step in bar:
        for _ in range(config.grad_accum):
            source, sample = next(batches)
            batch = policy.vqa_batch(sample) if source == VQA else policy.action_batch(sample)
            samples += batch.observation.batch_size * accelerator.num_processes
            with accelerator.autocast():
                loss, metrics = model(batch)  # through the DDP/FSDP wrapper, which syncs gradients
            accelerator.backward(loss / config.grad_accum)
            # the action (or answer) loss alone, comparable with runs without an auxiliary target
            losses[source] = metrics.get("action_loss", metrics.get("answer_loss", float(loss.detach())))
            aux.update({k: metrics[k] for k in AUX_METRICS if k in metrics})
        accelerator.clip_grad_norm_(model.parameters(), config.optim.grad_clip)
        opt.step()
        schedule.step()
        opt.zero_grad()
        if ema is not None:
            ema.update_parameters(accelerator.unwrap_model(model))
        rate = samples / (time.perf_counter() - started)
        lr = schedule.get_last_lr()[0]
        shown = {f"{'loss' if k == ROBOT else 'vqa_loss'}": f"{v:.3f}" for k, v in losses.items()}
        shown.update({AUX_METRICS[k]: f"{v:.3f}" for k, v in aux.items()})
        bar.set_postfix(**shown, lr=f"{lr:.2e}", samples_s=f"{rate:.1f}")
        if (step + 1) % config.log_every == 0 and config.trackers:
            logs = {f"train/{k}_loss": v for k, v in losses.items()}
            logs.update({f"train/{k}": v for k, v in aux.items()})
            accelerator.log({**logs, "train/lr": lr, "train/samples_per_s": rate}, step=step + 1)
        done = step + 1
        if accelerator.is_main_process and (done % config.save_every == 0 or done == stop):
            saved = _save(output, done, accelerator.unwrap_model(model), ema, tokenizer, stats, opt, schedule,
                          config, info)  # fmt: skip
    _check_ranks_agree(accelerator, model)
    del model, prepared, batches
    _end_distributed(accelerator)
    return TrainResult(stop, losses.get(ROBOT, losses.get(VQA, float("nan"))), saved)


def _new_model(config: TrainConfig, robot, vqa, accelerator):
    """A fresh model (tokenizer trained on the run's text) or one initialised from a checkpoint."""
    from dvla.backbone.tokenizer import train_text_tokenizer
    from dvla.finetune import init_from_checkpoint
    from dvla.model import DiffusionVLA, TextSpecials

    # the auxiliary simulator-state head is sized by the data (0 = none)
    sim_state_dim = robot.sim_state_dim if robot else 0
    if config.model.sim_state_dim not in (0, sim_state_dim):
        raise ValueError(
            f"model.sim_state_dim={config.model.sim_state_dim} but the data's simulator state has "
            f"{sim_state_dim} dimensions; leave model.sim_state_dim unset (it follows dataset.sim_state_key)"
        )
    model_config = replace(config.model, sim_state_dim=sim_state_dim)
    if config.init_from:
        model, tokenizer, report = init_from_checkpoint(config.init_from, model_config)
        accelerator.print(f"init_from {config.init_from}: {report.summary()}")
        return model, tokenizer
    texts = list(robot.tasks) if robot else []
    if vqa is not None:
        texts += [*vqa.data["question"], *vqa.data["answer"]]
    tokenizer = train_text_tokenizer(texts, vocab_size=config.model.text_vocab_size)
    return DiffusionVLA(model_config, TextSpecials.from_tokenizer(tokenizer)), tokenizer


def _vqa_loader(config: TrainConfig, vqa, start_batch: int):
    """batch_size questions per VQA batch, or with vqa.images_per_batch that many scenes and all
    their questions."""
    from dvla.data import VQAScenesByImage, collate_by_image

    seed = config.seed + 1
    if config.vqa.images_per_batch is None:
        return make_loader(vqa, config.batch_size, seed, start_batch, config.num_workers)
    scenes = VQAScenesByImage(vqa, config.vqa.extra_spatial_questions, seed=config.seed)
    return make_loader(
        scenes, config.vqa.images_per_batch, seed, start_batch, config.num_workers, collate_by_image
    )


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

    from dvla.ema import bias_corrected_ema

    ema = AveragedModel(model, multi_avg_fn=bias_corrected_ema(config.ema_decay), use_buffers=True)
    if state is not None:  # the checkpoint's weights are the average; the raw ones are in the state
        model.load_state_dict(state["raw_model"])
        ema.n_averaged.fill_(int(state["ema_n_averaged"]))
    return ema


def _check_resume_config(config: TrainConfig, output: Path) -> None:
    """--resume continues the run with its model: refuse --model settings that differ from the ones
    the run started with (its saved train_config.yaml)."""
    import dataclasses

    import yaml

    saved_file = output / "train_config.yaml"
    if not saved_file.exists():
        return
    saved = draccus.decode(TrainConfig, yaml.safe_load(saved_file.read_text()))
    if dataclasses.asdict(config.model) != dataclasses.asdict(saved.model):
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


def _note_shared_norm_stats(model, ratio: float, accelerator) -> None:
    """Co-training a batch-norm encoder without separate question statistics works but blends robot
    and VQA images' statistics at inference (README, Co-training); say so once."""
    from dvla.vision.norm_stats import batch_norms

    vision = model.vision
    if 0 < ratio < 1 and vision.question_norm_stats is None and batch_norms(vision.backbone):
        accelerator.print(
            "note: robot and VQA images share batch-norm statistics; set "
            "--model.vision.question_norm_stats true to keep them apart (better robot success)"
        )


def _check_fits(config: TrainConfig, robot, vqa, model) -> None:
    from dvla.data import VQAScenes

    cams = model.config.vision.cameras
    expected = sorted([*(robot.cameras if robot else []), *([VQAScenes.CAMERA] if vqa else [])])
    if sorted(cams) != expected:
        raise ValueError(
            f"the data's cameras {expected} differ from the model's {cams}: set --model.vision.cameras "
            f"(VQA scenes use the camera {VQAScenes.CAMERA!r}) or --dataset.cameras"
        )
    if robot is None:
        return
    if robot.action_dim != model.config.action_dim or robot.state_dim != model.config.state_dim:
        raise ValueError(
            f"the dataset has state/action dims {robot.state_dim}/{robot.action_dim}, the model "
            f"{model.config.state_dim}/{model.config.action_dim}: set --model.state_dim/--model.action_dim"
        )
    if robot.sim_state_dim != model.config.sim_state_dim:
        raise ValueError(
            f"the dataset's simulator state has {robot.sim_state_dim} dimensions, the model's auxiliary "
            f"head {model.config.sim_state_dim}: resume with the dataset.sim_state_key the run started with"
        )
    chunk_size = config.robot_datasets[0].chunk_size
    if chunk_size != model.config.chunk_size:
        raise ValueError(f"dataset.chunk_size {chunk_size} != model.chunk_size {model.config.chunk_size}")


def _check_perception_fits(config: TrainConfig, robot, perception, model) -> None:
    """Perception frames must show the robot's cameras and carry the same simulator state."""
    from dvla.robot_data import dataset_name

    if perception is None:
        return
    if model.config.sim_state_reads != "vision":
        raise ValueError("perception frames train the image-token head: set --model.sim_state_reads vision")
    name = dataset_name(config.perception)
    if sorted(perception.cameras) != sorted(robot.cameras):
        raise ValueError(
            f"perception dataset {name} has cameras {sorted(perception.cameras)}, the robot data "
            f"{sorted(robot.cameras)}: record the scenes with the same --cameras, or map them with "
            "perception.cameras"
        )
    if perception.sim_state_dim != robot.sim_state_dim:
        raise ValueError(
            f"perception dataset {name} has a {perception.sim_state_dim}-D simulator state, the robot data "
            f"{robot.sim_state_dim}-D: record both with the same simulator"
        )


def _save(output, step, model, ema, tokenizer, stats, opt, schedule, config, training_info) -> Path:
    """Write step-N atomically (save_checkpoint renames a finished folder into place), keep the last K.
    With EMA the checkpoint's model is the average and the raw weights go into the training state."""
    from dvla.checkpoint import save_checkpoint

    path = output / CHECKPOINTS / f"step-{step:08d}"
    staging = output / CHECKPOINTS / f".staging-{step:08d}"
    shutil.rmtree(staging, ignore_errors=True)
    save_checkpoint(staging / "model", ema.module if ema else model, tokenizer, stats, training_info)
    training_state = {
        "optimizer": opt.state_dict(),
        "scheduler": schedule.state_dict(),
        "torch_rng": torch.get_rng_state(),
    }
    if ema is not None:
        training_state |= {"raw_model": model.state_dict(), "ema_n_averaged": ema.n_averaged.clone()}
    torch.save(training_state, staging / "model" / TRAINING_STATE)
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
