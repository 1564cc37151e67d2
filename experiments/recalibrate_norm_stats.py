"""Were a co-trained model's robot failures its batch-norm statistics? Re-estimate them on robot images.

    python experiments/recalibrate_norm_stats.py --run outputs/train/cotrain_mixed \
        --out outputs/train/cotrain_mixed_recal/step-00001500 [--batches 40]

A co-trained vision encoder (trained without `model.vision.question_norm_stats`) normalises every
image at inference with running averages over robot and VQA batches alike, although in training
each batch was normalised by its own statistics. This re-estimates the averages from robot batches
of the run's own datasets (no weight changes, no gradients) and saves a copy of the last checkpoint;
roll both out to see what the blend cost. The copy's VQA images then get robot statistics, so it
is a diagnosis, not a recipe: train with `question_norm_stats: true` instead (docs/results/cotraining.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import draccus
import torch
from tqdm import tqdm

from dvla.checkpoint import checkpoint_info, load_checkpoint, resolve_checkpoint, save_checkpoint
from dvla.data.mixing import make_loader
from dvla.data.robot import robot_dataset
from dvla.policy import DiffusionVLAPolicy
from dvla.training.config import TrainConfig
from dvla.vision.norm_stats import batch_norms


@torch.no_grad()
def recalibrate(run: Path, out: Path, batches: int, seed: int = 7) -> Path:
    config_file = run / "train_config.yaml"
    if not config_file.exists():
        raise SystemExit(f"{run} is not a training run (no train_config.yaml): pass --run <output_dir>")
    config = draccus.parse(TrainConfig, config_path=str(config_file), args=[])
    robot = robot_dataset(config.robot_datasets)
    if robot is None:
        raise SystemExit(f"{run} trained on no robot dataset: nothing to recalibrate on")
    checkpoint = resolve_checkpoint(run)
    model, tokenizer, stats = load_checkpoint(checkpoint)
    norms = batch_norms(model.vision.backbone)
    if not norms:
        raise SystemExit(f"{checkpoint}: the vision encoder has no batch norms")
    policy = DiffusionVLAPolicy(model, tokenizer, stats)
    momenta = [norm.momentum for norm in norms]
    for norm in norms:  # a plain average over the batches below (momentum None)
        norm.reset_running_stats()
        norm.momentum = None
    model.vision.train()
    loader = make_loader(robot, config.batch_size, seed, 0, 0)
    for i, sample in enumerate(tqdm(loader, total=batches, desc="robot batches")):
        if i == batches:
            break
        images = policy.processor.action_batch(sample).observation.images
        model.vision(images)  # updates the running statistics
    for norm, momentum in zip(norms, momenta, strict=True):
        norm.momentum = momentum
    model.eval()
    return save_checkpoint(out, model, tokenizer, stats, checkpoint_info(checkpoint))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", required=True, help="a `dvla train` output_dir (its last checkpoint)")
    parser.add_argument("--out", required=True, help="folder of the recalibrated checkpoint")
    parser.add_argument("--batches", type=int, default=40, help="robot batches to average over")
    args = parser.parse_args()
    print(f"saved {recalibrate(Path(args.run), Path(args.out), args.batches)}")


if __name__ == "__main__":
    main()
