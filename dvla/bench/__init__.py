"""`dvla bench`: side-by-side benchmarks of parallel diffusion decoding, autoregressive decoding and
LeRobot's ACT and Diffusion Policy on the same data, seeds, harness and machine (see `run.py`)."""
