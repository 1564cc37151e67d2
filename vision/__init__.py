"""dvla.vision: filled in by the model issue."""
