"""dvla.vision: timm encoder adapter, projector, preprocessing and augmentation."""

from dvla.vision.encoder import VisionConfig, VisionEncoder, random_shift

__all__ = ["VisionConfig", "VisionEncoder", "random_shift"]
