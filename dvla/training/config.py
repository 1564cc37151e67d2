"""Configuration of `dvla train`."""

from __future__ import annotations

from dataclasses import dataclass, field

from dvla.data.lerobot import LeRobotDataConfig
from dvla.model.config import DiffusionVLAConfig
from dvla.training.precision import check_precision


@dataclass
class OptimConfig:
    """AdamW with linear warmup then cosine decay."""

    lr: float = 3e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    warmup_steps: int = 100
    # The learning rate decays to lr * min_lr_ratio at the last step.
    min_lr_ratio: float = 0.1

    def __post_init__(self):
        if self.lr <= 0 or self.warmup_steps < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError("need lr > 0, warmup_steps >= 0 and min_lr_ratio in [0, 1]")


@dataclass
class VQADataConfig:
    """VQA scenes (`dvla collect --suite vqa-scenes`) to train on, alone or mixed with robot data."""

    # The VQA scenes folder; None = no VQA.
    root: str | None = None
    split: str = "train"
    # Fraction of micro-batches that are VQA when co-training with a robot dataset, in a fixed
    # interleaving (0.25: every 4th batch). Ignored when there is no robot dataset.
    ratio: float = 0.25
    # Resize images to this square size; None keeps the dataset's size.
    image_size: int | None = None
    # Draw this many scenes per VQA batch and ask all of each scene's questions (about 5), so the
    # vision encoder reads each image once for all of them; None = batch_size questions, each
    # with its own copy of its image.
    images_per_batch: int | None = None
    # With images_per_batch: ask this many more spatial questions about each training scene, made
    # from its stored ground truth (other object pairs and relations of the same image, fixed per
    # scene), since one spatial question per scene is too few to learn relations from.
    extra_spatial_questions: int = 0

    def __post_init__(self):
        if not 0.0 < self.ratio < 1.0:
            raise ValueError(f"vqa.ratio must be in (0, 1), got {self.ratio}")
        if self.images_per_batch is not None and self.images_per_batch < 1:
            raise ValueError(f"vqa.images_per_batch must be >= 1, got {self.images_per_batch}")
        if self.extra_spatial_questions < 0 or (self.extra_spatial_questions and not self.images_per_batch):
            raise ValueError(
                "vqa.extra_spatial_questions must be >= 0 and needs vqa.images_per_batch (the questions "
                f"are added per scene), got {self.extra_spatial_questions}"
            )


