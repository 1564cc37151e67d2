"""Scripted ALOHA experts: gripper waypoints in end-effector space, replayed in joint space.

After the ACT paper (Zhao et al. 2023): each gripper gets a few timed waypoints (position,
orientation, opening) from the objects' poses; the end-effector (mocap) version of the task follows
their interpolation, and its joint angles are the joint-space task's actions. Unlike ACT's open-loop
replay, both simulations run in lockstep and each stage re-plans from where the objects and fingers
are in the joint-space run (`AlohaExpert`), which the insertion needs: the weakly held peg and
socket swing in their grips, so the peg is steered into the socket by looking again every 10 steps.
An episode is kept when its reward reaches the maximum. The waypoints below are ours, tuned on the
training seeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
from scipy.spatial.transform import Rotation, Slerp

from dvla.sim.aloha_env import (
    ACTION_DIM,
    EPISODE_STEPS,
    XML,
    build_control_env,
    check_tasks,
    joint_space_task,
    object_pose,
)

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


def insertion_reach(state: dict) -> Plan:
    """Stage 1: both grippers open above their objects (the right one the peg, the left one the
    socket), pointing straight down, and start down towards them."""
    left, right, objects = state["left"], state["right"], state["objects"]
    peg, socket = objects[:3], objects[7:10]
    right_quat, left_quat = _turn(right[3:], "y", -90), _turn(left[3:], "y", 90)
    above = np.array([0, 0, GRASP_HEIGHT + 0.08])
    right_plan = [
        Waypoint(0, right[:3], right[3:], CLOSED),
        Waypoint(100, peg + above, right_quat, OPEN),
        Waypoint(140, peg + above - [0, 0, 0.04], right_quat, OPEN),
    ]
    left_plan = [
        Waypoint(0, left[:3], left[3:], CLOSED),
        Waypoint(100, socket + above, left_quat, OPEN),
        Waypoint(140, socket + above - [0, 0, 0.04], left_quat, OPEN),
    ]
    return left_plan, right_plan


def insertion_grasp(state: dict) -> Plan:
    """Stage 2, on the way down: each gripper is moved sideways by how far its fingers' midpoint
    misses its object (the arms do not hold the commanded yaw exactly, so the fingers drift by up
    to 4 cm across the object) and closes. The left gripper raises the socket a little; the right
    one lifts the peg and carries it in front of the socket's opening."""
    left, right, objects = state["left"], state["right"], state["objects"]
    left_fingers, right_fingers = state["fingers"]
    peg, socket = objects[:3], objects[7:10]
    right_grasp = _centred(right[:3], right_fingers, peg, PEG_FINGERS)
    left_grasp = _centred(left[:3], left_fingers, socket, SOCKET_FINGERS)
    raised = left_grasp + np.array([0, 0, SOCKET_LIFT])
    # the peg's centre 4 cm + half a peg in front of the opening, at the opening's height
    in_front = socket + np.array([0.06 + 0.04 + 0.06, 0, SOCKET_LIFT])
    carried = right_grasp + (in_front - peg)
    right_plan = [
        Waypoint(CENTRE, right[:3], right[3:], OPEN),
        Waypoint(140, right_grasp, right[3:], OPEN),
        Waypoint(170, right_grasp, right[3:], CLOSED),
        Waypoint(195, right_grasp + np.array([0, 0, 0.06]), right[3:], CLOSED),
        Waypoint(CARRIED - 10, carried + np.array([0, 0, 0.02]), right[3:], CLOSED),
        Waypoint(CARRIED, carried, right[3:], CLOSED),
        Waypoint(ALIGN, carried, right[3:], CLOSED),  # the peg swings in its grip: let it settle
    ]
    left_plan = [
        Waypoint(CENTRE, left[:3], left[3:], OPEN),
        Waypoint(140, left_grasp, left[3:], OPEN),
        Waypoint(170, left_grasp, left[3:], CLOSED),
        Waypoint(200, raised, left[3:], CLOSED),
        Waypoint(ALIGN, raised, left[3:], CLOSED),
    ]
    return left_plan, right_plan


