"""Recording scripted demonstrations into LeRobot datasets: round trip, resume, errors."""

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from conftest import TINY_TASKS, tiny_spec

from dvla.data import LeRobotChunks, LeRobotDataConfig
from dvla.sim.collect import REPORT_FILE, WORK_DIR, collect_demos
from dvla.sim.collect_worker import LOCK_FILE
from dvla.sim.recording import PART_MANIFEST, metaworld_features, validate_frame


def test_dataset_loads_offline_with_lerobot(tiny_dataset):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root, report = tiny_dataset
    assert not (root / WORK_DIR).exists()  # work files are gone once the dataset is complete
    ds = LeRobotDataset("local/tiny", root=root, video_backend="pyav")
    assert ds.meta.total_episodes == 4
    assert ds.meta.fps == 80
    assert sorted(ds.meta.tasks.index) == sorted(
        ["Reach a goal position", "Open a door with a revolving joint"]
    )
    assert ds.meta.total_frames == report["frames"]
    frame = ds[0]
    assert frame["observation.images.corner2"].shape == (3, 64, 64)
    assert frame["observation.images.gripperPOV"].shape == (3, 64, 64)
    # recording stops at the first success: only the last frame of each episode is a success
    success = np.asarray(ds.hf_dataset["next.success"]).reshape(-1)
    episode = np.asarray(ds.hf_dataset["episode_index"])
    for ep in range(4):
        flags = success[episode == ep]
        assert flags[-1] and not flags[:-1].any()


def test_sim_state_is_recorded_but_no_policy_input(tiny_dataset):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.utils.feature_utils import dataset_to_policy_features

    from dvla.sim.recording import SIM_STATE_KEY

    root, _ = tiny_dataset
    ds = LeRobotDataset("local/tiny", root=root, video_backend="pyav")
    sim = np.asarray(ds.hf_dataset[SIM_STATE_KEY], np.float32)  # (N, 39)
    state = np.asarray(ds.hf_dataset["observation.state"], np.float32)  # (N, 4)
    assert sim.shape == (len(ds), 39)
    np.testing.assert_array_equal(sim[:, :4], state)  # MetaWorld's observation starts with hand + gripper
    episode = np.asarray(ds.hf_dataset["episode_index"])
    reach = [e for e in range(4) if ds.meta.episodes[e]["tasks"] == ["Reach a goal position"]]
    goals = [sim[episode == e, 36:] for e in reach]  # the goal: fixed within an episode, new per seed
    assert all(np.ptp(g, axis=0).max() == 0 for g in goals) and not np.allclose(goals[0][0], goals[1][0])
    # lerobot policies (ACT, Diffusion Policy) take no input from it
    assert SIM_STATE_KEY not in dataset_to_policy_features(ds.meta.features)


def test_videos_hold_every_frame_and_a_gap_is_caught(tiny_dataset, tmp_path):
    from dvla.sim.recording import check_video_frames

    root, _ = tiny_dataset
    check_video_frames(root)  # also run on every part while recording
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    info = json.loads((copy / "meta" / "info.json").read_text())
    info["total_frames"] += 1  # as if the encoder had dropped a frame
    (copy / "meta" / "info.json").write_text(json.dumps(info))
    with pytest.raises(RuntimeError, match="dropped frames"):
        check_video_frames(copy)


def test_report_gives_expert_success_per_task(tiny_dataset):
    root, _ = tiny_dataset
    saved = json.loads((root / "meta" / REPORT_FILE).read_text())
    assert saved["per_task"].keys() == set(TINY_TASKS)
    for row in saved["per_task"].values():
        # both experts solve seeds 0 and 1 (MetaWorld 3.0.0 on mujoco 3.3)
        assert row["episodes"] == row["expert_attempts"] == 2
        assert row["expert_success_rate"] == 1.0
        assert row["seeds"] == [0, 1] and row["failures"] == []
        assert 0 < row["mean_episode_length"] <= 200
    assert saved["incomplete_tasks"] == [] and saved["episodes_at_start"] == 0