@dataclass
class TrainConfig:
    """Train a DiffusionVLA on a LeRobot dataset, on VQA scenes, or on both (co-training).

    Examples:
      dvla train --config_path configs/train/mt10.yaml
      dvla train --dataset.root outputs/mt10 --model.vision.cameras [corner2,gripperPOV] --steps 2000
      dvla train --config_path configs/experiments/mt10_vqa.yaml --vqa.ratio 0.5
      dvla train --config_path configs/train/finetune_plate_slide.yaml --init_from outputs/train/mt10
    """

    # The LeRobot dataset: --dataset.root=DIR (local) or --dataset.repo_id=ID (hub). None = VQA only.
    dataset: LeRobotDataConfig | None = None
    # Several LeRobot datasets trained on as one (instead of `dataset`; a config file lists them).
    # They need the same camera names, state/action dims, fps, chunk and image size; each dataset
    # contributes in proportion to its number of frames.
    datasets: list[LeRobotDataConfig] = field(default_factory=list)
    vqa: VQADataConfig = field(default_factory=VQADataConfig)
    # Scenes recorded without an expert (`dvla collect --kind scenes`) that train only the
    # simulator-state target: each robot batch brings `perception_batch_size` of their frames, read
    # by the vision encoder and the image-token head, never by the backbone or as actions. Needs
    # dataset.sim_state_key and the same key, cameras and image size here.
    perception: LeRobotDataConfig | None = None
    # Perception frames per robot batch; None = batch_size.
    perception_batch_size: int | None = None
    # Fine-tune from a dvla checkpoint: weights whose name and shape fit the new model are kept (backbone,
    # vision, text); the rest (e.g. action/state layers for other dimensions) start fresh. The
    # checkpoint's tokenizer and architecture are kept; --model sets chunk/action/state dims and cameras.
    # Only used when the run starts: with --resume and existing checkpoints the run just continues.
    init_from: str | None = None
    model: DiffusionVLAConfig = field(default_factory=DiffusionVLAConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    # Where checkpoints, logs and the resolved config go.
    output_dir: str = "outputs/train/run"
    # Optimizer steps, samples per step (per process) and micro-batches accumulated per step.
    steps: int = 1000
    batch_size: int = 16
    grad_accum: int = 1
    # Save a checkpoint every N steps (and at the end), keeping the last K.
    save_every: int = 500
    keep_last: int = 3
    log_every: int = 10
    seed: int = 0
    # DataLoader worker processes (video decoding runs there).
    num_workers: int = 1
    # Continue from the last checkpoint in output_dir with the same data order, optimizer and RNG.
    resume: bool = False
    # Stop (with a checkpoint) after this many steps in this invocation, e.g. to fit a cluster time
    # slot; --resume continues with the same schedule. None = run to `steps`.
    steps_this_run: int | None = None
    # Exponential moving average of the weights with this decay (e.g. 0.999), saved as the checkpoint's
    # model; None = off.
    ema_decay: float | None = None
    # "bf16" autocast, "no" (fp32) or "auto": bf16 on a GPU or a CPU with native bf16 (AMX,
    # AVX512-BF16), fp32 on other CPUs, where emulated bf16 is ~10x slower (`dvla.precision`).
    mixed_precision: str = "auto"
    # A step whose loss or gradient is NaN or inf is skipped (the weights stay as they were); this
    # many such steps in a row stop training with an error, and a checkpoint never holds NaN weights.
    max_nonfinite_steps: int = 5
    # Log loss, learning rate and samples/s to TensorBoard under <output_dir>/logs.
    tensorboard: bool = True
    # Also log to Weights & Biases (needs `pip install wandb` and a login; off by default).
    wandb: bool = False
    wandb_project: str = "dvla"

    def __post_init__(self):
        if self.dataset is not None and self.datasets:
            raise ValueError("set `dataset` (one LeRobot dataset) or `datasets` (several), not both")
        if not self.robot_datasets and self.vqa.root is None:
            raise ValueError("nothing to train on: set dataset.root / dataset.repo_id, vqa.root, or both")
        sim_state = self.model.adapters.sim_state
        keyed = [d for d in self.robot_datasets if d.sim_state_key]
        if keyed and sim_state is None:
            raise ValueError(
                f"dataset.sim_state_key {keyed[0].sim_state_key!r} is the target of the sim_state adapter: "
                "turn it on (model.adapters.sim_state, e.g. --model.adapters.sim_state '{}') or drop the key"
            )
        if self.perception is not None:
            self._check_perception()
        for name in ("steps", "batch_size", "grad_accum", "save_every", "keep_last", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_nonfinite_steps < 1:
            raise ValueError(f"max_nonfinite_steps must be >= 1, got {self.max_nonfinite_steps}")
        if self.ema_decay is not None and not 0.0 < self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in (0, 1), got {self.ema_decay}")
        self.mixed_precision = check_precision(self.mixed_precision)
        if self.wandb:
            import importlib.util

            if importlib.util.find_spec("wandb") is None:
                raise ValueError("--wandb true needs the wandb package: pip install wandb (then wandb login)")

    def _check_perception(self) -> None:
        robot = self.robot_datasets
        if not robot or not robot[0].sim_state_key:
            raise ValueError(
                "perception frames train the simulator-state target: give the robot data one "
                "(--dataset.sim_state_key sim.state)"
            )
        if self.model.adapters.sim_state.reads != "vision":
            raise ValueError(
                "perception frames train the image-token head: set model.adapters.sim_state.reads vision"
            )
        if self.perception.sim_state_key != robot[0].sim_state_key:
            raise ValueError(
                f"perception.sim_state_key {self.perception.sim_state_key!r} must be the robot data's "
                f"{robot[0].sim_state_key!r}"
            )
        if self.perception.image_size != robot[0].image_size:
            raise ValueError(
                f"perception.image_size {self.perception.image_size} must be the robot data's "
                f"{robot[0].image_size}"
            )
        if self.perception_batch_size is not None and self.perception_batch_size < 1:
            raise ValueError(f"perception_batch_size must be >= 1, got {self.perception_batch_size}")

    @property
    def trackers(self) -> list[str]:
        """accelerate trackers to log to."""
        return [name for name, on in (("tensorboard", self.tensorboard), ("wandb", self.wandb)) if on]

    @property
    def robot_datasets(self) -> list[LeRobotDataConfig]:
        """The LeRobot datasets of the run, from `dataset` or `datasets`."""
        return [self.dataset] if self.dataset is not None else list(self.datasets)
