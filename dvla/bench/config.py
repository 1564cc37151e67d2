"""Configuration of `dvla bench`."""

from __future__ import annotations

from dataclasses import dataclass, field

from dvla.backbone.decoder import ACTION_DECODE_STEPS
from dvla.training.precision import check_precision

SECTIONS = ("decode", "heads", "peers", "latency", "throughput")
PEER_POLICIES = ("act", "diffusion")
PEER_SIZES = ("default", "small", "tiny")


@dataclass
class PeerConfig:
    """LeRobot peers: trained per task with `lerobot-train` (no language input), or given as folders."""

    # Policies to train and evaluate, any of PEER_POLICIES.
    policies: list[str] = field(default_factory=lambda: list(PEER_POLICIES))
    # The LeRobot dataset the dvla checkpoint was trained on (local root); None = do not train peers.
    dataset_root: str | None = None
    # Optimizer steps and batch size of each per-task peer. dvla trains ONE model on all tasks; each
    # peer trains on its ONE task. At dvla's own step count the comparison favours the peers; on a CPU
    # the affordable budget is the same wall-clock (dvla's training time / its number of tasks).
    steps: int = 4000
    # Steps of one policy instead of `steps`, e.g. {act: 380, diffusion: 345}: a same-wall-clock
    # budget gives a faster-stepping peer more steps.
    policy_steps: dict[str, int] = field(default_factory=dict)
    batch_size: int = 32
    # Chunk length and actions executed per chunk; None = the dvla checkpoint's chunk H, with H/2
    # executed before re-planning as dvla does. ACT's own defaults are 100 and 100.
    chunk_size: int | None = None
    n_action_steps: int | None = None
    # Network size: "default" = LeRobot's defaults; "small" = narrower transformer / U-Net that trains
    # on a CPU (ACT 256-wide, Diffusion Policy U-Net 128-256-512); "tiny" = smoke tests. Every size
    # uses a ResNet-18 trained from scratch (the ImageNet weights cannot be downloaded offline).
    size: str = "small"
    # Extra `lerobot-train` flags for every peer, e.g. ["--policy.use_amp=true"].
    extra_args: list[str] = field(default_factory=list)
    # Already trained LeRobot policies to evaluate instead, as "policy:task:folder" (folder = a
    # `lerobot-train` output_dir or a pretrained_model folder).
    trained: list[str] = field(default_factory=list)

    def __post_init__(self):
        bad = [p for p in self.policies if p not in PEER_POLICIES]
        if bad:
            raise ValueError(f"unknown peer policies {bad}; choose from {PEER_POLICIES}")
        if self.size not in PEER_SIZES:
            raise ValueError(f"peers.size must be one of {PEER_SIZES}, got {self.size!r}")
        if self.steps < 1 or self.batch_size < 1 or any(n < 1 for n in self.policy_steps.values()):
            raise ValueError("peers.steps, peers.policy_steps and peers.batch_size must be >= 1")
        if (self.chunk_size is not None and self.chunk_size < 1) or (
            self.n_action_steps is not None and self.n_action_steps < 1
        ):
            raise ValueError("peers.chunk_size and peers.n_action_steps must be >= 1 (or unset)")
        if self.chunk_size and self.n_action_steps and self.n_action_steps > self.chunk_size:
            raise ValueError(
                f"peers.n_action_steps ({self.n_action_steps}) cannot exceed peers.chunk_size "
                f"({self.chunk_size}): a policy executes at most the actions it predicted"
            )
        stray = sorted(set(self.policy_steps) - set(PEER_POLICIES))
        if stray:
            raise ValueError(f"peers.policy_steps: unknown policies {stray}; choose from {PEER_POLICIES}")
        for entry in self.trained:
            if entry.count(":") < 2:
                raise ValueError(f"peers.trained entries are 'policy:task:folder', got {entry!r}")

    def steps_for(self, policy: str) -> int:
        """The optimizer steps of `policy`'s peers."""
        return self.policy_steps.get(policy, self.steps)

    def control(self, dvla_chunk: int) -> tuple[int, int]:
        """(chunk length, actions executed per chunk) of the peers next to a dvla chunk of `dvla_chunk`."""
        chunk = self.chunk_size or dvla_chunk
        return chunk, self.n_action_steps or max(1, chunk // 2)


@dataclass
class BenchConfig:
    """Benchmark a trained dvla checkpoint against autoregressive decoding and LeRobot peers.

    Examples:
      dvla bench --checkpoint outputs/train/mt10 --tasks drawer-close-v3,window-close-v3 --episodes 20 \\
          --flow_checkpoint outputs/train/mt10_flow --peers.dataset_root outputs/mt10
      dvla bench --config_path configs/bench/aloha_transfer_cube.yaml   (ALOHA, against ACT)
      dvla bench --checkpoint CKPT --sections [latency,throughput]
      dvla bench --checkpoint CKPT --peers.dataset_root DATA --quick   (a smoke run in a few minutes)
    """

    # A dvla checkpoint with the discrete action head (decode sweep, latency).
    checkpoint: str | None = None
    # A dvla checkpoint with the flow head trained on the same data and budget (heads section).
    flow_checkpoint: str | None = None
    peers: PeerConfig = field(default_factory=PeerConfig)
    # The simulator (metaworld or aloha); None = the one whose robot the checkpoint was trained on.
    env: str | None = None
    # Comma-separated tasks (all must be in the dvla checkpoint's training data); None = the
    # environment's default suite (mt10 for MetaWorld, both tasks for ALOHA).
    tasks: str | None = None
    # Evaluation episodes per task and setting, on seeds seed_start, seed_start + 1, ...
    episodes: int = 20
    seed_start: int = 1000
    # Step limit of an episode; None = the environment's (500 for MetaWorld, 400 for ALOHA).
    max_steps: int | None = None
    workers: int = 2
    # Decode steps of the sweep; 0 = one token per step (parallel decoding, H*D forwards).
    decode_steps: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 0])
    # Also roll out left-to-right decoding with a KV cache (same model, same tokens).
    autoregressive: bool = True
    # Decode steps of the discrete head in the heads and peers comparisons (the policy default).
    default_steps: int = ACTION_DECODE_STEPS
    # Which parts to run, any of SECTIONS.
    sections: list[str] = field(default_factory=lambda: list(SECTIONS))
    # Timed repeats per latency measurement (after warm-up) and training steps for throughput.
    latency_repeats: int = 20
    throughput_steps: int = 10
    output_dir: str = "outputs/bench"
    # Small everything (1 task, 1 short episode, 3 decode settings, few repeats): a smoke run.
    quick: bool = False
    # "auto" = cuda when available, else cpu.
    device: str = "auto"
    # Precision of the timings, the throughput and the peers' training: "auto" (bf16 autocast on
    # GPUs and CPUs with native bf16, else fp32, as `dvla train`), "bf16" or "no".
    mixed_precision: str = "auto"

    def __post_init__(self):
        self.mixed_precision = check_precision(self.mixed_precision)
        bad = [s for s in self.sections if s not in SECTIONS]
        if bad:
            raise ValueError(f"unknown sections {bad}; choose from {SECTIONS}")
        if not self.checkpoint:
            raise ValueError("--checkpoint is required: a dvla checkpoint with the discrete head")
        if any(s < 0 for s in self.decode_steps):
            raise ValueError(f"decode_steps must be >= 1, or 0 for one token per step: {self.decode_steps}")
        for name in ("episodes", "max_steps", "workers", "latency_repeats", "throughput_steps"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.quick:
            self.episodes, self.max_steps = 1, min(self.max_steps or 16, 16)
            self.decode_steps = [1, 4, 0]
            self.latency_repeats, self.throughput_steps = 2, 2
            self.peers.steps, self.peers.batch_size, self.peers.size = 2, 4, "tiny"
            self.peers.policy_steps = {}
