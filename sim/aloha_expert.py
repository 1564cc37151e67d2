"""Scripted ALOHA experts: gripper waypoints in end-effector space, replayed in joint space.

The method of the ACT paper (Zhao et al. 2023): from the objects' poses at reset, each gripper gets
a few timed waypoints (position, orientation, opening); the end-effector (mocap) version of the task
follows their interpolation while its joint angles are recorded; that joint trajectory is then
replayed as actions in the joint-space task from the same seed, and the episode is kept when its
reward reaches the maximum. The waypoints below are ours, tuned on the training seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial.transform import Rotation, Slerp

from dvla.sim.aloha_env import ACTION_DIM, EPISODE_STEPS, build_control_env, check_tasks, object_pose

EE_XML = {
    "transfer_cube": "bimanual_viperx_end_effector_transfer_cube.xml",
    "insertion": "bimanual_viperx_end_effector_insertion.xml",
}
OPEN, CLOSED = 1.0, 0.0  # normalised gripper opening, as in the 14-D action


@dataclass
class Waypoint:
    """Where one gripper is at control step `t`: position (3,), quaternion (w, x, y, z), opening."""

    t: int
    xyz: np.ndarray
    quat: np.ndarray
    grip: float


def _turn(quat: np.ndarray, axis: str, degrees: float) -> np.ndarray:
    """`quat` (w, x, y, z) followed by a rotation about its own `axis`."""
    turned = Rotation.from_quat(quat, scalar_first=True) * Rotation.from_euler(axis, degrees, degrees=True)
    return turned.as_quat(scalar_first=True)


def interpolate(waypoints: list[Waypoint], steps: int) -> np.ndarray:
    """(steps, 8) per-step [xyz, quat, grip]: linear in position and opening, spherical in rotation."""
    times = np.array([w.t for w in waypoints], float)
    t = np.clip(np.arange(steps, dtype=float), times[0], times[-1])
    xyz = np.stack([np.interp(t, times, [w.xyz[i] for w in waypoints]) for i in range(3)], axis=1)
    grip = np.interp(t, times, [w.grip for w in waypoints])[:, None]
    rotations = Rotation.from_quat(np.stack([w.quat for w in waypoints]), scalar_first=True)
    quat = Slerp(times, rotations)(t).as_quat(scalar_first=True)
    return np.concatenate([xyz, quat, grip], axis=1)


Plan = tuple[list[Waypoint], list[Waypoint]]  # (left, right) waypoints


def transfer_cube_pick(state: dict) -> Plan:
    """Stage 1, from the reset: the right gripper comes down at a slant, closes on the cube and
    lifts it to the meeting point; the left one waits beside the meeting point, open."""
    left, right, cube = state["left"], state["right"], state["objects"][:3]
    pick = _turn(right[3:], "y", -45)
    take = _turn(left[3:], "x", 90)  # the left gripper turns its fingers across the cube
    grasp = cube + np.array([0, -0.015, -0.045])
    right_plan = [
        Waypoint(0, right[:3], right[3:], CLOSED),
        Waypoint(80, grasp + np.array([0, 0, 0.08]), pick, OPEN),
        Waypoint(115, grasp, pick, OPEN),
        Waypoint(LIFT[0], grasp, pick, CLOSED),
        Waypoint(LIFT[0] + 15, grasp + np.array([0, 0, 0.03]), pick, CLOSED),  # off the table gently
        Waypoint(LIFT[1], MEET + np.array([0.05, 0, 0]), pick, CLOSED),
        Waypoint(LIFT[1] + 20, MEET, pick, CLOSED),
        Waypoint(HANDOVER, MEET, pick, CLOSED),
    ]
    left_plan = [
        Waypoint(0, left[:3], left[3:], CLOSED),
        Waypoint(100, MEET + np.array([-0.15, 0, 0]), take, OPEN),
        Waypoint(HANDOVER, MEET + np.array([-0.15, 0, 0]), take, OPEN),
    ]
    return left_plan, right_plan


def transfer_cube_handover(state: dict) -> Plan:
    """Stage 2, once the held cube has settled at the meeting point: the left gripper goes to where
    the cube really is, closes, the right one lets go and both move apart."""
    left, right, cube = state["left"], state["right"], state["objects"][:3]
    at_cube = cube + HANDOVER_OFFSET
    left_plan = [
        Waypoint(HANDOVER, left[:3], left[3:], OPEN),
        Waypoint(HANDOVER + 35, at_cube + np.array([-0.06, 0, 0]), left[3:], OPEN),
        Waypoint(HANDOVER + 55, at_cube, left[3:], OPEN),
        Waypoint(HANDOVER + 70, at_cube, left[3:], CLOSED),
        Waypoint(HANDOVER + 125, at_cube + np.array([-0.12, 0, 0]), left[3:], CLOSED),
    ]
    right_plan = [
        Waypoint(HANDOVER, right[:3], right[3:], CLOSED),
        Waypoint(HANDOVER + 75, right[:3], right[3:], CLOSED),
        Waypoint(HANDOVER + 85, right[:3], right[3:], OPEN),
        Waypoint(HANDOVER + 125, right[:3] + np.array([0.1, 0, 0]), right[3:], OPEN),
    ]
    return left_plan, right_plan


MEET = np.array([0.0, 0.5, 0.25])
HANDOVER = 250  # the step the left gripper starts for the cube
LIFT = (150, 225)  # the right gripper has closed on the cube, and has lifted it beside the meeting point
HANDOVER_OFFSET = np.array([0.07, 0.0, -0.03])  # left jaw centre from the cube, tuned


def insertion_lift(state: dict) -> Plan:
    """Stage 1: the right gripper takes the peg by its outer end, the left one the socket by its
    outer end, both from above at a slant, and they lift them towards each other."""
    left, right, objects = state["left"], state["right"], state["objects"]
    peg, socket = objects[:3], objects[7:10]
    right_quat = _turn(right[3:], "y", -INSERTION_TILT)
    left_quat = _turn(left[3:], "y", INSERTION_TILT)
    above = np.array([0, 0, 0.08])
    right_grasp, left_grasp = peg + PEG_GRASP, socket + SOCKET_GRASP
    right_plan = [
        Waypoint(0, right[:3], right[3:], CLOSED),
        Waypoint(100, right_grasp + above, right_quat, OPEN),
        Waypoint(140, right_grasp, right_quat, OPEN),
        Waypoint(170, right_grasp, right_quat, CLOSED),
        Waypoint(230, INSERT_AT + np.array([0.12, 0, 0]), right_quat, CLOSED),
        Waypoint(ALIGN, INSERT_AT + np.array([0.12, 0, 0]), right_quat, CLOSED),
    ]
    left_plan = [
        Waypoint(0, left[:3], left[3:], CLOSED),
        Waypoint(100, left_grasp + above, left_quat, OPEN),
        Waypoint(140, left_grasp, left_quat, OPEN),
        Waypoint(170, left_grasp, left_quat, CLOSED),
        Waypoint(230, INSERT_AT + np.array([-0.12, 0, 0]), left_quat, CLOSED),
        Waypoint(ALIGN, INSERT_AT + np.array([-0.12, 0, 0]), left_quat, CLOSED),
    ]
    return left_plan, right_plan


def insertion_push(state: dict) -> Plan:
    """Stage 2, with both objects held up: the right gripper brings the peg's inner end in front of
    the socket's opening, on the socket's axis (from where both really are, tilts included), and
    pushes it in along that axis until it meets the pin."""
    left, right, objects = state["left"], state["right"], state["objects"]
    peg_axis = Rotation.from_quat(objects[3:7], scalar_first=True).apply([1.0, 0, 0])
    socket_axis = Rotation.from_quat(objects[10:14], scalar_first=True).apply([1.0, 0, 0])
    peg_end = objects[:3] - 0.06 * peg_axis  # the peg's inner end (it is 12 cm long)
    opening = objects[7:10] + 0.06 * socket_axis  # the socket's open end, facing the peg
    # turn the right gripper so that the peg lies along the socket's axis (it sags in a weak grip);
    # the turn is about the mocap point, so the peg's end moves with it
    level, _ = Rotation.align_vectors([socket_axis], [peg_axis])
    quat = (level * Rotation.from_quat(right[3:], scalar_first=True)).as_quat(scalar_first=True)
    peg_end = right[:3] + level.apply(peg_end - right[:3])
    before = right[:3] + (opening + 0.02 * socket_axis - peg_end)  # 2 cm out, on the axis
    # the pin ends 2 cm inside the opening: push 2 cm to the opening, 2 cm to the pin and a little more
    inside = before - (0.04 + PUSH_DEPTH) * socket_axis
    right_plan = [
        Waypoint(ALIGN, right[:3], right[3:], CLOSED),
        Waypoint(ALIGN + 40, before, quat, CLOSED),
        Waypoint(ALIGN + 100, inside, quat, CLOSED),
    ]
    left_plan = [
        Waypoint(ALIGN, left[:3], left[3:], CLOSED),
        Waypoint(ALIGN + 100, left[:3], left[3:], CLOSED),
    ]
    return left_plan, right_plan


INSERT_AT = np.array([0.0, 0.5, 0.15])
ALIGN = 260  # the step the peg is lined up with the socket
PEG_GRASP = np.array([0.0, -0.015, -0.045])  # right jaw centre from the peg's centre, tuned
SOCKET_GRASP = np.array([-0.03, 0.015, -0.045])  # left jaw centre from the socket's centre, tuned
PUSH_DEPTH = 0.02
INSERTION_TILT = 90  # degrees down from horizontal: straight down


# Each task's plan in stages: (first step, planner). A stage plans from the state at its first step
# until the next stage starts (the last one until the episode ends, holding its last waypoint).
PLANS = {
    "transfer_cube": [(0, transfer_cube_pick), (HANDOVER, transfer_cube_handover)],
    "insertion": [(0, insertion_lift), (ALIGN, insertion_push)],
}


def end_effector_task(task: str, pose: np.ndarray):
    """gym-aloha's end-effector task with the objects placed at `pose` (gym-aloha draws them
    unseeded) and an observation without renders."""
    from dm_control.suite import base
    from gym_aloha.tasks.sim_end_effector import InsertionEndEffectorTask, TransferCubeEndEffectorTask

    parent = TransferCubeEndEffectorTask if task == "transfer_cube" else InsertionEndEffectorTask
    joints = ["red_box_joint"] if task == "transfer_cube" else ["red_peg_joint", "blue_socket_joint"]

    class Placed(parent):
        def initialize_episode(self, physics):
            self.initialize_robots(physics)
            for i, joint in enumerate(joints):
                physics.named.data.qpos[joint] = pose[7 * i : 7 * i + 7]
            base.Task.initialize_episode(self, physics)

        def get_observation(self, physics):
            data = physics.data
            return {
                "qpos": self.get_qpos(physics),
                "left": np.concatenate([data.mocap_pos[0], data.mocap_quat[0]]),
                "right": np.concatenate([data.mocap_pos[1], data.mocap_quat[1]]),
                "objects": data.qpos[16:].copy(),  # free-joint poses (7 per object)
            }

    return Placed()


class AlohaExpert:
    """`joint_actions(seed)`: the (steps, 14) joint-position actions of the scripted episode for the
    objects `reset(seed)` places; `reward` is the end-effector run's maximum reward."""

    def __init__(self, task: str, steps: int = EPISODE_STEPS):
        check_tasks([task])
        self.task, self.steps = task, steps

    def joint_actions(self, seed: int) -> tuple[np.ndarray, float]:
        pose = object_pose(self.task, seed)
        env = build_control_env(EE_XML[self.task], end_effector_task(self.task, pose))
        state = env.reset().observation
        stages = PLANS[self.task]
        ends = [start for start, _ in stages[1:]] + [self.steps]
        actions, best, t = np.zeros((self.steps, ACTION_DIM)), 0.0, 0
        for (start, planner), end in zip(stages, ends, strict=True):
            left_plan, right_plan = planner(state)
            left, right = interpolate(left_plan, end), interpolate(right_plan, end)  # (end, 8)
            for t in range(start, min(end, self.steps)):
                timestep = env.step(np.concatenate([left[t], right[t]]))
                best = max(best, float(timestep.reward))
                state = timestep.observation
                # where the joints went under the mocap weld is the next joint target; the grippers
                # take the commanded opening (their joints lag behind it)
                actions[t] = state["qpos"]
                actions[t, 6], actions[t, 13] = left[t, 7], right[t, 7]
        return actions.astype(np.float32), best