def test_chunks_shapes_padding_and_stats(tiny_dataset):
    root, _ = tiny_dataset
    data = LeRobotChunks(LeRobotDataConfig(root=str(root), chunk_size=8, image_size=32))
    assert data.cameras == {
        "corner2": "observation.images.corner2",
        "gripperPOV": "observation.images.gripperPOV",
    }
    first = data[0]
    assert first["images"]["corner2"].shape == (3, 32, 32)
    assert first["images"]["corner2"].min() >= 0.0 and first["images"]["corner2"].max() <= 1.0
    assert first["state"].shape == (4,)
    assert first["actions"].shape == (8, 4) and not first["actions_is_pad"].any()
    # The chunk starting 3 frames before the end of episode 0 has 3 real actions then padding.
    end = int(data.dataset.meta.episodes[0]["dataset_to_index"])
    last = data[end - 3]
    assert last["actions_is_pad"].tolist() == [False] * 3 + [True] * 5
    raw_actions = torch.stack([data.dataset.hf_dataset[i]["action"] for i in range(end - 3, end)])
    torch.testing.assert_close(last["actions"][:3], raw_actions)
    # exact statistics: the same numbers as the actions read back sample by sample
    actions = torch.stack([data[i]["actions"][0] for i in range(len(data))]).double().numpy()
    stats = data.stats["action"]
    np.testing.assert_allclose(stats["q01"], np.quantile(actions, 0.01, axis=0), rtol=1e-6)
    np.testing.assert_allclose(stats["q99"], np.quantile(actions, 0.99, axis=0), rtol=1e-6)
    np.testing.assert_allclose(stats["mean"], actions.mean(0), rtol=1e-6)


def test_frame_cache_matches_video_decoding(tiny_dataset):
    root, _ = tiny_dataset
    config = dict(root=str(root), chunk_size=8, image_size=32, sim_state_key="sim.state")
    plain = LeRobotChunks(LeRobotDataConfig(**config))
    cached = LeRobotChunks(LeRobotDataConfig(**config, cache_frames=True))
    end = int(plain.dataset.meta.episodes[0]["dataset_to_index"])
    for index in (0, end - 3, end, len(plain) - 1):  # episode starts and ends of the two episodes
        a, b = plain[index], cached[index]
        assert a["task"] == b["task"]
        for camera in ("corner2", "gripperPOV"):
            atol = 1 / 255 + 1e-6  # the cache resizes in uint8: within one level
            torch.testing.assert_close(a["images"][camera], b["images"][camera], atol=atol, rtol=0)
        for key in ("state", "actions", "actions_is_pad", "sim_state"):
            torch.testing.assert_close(a[key], b[key])


