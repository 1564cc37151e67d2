"""Configuration of the assembled VLA (vision -> diffusion backbone -> action head)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dvla.action_head.flow import FlowHeadConfig
from dvla.sim_state_head import SIM_STATE_READS, parse_emphasis, parse_offsets
from dvla.vision.encoder import VisionConfig

ACTION_HEADS = ("discrete", "flow")


@dataclass
class BackboneSize:
    """Size of a backbone trained from scratch (ignored when `init_from` names a causal LM)."""

    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int | None = None
    # A Llama/Qwen2/Mistral causal LM (folder or hub id) to adapt instead (DiffuLLaMA-style).
    init_from: str | None = None


@dataclass
class DiffusionVLAConfig:
    """Everything that shapes the model; saved with every checkpoint (`type` tags the class)."""

    type: str = "dvla"
    vision: VisionConfig = field(default_factory=VisionConfig)
    backbone: BackboneSize = field(default_factory=BackboneSize)
    # "discrete": H*D action tokens in bins, filled by the parallel decoder; "flow": H action queries,
    # one backbone pass, a rectified flow integrated by a small head.
    action_head: str = "discrete"
    flow: FlowHeadConfig = field(default_factory=FlowHeadConfig)
    # Action chunk length H and action / state dimensions D and S.
    chunk_size: int = 16
    action_dim: int = 4
    state_dim: int = 4
    # Uniform bins per action dimension (discrete head).
    action_bins: int = 256
    # Fraction of robot samples (discrete head) whose whole action chunk is hidden (t = 1) instead
    # of a random share: one-step decoding predicts every action token from the observation alone,
    # and under t ~ U(0, 1) with the 1/t weight most of the loss is filling tokens in from their
    # unmasked neighbours, which never asks the model to read the goal (see the README's MT10 results).
    full_mask_fraction: float = 0.0
    # Fraction of robot samples in training whose robot state is hidden (a learned "no state" token
    # takes its place): the hand position mid-episode tells which way the arm has been moving, so
    # with the state always given the policy learns to keep going and never reads the goal off the
    # images (measured by benchmarks/input_use.py; see the README's MT10 results).
    state_dropout: float = 0.0
    # The robot state is normalised so that the training data's q01..q99 spans [-1, 1]; values
    # beyond are clipped to [-state_clip, state_clip]. At 1 a hand that leaves the demonstrated
    # range reads as standing still at its edge; a larger clip lets the state token keep following
    # the hand (no measurable difference on the README's four-task subset).
    state_clip: float = 1.0
    # Instruction / question length in text tokens (longer text is cut, with a warning by the processor).
    max_text_tokens: int = 32
    # Fixed answer block length for VQA (answers padded with EOS).
    answer_tokens: int = 4
    # Size of the text tokenizer trained on the data when the backbone starts from scratch.
    text_vocab_size: int = 1000
    # Auxiliary target: the simulator's full state (object and goal positions), predicted in training
    # only; never an input. `dvla train` sets its size from the data when the dataset has
    # `sim_state_key` (0 = no auxiliary head).
    sim_state_dim: int = 0
    # What the head reads: "vision" (the image tokens, straight off the encoder) or "state_token"
    # (the backbone's state token; the first design, which left small targets unseen).
    sim_state_reads: str = "vision"
    # Weight of its mean squared error (on targets normalised to [-1, 1]) in the training loss.
    sim_state_weight: float = 1.0
    # Extra weight on some dimensions of that error, as "start:stop=weight" slices joined by commas;
    # unlisted dimensions weigh 1. MetaWorld's 39-D state keeps the goal in 36:39 and the first
    # object's position in 4:7, so "36:39=30,4:7=10" makes the encoder find goal markers and objects.
    sim_state_emphasis: str = ""
    # Also give the backbone the head's reading of the simulator state (where objects and goals are,
    # as the head sees them in the images) as one more prefix token after the robot state: a
    # compact, explicit input from which 50 demonstrations per task can teach the action, instead
    # of leaving the policy to find a goal in 32 image tokens. The reading is detached: only the
    # simulator-state loss trains the head. Needs sim_state_reads "vision" and a simulator state.
    sim_state_input: bool = False
    # One more prefix token: where the head reads some objects, relative to the hand, in metres
    # (x10). Slices of the simulator state that hold 3-D positions, joined by commas ("4:7,36:39":
    # MetaWorld's first object and goal); the hand is the robot state's first three values. The
    # scripted experts act on exactly these offsets (reach: the goal minus the hand, clipped), which
    # the policy otherwise has to compute from two tokens in two different normalisations.
    reading_offsets: str = ""
    # Auxiliary VQA target (0 = off): each image token of the scene camera predicts which colours,
    # shapes, sizes and colour-shape pairs have an object centred in its cell of the image
    # (`dvla.sim.vqa_scene_map`, from the scene's ground truth; training only, never an input).
    # This is the weight of its binary cross-entropy in the VQA loss. Needs a square token grid.
    scene_map_weight: float = 0.0
    # The scene map also regresses each of those objects' image column, row and depth (squared
    # error in cells, same weight), so the tokens carry positions finer than their cell.
    scene_map_positions: bool = False
    # Condition the image tokens on the question (FiLM: a channel-wise scale and shift from the
    # text embeddings, `dvla.vision.film`), starting as the identity. This and the two question
    # modules below act on VQA questions only: robot observations in a co-trained model skip them.
    text_film: bool = False
    # How FiLM pools the text: 0 = the mean of its embeddings (blind to word order); N = N learned
    # attention queries over the embeddings plus learned positions, so "is the red cube left of the
    # blue sphere?" and "is the blue sphere left of the red cube?" condition differently.
    text_film_queries: int = 0
    # One more prefix token after the image tokens: a relation network (`dvla.vision.relation`) that
    # reads every pair of image tokens with the question, for questions comparing two objects.
    relation_token: bool = False
    # Three more prefix tokens after the image tokens (`dvla.vision.referents`): two pointers read off
    # the question each attend over the image tokens (the first and the second object it names), a
    # head places each picked object, and the two picked tokens plus an MLP's comparison of them (fed
    # the places' offset gated by the question) become tokens the backbone reads.
    referent_pointers: bool = False
    # Weight of the pointers' auxiliary targets (training only, never inputs), on VQA questions that
    # name two objects (from the scene's ground truth): each pointer's attention against its object's
    # cell, the places against the objects' places, and the answer read off the comparison token.
    # 0 leaves the pointers to the answer loss.
    referent_weight: float = 1.0

    def __post_init__(self):
        if self.action_head not in ACTION_HEADS:
            raise ValueError(f"unknown action_head {self.action_head!r}; choose one of {ACTION_HEADS}")
        for name in ("chunk_size", "action_dim", "state_dim", "max_text_tokens", "answer_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.scene_map_weight < 0:
            raise ValueError(f"scene_map_weight must be >= 0, got {self.scene_map_weight}")
        if self.referent_weight < 0:
            raise ValueError(f"referent_weight must be >= 0, got {self.referent_weight}")
        if self.scene_map_positions and not self.scene_map_weight:
            raise ValueError("scene_map_positions needs the scene map: set scene_map_weight > 0")
        if self.text_film_queries < 0 or (self.text_film_queries and not self.text_film):
            raise ValueError(
                f"text_film_queries must be >= 0 and needs text_film: true, got {self.text_film_queries}"
            )
        if self.sim_state_dim < 0 or self.sim_state_weight < 0:
            raise ValueError(
                "sim_state_dim and sim_state_weight must be >= 0, "
                f"got {self.sim_state_dim} and {self.sim_state_weight}"
            )
        parse_emphasis(self.sim_state_emphasis)  # raises on a malformed spec
        if self.sim_state_reads not in SIM_STATE_READS:
            raise ValueError(
                f"sim_state_reads must be one of {SIM_STATE_READS}, got {self.sim_state_reads!r}"
            )
        if self.sim_state_input and self.sim_state_reads != "vision":
            raise ValueError(
                "sim_state_input feeds the image-token head's reading: set sim_state_reads vision"
            )
        offsets = parse_offsets(self.reading_offsets)  # raises on a malformed spec
        if offsets and (self.sim_state_reads != "vision" or self.state_dim < 3):
            raise ValueError(
                "reading_offsets needs the image-token head's reading (sim_state_reads vision) and a "
                f"robot state that starts with the hand's x, y, z (state_dim >= 3, got {self.state_dim})"
            )
        if not 0.0 <= self.full_mask_fraction <= 1.0:
            raise ValueError(f"full_mask_fraction must be in [0, 1], got {self.full_mask_fraction}")
        if self.state_clip < 1.0:
            raise ValueError(f"state_clip must be >= 1 (the data's own range), got {self.state_clip}")
        if not 0.0 <= self.state_dropout < 1.0:
            raise ValueError(f"state_dropout must be in [0, 1), got {self.state_dropout}")
        if self.action_bins < 2:
            raise ValueError(f"action_bins must be >= 2, got {self.action_bins}")