def _centred(mocap: np.ndarray, fingers: np.ndarray, target: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """The mocap position that puts the fingers' midpoint at `target + offset` across the table,
    at the grasping height above `target`."""
    xy = mocap[:2] + target[:2] + offset - fingers[:2]
    return np.array([xy[0], xy[1], target[2] + GRASP_HEIGHT])


def insertion_servo(state: dict, start: int) -> Plan:
    """Stage 3, repeated every SERVO_EVERY steps with both objects held up. The peg swings in its
    weak grip, so each look starts from where peg and socket really are: the right gripper moves
    the peg's inner end towards a point on the socket's axis, 2 cm in front of the opening until
    the end is lined up with it, then through the opening to the pin. Orientations are kept (a
    commanded turn is not followed faithfully by the strained wrists); the left gripper holds."""
    left, right, objects = state["left"], state["right"], state["objects"]
    peg_axis = Rotation.from_quat(objects[3:7], scalar_first=True).apply([1.0, 0, 0])
    socket_axis = Rotation.from_quat(objects[10:14], scalar_first=True).apply([1.0, 0, 0])
    peg_end = objects[:3] - 0.06 * peg_axis  # the peg's inner end (it is 12 cm long)
    opening = objects[7:10] + 0.06 * socket_axis  # the socket's open end, facing the peg
    offset = peg_end - opening
    along = float(offset @ socket_axis)
    across = np.linalg.norm(offset - along * socket_axis)
    # the pin ends 2 cm inside the opening: aim a little beyond it once the end is lined up or in the tube
    inside = across < ON_AXIS or (along < 0.005 and across < IN_TUBE)
    target = opening - (0.02 + PUSH_DEPTH) * socket_axis if inside else opening + 0.02 * socket_axis
    move = target - peg_end
    move *= min(1.0, SERVO_STEP / max(np.linalg.norm(move), 1e-9))
    end = start + SERVO_EVERY
    right_plan = [
        Waypoint(start, right[:3], right[3:], CLOSED),
        Waypoint(end, right[:3] + move, right[3:], CLOSED),
    ]
    left_plan = [Waypoint(t, left[:3], left[3:], CLOSED) for t in (start, end)]
    return left_plan, right_plan


CARRIED = 245  # the step the peg is in front of the socket's opening
ALIGN = 260  # the step the peg is lined up with the socket
CENTRE = 120  # the step the grippers, on their way down, are centred on their objects
# where the fingers' midpoint goes from the object's centre, across the table (tuned so that the
# held objects stay level), and the mocap point's height from the resting object's centre
PEG_FINGERS = np.array([-0.015, 0.0])
SOCKET_FINGERS = np.array([0.04, 0.0])
GRASP_HEIGHT = -0.005
SOCKET_LIFT = 0.02
PUSH_DEPTH = 0.02
SERVO_EVERY = 10  # steps between two looks at the peg and the socket
SERVO_STEP = 0.015  # at most this far (m) per look
ON_AXIS = 0.004  # the peg's end is lined up with the opening within this (m)
IN_TUBE = 0.008  # past the opening, the peg's end is in the tube within this of its axis (m)


# Each task's plan in stages: (first step, planner). A stage plans from the state at its first step
# until the next stage starts (the last one until the episode ends, holding its last waypoint).
PLANS = {
    "transfer_cube": [(0, transfer_cube_pick), (HANDOVER, transfer_cube_handover)],
    "insertion": [
        (0, insertion_reach),
        (CENTRE, insertion_grasp),
        *((t, partial(insertion_servo, start=t)) for t in range(ALIGN, EPISODE_STEPS, SERVO_EVERY)),
    ],
}


def finger_midpoints(physics) -> np.ndarray:
    """(2, 3) the midpoint between the two fingers of the left and the right gripper."""
    position = physics.named.data.geom_xpos
    sides = ("left", "right")
    fingers = [[f"vx300s_{arm}/10_{side}_gripper_finger" for side in sides] for arm in sides]
    return np.stack([(position[a] + position[b]) / 2 for a, b in fingers])


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
                "fingers": finger_midpoints(physics),
            }

    return Placed()


class AlohaExpert:
    """`joint_actions(seed)`: the (steps, 14) joint-position actions of the scripted episode for the
    objects `reset(seed)` places, and the maximum reward the joint-space task reached with them.

    Two simulations run in lockstep: the end-effector task turns the planned gripper poses into
    joint angles (its mocap welds act as the inverse kinematics), and the joint-space task, the one
    recorded, is driven by those angles. Each stage plans from where the objects and fingers are in
    the joint-space task, so the plan corrects what the replay does differently, and replaying the
    actions from reset(seed) gives exactly this run (the simulation is deterministic)."""

    def __init__(self, task: str, steps: int = EPISODE_STEPS, lockstep: bool = True):
        check_tasks([task])
        self.task, self.steps, self.lockstep = task, steps, lockstep

    def joint_actions(self, seed: int) -> tuple[np.ndarray, float]:
        from gym_aloha.tasks import sim

        pose = object_pose(self.task, seed)
        planner = build_control_env(EE_XML[self.task], end_effector_task(self.task, pose))
        robot = build_control_env(XML[self.task], joint_space_task(self.task))
        sim.BOX_POSE[0] = pose  # gym-aloha's joint-space tasks place the objects from it at reset
        robot.reset()
        state = self._observe(planner.reset().observation, robot)
        stages = PLANS[self.task]
        ends = [start for start, _ in stages[1:]] + [self.steps]
        actions, best = np.zeros((self.steps, ACTION_DIM), np.float32), 0.0
        for (start, plan), end in zip(stages, ends, strict=True):
            left_plan, right_plan = plan(state)
            left, right = interpolate(left_plan, end), interpolate(right_plan, end)  # (end, 8)
            for t in range(start, min(end, self.steps)):
                planned = planner.step(np.concatenate([left[t], right[t]])).observation
                # where the joints went under the mocap weld is the next joint target; the grippers
                # take the commanded opening (their joints lag behind it)
                actions[t] = planned["qpos"]
                actions[t, 6], actions[t, 13] = left[t, 7], right[t, 7]
                # float32, as recorded, so that a replay repeats this run exactly
                best = max(best, float(robot.step(actions[t].astype(np.float64)).reward))
                state = self._observe(planned, robot)
        return actions, best

    def _observe(self, planned: dict, robot) -> dict:
        """The planner's mocap poses with the objects and fingers of the recorded (joint-space) run."""
        if not self.lockstep:
            return planned
        data = robot.physics.data
        return {**planned, "objects": data.qpos[16:].copy(), "fingers": finger_midpoints(robot.physics)}
