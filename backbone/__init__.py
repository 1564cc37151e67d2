"""dvla.backbone: filled in by the model issue."""
