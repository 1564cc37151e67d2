"""dvla: masked-diffusion vision-language-action models."""
