"""A thin adapter over timm: camera images -> K (+ P keypoint) tokens per camera at the backbone's width."""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from dvla.vision.norm_stats import QuestionNormStats

# timm keyword arguments dvla passes on; anything else is rejected rather than silently forwarded.
ALLOWED_TIMM_KWARGS = frozenset({"img_size", "drop_path_rate", "drop_rate", "global_pool", "output_stride"})


@dataclass
class VisionConfig:
    """Which timm model reads the cameras and how its features become tokens."""

    # Any timm model name. The default trains from scratch on a CPU; online users can pick a pretrained
    # ViT such as vit_small_patch14_dinov2.lvd142m or vit_base_patch16_siglip_224 with pretrained=True.
    model_name: str = "resnet10t"
    # Load timm's pretrained weights (needs the hub; off for offline use).
    pretrained: bool = False
    # Images are resized to this height before the encoder ...
    image_size: int = 128
    # ... and this width; None = square. Training takes it from the data (a 480x640 camera at
    # image_size 96 gives 128), so images keep their aspect ratio.
    image_width: int | None = None
    # Tokens per camera after adaptive average pooling of the feature map; None keeps them all.
    tokens_per_camera: int | None = 16
    # Camera names, in a fixed order: each gets a learned embedding. None = the dataset's cameras
    # (and `scene` when co-training on VQA scenes), filled in when training starts.
    cameras: list[str] | None = None
    # Random-shift augmentation in training: pad by this fraction of the size, crop back (DrQ).
    shift_fraction: float = 0.06
    # Spatial-softmax keypoints per camera (0 = none): each is a learned map over the feature grid
    # whose expected (x, y) becomes one more token, so exact image positions reach the backbone
    # (as in Levine et al. 2016 and Diffusion Policy) rather than only pooled cell features.
    keypoints: int = 0
    # Extra keyword arguments for timm.create_model (only those in ALLOWED_TIMM_KWARGS), e.g.
    # {output_stride: 16} for a CNN's 2x finer feature grid (8 x 8 at 128 px; set tokens_per_camera
    # to 64 or null to keep the cells apart).
    timm_kwargs: dict = field(default_factory=dict)
    # Co-training: question (VQA) images keep their own batch-norm running statistics, so a robot
    # image at inference is normalised as robot images were in training (vision/norm_stats.py).
    # Only for encoders with batch norms (the default CNN); ViTs have none to separate.
    question_norm_stats: bool = False

    def __post_init__(self):
        bad = set(self.timm_kwargs) - ALLOWED_TIMM_KWARGS
        if bad:
            raise ValueError(
                f"timm_kwargs {sorted(bad)} are not allowed; allowed: {sorted(ALLOWED_TIMM_KWARGS)}"
            )
        if self.cameras is not None and (not self.cameras or len(set(self.cameras)) != len(self.cameras)):
            raise ValueError(f"cameras must be non-empty and unique, got {self.cameras}")
        if self.tokens_per_camera is not None and self.tokens_per_camera < 1:
            raise ValueError(f"tokens_per_camera must be >= 1, got {self.tokens_per_camera}")
        if self.keypoints < 0:
            raise ValueError(f"keypoints must be >= 0, got {self.keypoints}")
        if self.image_size < 8 or (self.image_width is not None and self.image_width < 8):
            raise ValueError(f"image size {self.shape} is too small (>= 8 px each side)")
        if not 0.0 <= self.shift_fraction < 0.5:
            raise ValueError(f"shift_fraction must be in [0, 0.5), got {self.shift_fraction}")

    @property
    def shape(self) -> tuple[int, int]:
        """(height, width) the encoder reads."""
        return self.image_size, self.image_width or self.image_size


