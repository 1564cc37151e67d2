"""Bimanual ALOHA (gym-aloha's MuJoCo models, lerobot's conventions) as a dvla environment:
`--env aloha` with the tasks `transfer_cube` and `insertion`."""

from __future__ import annotations

from dvla.sim import aloha_env
from dvla.sim.environments import Environment


class Aloha(Environment):
    name = "aloha"
    robot_type = "aloha"
    fps = aloha_env.FPS
    state_dim = aloha_env.STATE_DIM
    action_dim = aloha_env.ACTION_DIM
    cameras = aloha_env.CAMERAS
    default_cameras = ("top",)
    max_episode_steps = 1000
    default_episode_steps = aloha_env.EPISODE_STEPS
    default_suite = "all"

    def resolve_tasks(self, tasks, suite):
        if isinstance(tasks, str):
            tasks = [t.strip() for t in tasks.split(",") if t.strip()]
        if suite and suite != "all":
            raise ValueError(f"ALOHA has one suite, `all` ({', '.join(aloha_env.TASKS)}); got {suite!r}")
        if bool(tasks) == bool(suite):
            raise ValueError(f"give exactly one of --tasks ({','.join(aloha_env.TASKS)}) or --suite all")
        if suite:
            return list(aloha_env.TASKS)
        tasks = [aloha_env.GYM_IDS.get(t, t) for t in tasks]  # gym ids are accepted too
        if len(set(tasks)) != len(tasks):
            raise ValueError(f"duplicate task names in {tasks}")
        aloha_env.check_tasks(tasks)
        return tasks

    def instruction(self, task):
        aloha_env.check_tasks([task])
        return aloha_env.INSTRUCTIONS[task]

    def action_bounds(self, task):
        """The arm joints' limits in the task's model (radians) and the grippers' opening in [0, 1]."""
        return aloha_env.action_bounds(task)

    def plan_overlay(self, task, cameras, image_shape):
        """The grippers' fingers where the chunk's joint positions put them (forward kinematics)."""
        return aloha_env.plan_overlay(task, cameras, image_shape)

    def image_shape(self, height):
        """lerobot's 480x640 by default; a smaller height keeps the 3:4 aspect ratio."""
        h, w = aloha_env.IMAGE_SHAPE
        return (h, w) if height is None else (height, round(height * w / h))

    def make(self, task, cameras, image_shape, shadow_size=0, max_episode_steps=aloha_env.EPISODE_STEPS):
        config = aloha_env.AlohaEnvConfig(
            task, list(cameras), tuple(image_shape), shadow_size, max_episode_steps
        )
        return aloha_env.AlohaEnv(config)

    def features(self, cameras, image_shape, use_videos, sim_state):
        from dvla.sim.recording import image_key

        if sim_state:
            raise ValueError("ALOHA recordings carry no simulator state: collect with --sim_state false")
        image = "video" if use_videos else "image"
        shape = (*image_shape, 3)
        names = aloha_env.JOINT_NAMES
        features = {
            image_key(c): {"dtype": image, "shape": shape, "names": ["height", "width", "channels"]}
            for c in cameras
        }
        features["observation.state"] = {"dtype": "float32", "shape": (self.state_dim,), "names": names}
        features["action"] = {"dtype": "float32", "shape": (self.action_dim,), "names": names}
        features["next.reward"] = {"dtype": "float32", "shape": (1,), "names": None}
        features["next.success"] = {"dtype": "bool", "shape": (1,), "names": None}
        return features

    def make_expert(self, task):
        from dvla.sim.aloha_expert import AlohaExpert

        return AlohaExpert(task)

    def record_demo(self, env, expert, seed, spec):
        """The expert's joint trajectory replayed from reset(seed), every step recorded (as the hub's
        scripted datasets are: the episode goes on after success). Trajectories whose end-effector
        run failed are not replayed."""
        from dvla.sim.collect_worker import episode_frame

        if spec.kind != "demos" or spec.action_noise:
            raise ValueError("ALOHA collects plain expert demonstrations only (kind demos, no action_noise)")
        actions, planned = expert.joint_actions(seed)
        if planned < aloha_env.MAX_REWARD:
            return [], False
        obs, _ = env.reset(seed=seed)
        frames, success = [], False
        for action in actions[: spec.max_episode_steps]:
            next_obs, reward, _, _, info = env.step(action)
            success |= info["success"]
            frames.append(episode_frame(obs, None, action, reward, info["success"]))
            obs = next_obs
        return frames, success


ENVIRONMENT = Aloha()
