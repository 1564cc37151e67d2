"""dvla.model: the core DiffusionVLA and its configuration."""

from dvla.model.config import BackboneSize, DiffusionVLAConfig
from dvla.model.vla import DiffusionVLA, Prefix, TextSpecials

__all__ = ["BackboneSize", "DiffusionVLA", "DiffusionVLAConfig", "Prefix", "TextSpecials"]
