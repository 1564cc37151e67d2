"""dvla.configs: YAML configs shipped with the package."""