class VisionEncoder(nn.Module):
    """images {camera: (B, 3, H, W) in [0, 1]} -> tokens (B, n_cameras * (K + P), out_dim)."""

    def __init__(self, config: VisionConfig, out_dim: int):
        super().__init__()
        import timm

        self.config = config
        try:
            self.backbone = timm.create_model(
                config.model_name, pretrained=config.pretrained, num_classes=0, **config.timm_kwargs
            )
        except RuntimeError as err:  # timm raises RuntimeError for unknown names
            raise ValueError(f"timm cannot build {config.model_name!r}: {err}") from err
        # oneDNN (CPU) and cuDNN run convolutions fastest on NHWC tensors: with all cameras in one
        # batch, the default CNN reads two 128 px cameras in 8.5 ms instead of 21.7 (batch 1, 2 cores).
        self.backbone.to(memory_format=torch.channels_last)
        data_config = timm.data.resolve_model_data_config(self.backbone)
        self.register_buffer("mean", torch.tensor(data_config["mean"]).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(data_config["std"]).view(1, 3, 1, 1), persistent=False)
        self.num_prefix_tokens = getattr(self.backbone, "num_prefix_tokens", 0)
        width = self.backbone.num_features
        self.projector = nn.Sequential(nn.Linear(width, out_dim), nn.GELU(), nn.Linear(out_dim, out_dim))
        self.camera_embed = nn.Embedding(len(config.cameras), out_dim)
        self.grid = self._feature_grid()  # (h, w) of a CNN's feature map, None for a ViT
        self.tokens_per_camera = config.tokens_per_camera or self._count_tokens()
        self.token_embed = nn.Parameter(torch.zeros(self.tokens_per_camera, out_dim))
        nn.init.normal_(self.token_embed, std=0.02)
        self.keypoints = (
            SpatialSoftmaxKeypoints(width, config.keypoints, out_dim) if config.keypoints else None
        )
        self.question_norm_stats = QuestionNormStats(self.backbone) if config.question_norm_stats else None
        if self.question_norm_stats is not None and not len(self.question_norm_stats):
            raise ValueError(
                f"vision.question_norm_stats: {config.model_name!r} has no batch norms to keep apart; "
                "set it to false"
            )

    def _count_tokens(self) -> int:
        with torch.no_grad():
            return self._features(torch.zeros(1, 3, *self.config.shape)).shape[1]

    def _feature_grid(self) -> tuple[int, int] | None:
        """Probed in eval mode: batch norms keep their running statistics untouched."""
        training = self.backbone.training
        self.backbone.eval()
        with torch.no_grad():
            features = self.backbone.forward_features(torch.zeros(1, 3, *self.config.shape))
        self.backbone.train(training)
        return tuple(features.shape[-2:]) if features.dim() == 4 else None

    def preprocess(self, image: torch.Tensor, train: bool) -> torch.Tensor:
        """(B, 3, H, W) in [0, 1] -> resized, (in training) randomly shifted, normalised."""
        shape = self.config.shape
        if image.shape[-2:] != shape:
            image = F.interpolate(image, size=shape, mode="bilinear", antialias=True, align_corners=False)
        if train and self.config.shift_fraction > 0:
            image = random_shift(image, round(shape[0] * self.config.shift_fraction))
        return (image - self.mean) / self.std

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        """Feature tokens (B, N, C): a CNN's map cells in row order, or a ViT's patch tokens."""
        features = self.backbone.forward_features(x)
        if features.dim() == 4:  # CNN: (B, C, h, w) -> (B, h*w, C)
            return features.flatten(2).transpose(1, 2)
        return features[:, self.num_prefix_tokens :]  # ViT: drop class/register tokens, (B, N, C)

    def _pooled(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, C) -> (B, K, C). A CNN's h x w grid of cells is pooled in 2-D to a kh x kw grid of
        the same aspect (kh * kw = K), so each token covers a patch of the image rather than a
        stripe of rows; other token counts are pooled in 1-D."""
        k = self.tokens_per_camera
        n = x.shape[1]
        if n == k:
            return x
        h, w = self.grid if self.grid and self.grid[0] * self.grid[1] == n else (math.isqrt(n),) * 2
        kh = max(1, round(math.sqrt(k * h / w)))
        if h * w == n and k % kh == 0 and (h != w or kh * kh == k):  # square grids: square K only
            grid = x.transpose(1, 2).reshape(x.shape[0], x.shape[2], h, w)  # (B, C, h, w)
            return F.adaptive_avg_pool2d(grid, (kh, k // kh)).flatten(2).transpose(1, 2)  # (B, K, C)
        return F.adaptive_avg_pool1d(x.transpose(1, 2), k).transpose(1, 2)  # (B, K, C)

    def forward(
        self, images: dict[str, torch.Tensor], train: bool = False, question: bool = False
    ) -> torch.Tensor:
        """Tokens of the configured cameras present in `images`, in configured order. A batch may
        carry a subset (co-training: robot batches have the robot cameras, VQA batches the scene one);
        the policy checks that a robot observation has every robot camera. `question` marks images
        of a VQA question: with `question_norm_stats` they use the question batch-norm statistics.

        The cameras go through the timm model as one batch (one call per layer instead of one per
        camera), so in training its batch norms see the statistics of all cameras together."""
        unknown = [c for c in images if c not in self.config.cameras]
        if unknown or not images:
            raise ValueError(f"camera(s) {unknown or 'none'} given; the encoder knows {self.config.cameras}")
        present = [(i, c) for i, c in enumerate(self.config.cameras) if c in images]
        sizes = {c: images[c].shape[0] for _, c in present}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"every camera needs the same batch size, got {sizes}")
        pixels = torch.cat([self.preprocess(images[c], train) for _, c in present])  # (n*B, 3, S, S)
        stats = self.question_norm_stats
        with stats.active() if question and stats is not None else nullcontext():
            cells = self._features(pixels.contiguous(memory_format=torch.channels_last))  # (n*B, N, C)
        projected = self.projector(self._pooled(cells))  # (n*B, K, d)
        if self.keypoints is not None:
            projected = torch.cat([projected, self.keypoints(cells)], dim=1)  # (n*B, K + P, d)
        tokens = []
        k = self.tokens_per_camera
        for (i, _), x in zip(present, projected.chunk(len(present)), strict=True):  # (B, K [+ P], d) each
            x = torch.cat([x[:, :k] + self.token_embed, x[:, k:]], dim=1)  # keypoint tokens carry their own
            tokens.append(x + self.camera_embed.weight[i])
        return torch.cat(tokens, dim=1)  # (B, n_present * K, d)


class SpatialSoftmaxKeypoints(nn.Module):
    """Feature cells (B, N, C) on a square grid -> P keypoint tokens (B, P, d): a 1x1 map per keypoint,
    softmax over the cells, the expected (x, y) in [-1, 1], embedded with the keypoint's identity."""

    def __init__(self, channels: int, count: int, out_dim: int):
        super().__init__()
        self.logits = nn.Linear(channels, count)
        self.embed_xy = nn.Sequential(nn.Linear(2, out_dim), nn.GELU(), nn.Linear(out_dim, out_dim))
        self.identity = nn.Parameter(torch.zeros(count, out_dim))
        nn.init.normal_(self.identity, std=0.02)

    def coordinates(self, cells: torch.Tensor) -> torch.Tensor:
        """(B, N, C) -> expected (x, y) of each keypoint (B, P, 2), x to the right, y down."""
        side = math.isqrt(cells.shape[1])
        if side * side != cells.shape[1]:
            raise ValueError(f"keypoints need a square feature grid, got {cells.shape[1]} cells")
        axis = torch.linspace(-1, 1, side, device=cells.device)
        grid = torch.stack(torch.meshgrid(axis, axis, indexing="xy"), dim=-1).reshape(-1, 2)  # (N, 2)
        attention = self.logits(cells).float().softmax(dim=1)  # (B, N, P), over the cells
        return attention.transpose(1, 2) @ grid  # (B, P, 2)

    def forward(self, cells: torch.Tensor) -> torch.Tensor:
        xy = self.coordinates(cells).to(cells.dtype)  # (B, P, 2)
        return self.embed_xy(xy) + self.identity  # (B, P, d)


def random_shift(image: torch.Tensor, pad: int) -> torch.Tensor:
    """Pad by replicating the border and crop back at a random offset per sample: (B, 3, H, W)."""
    if pad <= 0:
        return image
    b, _, h, w = image.shape
    padded = F.pad(image, (pad, pad, pad, pad), mode="replicate")
    dx = torch.randint(0, 2 * pad + 1, (b,))
    dy = torch.randint(0, 2 * pad + 1, (b,))
    rows = (dy[:, None] + torch.arange(h))[:, :, None].expand(b, h, w)  # (B, H, W)
    cols = (dx[:, None] + torch.arange(w))[:, None, :].expand(b, h, w)
    batch = torch.arange(b)[:, None, None]
    return padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2)
