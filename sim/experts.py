"""MetaWorld's scripted expert policies, one per task."""

from __future__ import annotations

import warnings

import numpy as np

from dvla.sim.tasks import _lerobot_metaworld_config, check_tasks

# MetaWorld's policies warn on every step whose action they clip; clipping is expected here.
warnings.filterwarnings("ignore", message=r"Constant\(s\) may be too high")


class ScriptedExpert:
    """Wraps MetaWorld's hand-written policy for `task`; acts on the env's 39-D raw observation."""

    def __init__(self, task: str):
        import metaworld.policies as policies

        check_tasks([task])
        class_name = _lerobot_metaworld_config()["TASK_POLICY_MAPPING"][task]
        self.task = task
        self._policy = getattr(policies, class_name)()

    def __call__(self, raw_obs: np.ndarray) -> np.ndarray:
        action = self._policy.get_action(raw_obs)
        return np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)
