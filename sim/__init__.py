"""dvla.sim: MuJoCo environments (MetaWorld, VQA scenes), scripted experts and LeRobot recording."""

import os

# Headless rendering by default; must be set before mujoco picks its GL backend.
os.environ.setdefault("MUJOCO_GL", "egl")
# lerobot encodes videos with SVT-AV1, which prints its whole config per episode; keep errors only.
os.environ.setdefault("SVT_LOG", "1")
