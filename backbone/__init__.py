"""dvla.backbone: the masked-diffusion transformer, its noise schedule, loss and parallel decoder."""

from dvla.backbone.configuration import DiffusionLMConfig
from dvla.backbone.decoder import Confidence, DecodeConfig, DecodeResult, UnmaskSchedule, decode
from dvla.backbone.modeling import DiffusionLM

__all__ = [
    "Confidence",
    "DecodeConfig",
    "DecodeResult",
    "DiffusionLM",
    "DiffusionLMConfig",
    "UnmaskSchedule",
    "decode",
]
