"""Configuration of `dvla rollout`."""

from __future__ import annotations

from dataclasses import dataclass, field

from dvla.adapters import PolicyHooksConfig
from dvla.backbone.decoder import DecodeConfig, action_decode_config
from dvla.execution import ExecutionConfig
from dvla.sim.tasks import EVAL_SEED_START
from dvla.training.precision import check_precision


@dataclass
class RolloutConfig:
    """Evaluate a checkpoint by MuJoCo rollouts with lerobot's protocol (MetaWorld or ALOHA).

    Examples:
      dvla rollout --checkpoint outputs/train/aloha_cube --env aloha --tasks transfer_cube --episodes 50
      dvla rollout --checkpoint outputs/train/mt10/checkpoints/step-00004000 --suite mt10 --episodes 20
      dvla rollout --checkpoint CKPT --tasks reach-v3 --episodes 5 --decode.steps 2 --n_action_steps 4
      dvla rollout --checkpoint CKPT --suite mt10 --output_dir outputs/rollout/run1 --resume  # after a stop
    """

    # A checkpoint folder written by `dvla train` (…/checkpoints/step-N).
    checkpoint: str | None = None
    # The simulator: metaworld or aloha; None = the one whose robot the checkpoint was trained on.
    env: str | None = None
    # Comma-separated task names (or use --suite).
    tasks: str | None = None
    # A named suite instead of --tasks: mt10, mt50, easy, medium, hard, very_hard (MetaWorld), all (ALOHA).
    suite: str | None = None
    # Episodes per task, on evaluation seeds seed_start, seed_start + 1, ... (never training seeds).
    episodes: int = 10
    seed_start: int = EVAL_SEED_START
    # Episode step limit; None = the environment's (MetaWorld 500, ALOHA 400). Success =
    # info["success"] at any step.
    max_steps: int | None = None
    # Actions executed from each chunk before re-planning (receding horizon); None = half the chunk.
    n_action_steps: int | None = None
    # How chunks are executed under a simulated inference delay: --execution.mode receding (naive
    # asynchronous when delayed), inpaint (the next chunk starts with the actions executed while it
    # is computed) or ensemble (ACT's temporal ensembling); --execution.inference_delay D steps.
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    # Action limits every decoded action keeps to: "env" (the environment's: MetaWorld's [-1, 1],
    # ALOHA's joint ranges and gripper opening) or "LOW,...;HIGH,..." (D values each, robot units).
    action_bounds: str | None = None
    # How action chunks are decoded; by default in one step (ACTION_DECODE_STEPS in backbone/decoder.py).
    decode: DecodeConfig = field(default_factory=action_decode_config)
    # Run-time hooks of the checkpoint's adapters, each off unless set, e.g. the held reading of
    # MetaWorld's goal: --hooks.hold_reading.slices '[[36, 39]]' --hooks.hold_reading.plans 3
    # (docs/adapters.md#held_reading).
    hooks: PolicyHooksConfig = field(default_factory=PolicyHooksConfig)
    # Environment worker processes; episodes run in parallel and the policy sees them as one batch.
    workers: int = 2
    # Rendered image height; None = the checkpoint's vision.image_size for MetaWorld, lerobot's
    # 480 x 640 for ALOHA (the policy resizes as in training).
    image_size: int | None = None
    # Where report.json, report.md and videos/ go.
    output_dir: str = "outputs/rollout"
    # Figures of how the first N action chunks of each task's first episode form over the denoising
    # steps (PNG under <output_dir>/denoising/; a discrete or factored head). 0 = none.
    show_denoising: int = 0
    # Draw the executed chunk's plan over the videos: where it sends the grippers (MetaWorld's hand:
    # its displacements added up; ALOHA's fingers: forward kinematics), on the fixed cameras.
    show_plan: bool = False
    # Videos of the first N episodes of each task (0 = none); --video_dir overrides where they go.
    videos_per_task: int = 2
    video_dir: str | None = None
    # Continue an interrupted rollout in output_dir (its partial.json): finished episodes are kept and
    # only the rest run. The checkpoint and the decoding settings must be the same.
    resume: bool = False
    # Run tasks whose instruction the checkpoint never saw in training (zero-shot language).
    allow_unseen_tasks: bool = False
    # "bf16" autocast for the policy, "no" (fp32) or "auto" (bf16 where it is fast: GPUs and CPUs
    # with AMX or AVX512-BF16; see `dvla.training.precision`).
    mixed_precision: str = "auto"
    # "auto" = cuda when available, else cpu.
    device: str = "auto"

    def __post_init__(self):
        if not self.checkpoint:
            raise ValueError("--checkpoint is required: a folder written by `dvla train`")
        if self.show_denoising < 0:
            raise ValueError(f"show_denoising must be >= 0, got {self.show_denoising}")
        for name in ("episodes", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.seed_start < EVAL_SEED_START:
            raise ValueError(
                f"seed_start {self.seed_start} < {EVAL_SEED_START}: seeds below it are training seeds"
            )
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.action_bounds is not None and self.action_bounds != "env":
            parse_bounds(self.action_bounds)  # a malformed value fails here, before anything runs
        if self.image_size is not None and self.image_size < 8:
            raise ValueError(f"image_size must be >= 8 (or unset: the checkpoint's), got {self.image_size}")
        if self.videos_per_task < 0:
            raise ValueError(f"videos_per_task must be >= 0, got {self.videos_per_task}")
        if self.show_plan and self.videos_per_task == 0:
            raise ValueError("--show_plan draws on the videos: set --videos_per_task >= 1")
        self.mixed_precision = check_precision(self.mixed_precision)


def parse_bounds(text: str) -> tuple[list[float], list[float]]:
    """ "LOW,...;HIGH,..." -> (low, high) lists of floats."""
    parts = text.split(";")
    try:
        low, high = ([float(v) for v in part.split(",")] for part in parts)
    except ValueError:
        raise ValueError(
            f"action_bounds must be 'env' or 'LOW,...;HIGH,...' (numbers, one per action dimension), "
            f"got {text!r}"
        ) from None
    if len(low) != len(high):
        raise ValueError(f"action_bounds: {len(low)} low values but {len(high)} high ones")
    return low, high