def test_existing_root_needs_resume_or_overwrite(tiny_dataset, tmp_path):
    root = tmp_path / "busy"
    root.mkdir()
    (root / "something.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="--resume.*--overwrite"):
        collect_demos(root, tiny_spec())
    assert (root / "something.txt").read_text() == "keep me"
    with pytest.raises(ValueError, match="exclude"):
        collect_demos(root, tiny_spec(), resume=True, overwrite=True)
    # a finished collection resumed: nothing to do, nothing lost
    done_root, _ = tiny_dataset
    assert collect_demos(done_root, tiny_spec(), resume=True) == json.loads(
        (done_root / "meta" / REPORT_FILE).read_text()
    )


def test_an_expert_that_never_succeeds_is_a_clear_error(tmp_path):
    spec = tiny_spec(
        tasks=["door-open-v3"], episodes=1, cameras=["corner2"], image_size=32, max_episode_steps=3
    )
    with pytest.raises(RuntimeError, match="no successful expert episode.*max_episode_steps"):
        collect_demos(tmp_path / "never", spec)


def test_png_frames_instead_of_videos_and_no_sim_state(tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = tmp_path / "png"
    spec = tiny_spec(
        tasks=["reach-v3"], episodes=1, cameras=["topview"], image_size=32, use_videos=False, sim_state=False
    )
    collect_demos(root, spec)
    ds = LeRobotDataset("local/png", root=root)
    assert ds.meta.features["observation.images.topview"]["dtype"] == "image"
    assert "sim.state" not in ds.meta.features
    assert not (root / "videos").exists()
    assert ds[0]["observation.images.topview"].shape == (3, 32, 32)


def _collect_cli(root, *extra):
    return [
        sys.executable, "-m", "dvla.cli", "collect", "--tasks", "reach-v3", "--episodes", "4",
        "--image-size", "32", "--root", str(root), "--episodes_per_part", "1", *extra,
    ]  # fmt: skip


def test_resume_after_interruption_keeps_finished_episodes(tmp_path):
    root = tmp_path / "interrupted"
    proc = subprocess.Popen(_collect_cli(root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts = root / WORK_DIR / "parts"
    state = root / WORK_DIR / "state.json"

    def part_recorded() -> bool:  # a worker wrote a part, and the main process then its elapsed time
        if not list(parts.glob(f"*/{PART_MANIFEST}")) or not state.exists():
            return False
        return json.loads(state.read_text())["elapsed_s"] > 0

    deadline = time.time() + 240
    while time.time() < deadline and not part_recorded():
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)  # a hard kill: no clean-up in the main process
    proc.wait()
    # a resume is refused while workers of the killed run still hold the collection's lock
    lock = (root / WORK_DIR / LOCK_FILE).open("a")
    deadline = time.time() + 60
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            assert time.time() < deadline, "workers of the killed run did not exit"
            time.sleep(0.2)
    lock.close()
    kept = [json.loads(m.read_text())[0]["seed"] for m in parts.glob(f"*/{PART_MANIFEST}")]
    assert kept, "no part was finished before the kill"
    before_kill = json.loads((root / WORK_DIR / "state.json").read_text())["elapsed_s"]
    assert before_kill > 0  # recorded after each episode, so a hard kill keeps it
    (parts / "part-torn").mkdir()  # a part cut off mid-write (no manifest) must be dropped

    # without --resume the folder is protected
    blocked = subprocess.run(_collect_cli(root), capture_output=True, text=True)
    assert blocked.returncode == 1 and "--resume" in blocked.stderr

    # a resume with other settings is refused
    other = subprocess.run(_collect_cli(root, "--resume", "--image_size=48"), capture_output=True, text=True)
    assert other.returncode == 1 and "different settings" in other.stderr

    done = subprocess.run(_collect_cli(root, "--resume"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/interrupted", root=root, video_backend="pyav")
    assert ds.meta.total_episodes == 4
    report = json.loads((root / "meta" / REPORT_FILE).read_text())
    assert report["per_task"]["reach-v3"]["episodes"] == 4
    assert report["episodes_at_start"] == len(kept)  # finished episodes were kept, not recorded again
    assert report["elapsed_s"] > before_kill  # the time before the kill counts
    # the reach expert always succeeds, so the seeds are exactly 0..3, each once
    assert report["per_task"]["reach-v3"]["seeds"] == [0, 1, 2, 3]
    frames_per_episode = np.bincount(np.asarray(ds.hf_dataset["episode_index"]))
    assert len(frames_per_episode) == 4 and frames_per_episode.min() > 0
    assert not (root / WORK_DIR).exists()


def test_a_collection_recorded_before_sim_state_is_kept_or_resumed_without_it():
    from dvla.sim.collect import _check_same_spec

    old = {k: v for k, v in json.loads(json.dumps(vars(tiny_spec()))).items() if k != "sim_state"}
    assert _check_same_spec(old, tiny_spec(), "finished collection", finished=True)  # kept as it is
    with pytest.raises(ValueError, match="--sim_state false"):
        _check_same_spec(old, tiny_spec(), "interrupted run")
    assert not _check_same_spec(old, tiny_spec(sim_state=False), "interrupted run")
    with pytest.raises(ValueError, match="different settings"):
        _check_same_spec(old, tiny_spec(image_size=48), "finished collection", finished=True)


def test_bad_frames_are_rejected_with_a_clear_message():
    features = metaworld_features(["corner2"], 32, use_videos=True)
    good = {
        "observation.images.corner2": np.zeros((32, 32, 3), np.uint8),
        "observation.state": np.zeros(4, np.float32),
        "sim.state": np.zeros(39, np.float32),
        "action": np.zeros(4, np.float32),
        "next.reward": np.zeros(1, np.float32),
        "next.success": np.zeros(1, bool),
        "task": "Reach a goal position",
    }
    validate_frame(good, features)
    cases = {
        "NaN or inf": {"action": np.array([0, np.nan, 0, 0], np.float32)},
        "shape": {"observation.state": np.zeros(5, np.float32)},
        "contains NaN": {"sim.state": np.full(39, np.inf, np.float32)},
        "dtype": {"action": np.zeros(4, np.float64)},
        "uint8": {"observation.images.corner2": np.zeros((32, 32, 3), np.float32)},
        "numpy array": {"next.reward": [0.0]},
        "task": {"task": ""},
    }
    for message, change in cases.items():
        with pytest.raises(ValueError, match=message):
            validate_frame({**good, **change}, features)
    with pytest.raises(ValueError, match="missing"):
        validate_frame({k: v for k, v in good.items() if k != "action"}, features)
    with pytest.raises(ValueError, match="not in the dataset features"):
        validate_frame({**good, "extra": np.zeros(1, np.float32)}, features)


def test_cli_errors_exit_with_a_message(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "dvla.cli", "collect", "--tasks", "reach-v9", "--root", str(tmp_path / "x")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert run.returncode == 1 and "unknown MetaWorld task" in run.stderr and "reach-v3" in run.stderr
    run = subprocess.run(
        [sys.executable, "-m", "dvla.cli", "collect", "--suite", "mt10"], capture_output=True, text=True
    )
    assert run.returncode == 1 and "--root is required" in run.stderr


def test_scenes_record_where_things_are_while_the_arm_wanders(tiny_scenes):
    """`--kind scenes`: no expert; each seed is one reset, then frames of a random arm walk with the
    simulator state. The goal stays put within a scene and moves between seeds."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from dvla.sim.metaworld_env import MetaWorldEnv, MetaWorldEnvConfig
    from dvla.sim.recording import SIM_STATE_KEY

    root, report = tiny_scenes
    assert {t: row["seeds"] for t, row in report["per_task"].items()} == {t: [100, 101] for t in TINY_TASKS}
    assert all(row["expert_success_rate"] is None for row in report["per_task"].values())
    ds = LeRobotDataset("local/scenes", root=root, video_backend="pyav")
    assert ds.meta.total_episodes == 4 and len(ds) == 12
    sim = np.asarray(ds.hf_dataset[SIM_STATE_KEY], np.float32)  # (12, 39)
    episode = np.asarray(ds.hf_dataset["episode_index"])
    reach = [e for e in range(4) if ds.meta.episodes[e]["tasks"] == ["Reach a goal position"]]
    for e in reach:
        hand = sim[episode == e, :3]
        assert np.linalg.norm(np.diff(hand, axis=0), axis=1).min() > 0.005  # the arm moved between frames
        goal = sim[episode == e, 36:]  # (3, 3)
        np.testing.assert_allclose(goal, np.broadcast_to(goal[0], goal.shape), atol=1e-6)
    goals = [sim[episode == e][0, 36:] for e in reach]
    assert np.linalg.norm(goals[0] - goals[1]) > 0.01
    # the first frame of each scene is the reset of its seed, as a rollout would see it
    env = MetaWorldEnv(MetaWorldEnvConfig(task="reach-v3", cameras=["corner2"], image_size=64))
    try:
        seeds = sorted(report["per_task"]["reach-v3"]["seeds"])
        for e, seed in zip(sorted(reach), seeds, strict=True):
            env.reset(seed=seed)
            np.testing.assert_allclose(sim[episode == e][0], env.raw_obs, atol=1e-5)
    finally:
        env.close()


def test_scene_settings_are_checked():
    with pytest.raises(ValueError, match="kind must be one of"):
        tiny_spec(kind="walks")
    with pytest.raises(ValueError, match="evaluation seeds"):
        tiny_spec(kind="scenes", seed_start=1000)
    with pytest.raises(ValueError, match="need sim_state true"):
        tiny_spec(kind="scenes", sim_state=False)
    with pytest.raises(ValueError, match="exceeds max_episode_steps"):
        tiny_spec(kind="scenes", scene_frames=30, scene_walk_steps=10)


def test_perturbed_demonstrations_record_the_experts_action_off_its_path():
    """With action_noise the hand is pushed off the expert's path, every recorded action is still
    what the expert does in the recorded state, and the same seed gives the same episode."""
    from dvla.sim.collect_worker import run_expert_episode
    from dvla.sim.experts import ScriptedExpert
    from dvla.sim.metaworld_env import MetaWorldEnv, MetaWorldEnvConfig

    env = MetaWorldEnv(MetaWorldEnvConfig(task="reach-v3", cameras=["corner2"], image_size=32))
    expert = ScriptedExpert("reach-v3")
    try:
        plain, plain_ok = run_expert_episode(env, expert, seed=3)
        pushed, pushed_ok = run_expert_episode(env, expert, seed=3, noise=0.5, noise_steps=8)
        again, _ = run_expert_episode(env, expert, seed=3, noise=0.5, noise_steps=8)
    finally:
        env.close()
    assert plain_ok and pushed_ok

    def hand(frames):  # (T, 3) hand positions
        return np.stack([f["sim.state"][:3] for f in frames])

    n = min(len(plain), len(pushed))
    assert np.abs(hand(pushed)[:n] - hand(plain)[:n]).max() > 0.02  # pushed more than 2 cm off
    for frame in pushed:
        np.testing.assert_allclose(frame["action"], expert(frame["sim.state"]), atol=1e-6)
    np.testing.assert_array_equal(hand(pushed), hand(again))
    with pytest.raises(ValueError, match="action_noise"):
        tiny_spec(action_noise=1.5)
