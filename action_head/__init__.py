"""dvla.action_head: filled in by the model issue."""
