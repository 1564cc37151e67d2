"""MetaWorld (Sawyer arm, 50 tasks) as a dvla environment: `--env metaworld` (the default)."""

from __future__ import annotations

from dvla.sim.environments import Environment


class MetaWorld(Environment):
    name = "metaworld"
    robot_type = "sawyer"
    fps = 80
    state_dim = 4
    action_dim = 4
    cameras = ("corner2", "topview", "behindGripper", "gripperPOV", "corner", "corner3")
    default_cameras = ("corner2",)
    max_episode_steps = 500
    default_episode_steps = 500
    default_suite = "mt10"

    def resolve_tasks(self, tasks, suite):
        from dvla.sim.tasks import resolve_tasks

        return resolve_tasks(tasks, suite)

    def instruction(self, task):
        from dvla.sim.tasks import task_description

        return task_description(task)

    def action_bounds(self, task):
        """MetaWorld's action space: hand displacement and gripper effort, each in [-1, 1]."""
        return [-1.0] * self.action_dim, [1.0] * self.action_dim

    def plan_overlay(self, task, cameras, image_shape):
        """The hand's path: the chunk's displacements added up from the hand's position."""
        from dvla.sim.metaworld_env import plan_overlay

        return plan_overlay(task, cameras, image_shape)

    def image_shape(self, height):
        return (height or 128, height or 128)

    def make(self, task, cameras, image_shape, shadow_size=0, max_episode_steps=500):
        from dvla.sim.metaworld_env import MetaWorldEnv, MetaWorldEnvConfig

        if image_shape[0] != image_shape[1]:
            raise ValueError(f"MetaWorld renders square images; got {image_shape[0]}x{image_shape[1]}")
        config = MetaWorldEnvConfig(task, list(cameras), image_shape[0], shadow_size, max_episode_steps)
        return MetaWorldEnv(config)

    def features(self, cameras, image_shape, use_videos, sim_state):
        from dvla.sim.recording import metaworld_features

        return metaworld_features(cameras, image_shape[0], use_videos, sim_state)

    def make_expert(self, task):
        from dvla.sim.experts import ScriptedExpert

        return ScriptedExpert(task)

    def record_demo(self, env, expert, seed, spec):
        from dvla.sim.collect_worker import run_expert_episode, run_scene_walk

        if spec.kind == "scenes":  # nothing to succeed at: every scene is kept
            return run_scene_walk(env, seed, spec.scene_frames, spec.scene_walk_steps), True
        return run_expert_episode(
            env, expert, seed, spec.sim_state, spec.action_noise, spec.action_noise_steps
        )


ENVIRONMENT = MetaWorld()
