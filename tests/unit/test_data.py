"""The data module reads LeRobot datasets it did not write, mapping keys by config."""

import numpy as np
import pytest

from dvla.data import LeRobotChunks, LeRobotDataConfig, collate


@pytest.fixture(scope="module")
def foreign_dataset(tmp_path_factory):
    """A dataset shaped like another lab's: one 96 px camera under another key, 8-D state,
    7-D actions, an extra feature, 10 fps, PNG frames instead of videos."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = tmp_path_factory.mktemp("foreign") / "arm7"
    features = {
        "observation.image": {
            "dtype": "image",
            "shape": (96, 96, 3),
            "names": ["height", "width", "channels"],
        },
        "observation.state": {"dtype": "float32", "shape": (8,), "names": None},
        "observation.environment_state": {"dtype": "float32", "shape": (3,), "names": None},
        "action": {"dtype": "float32", "shape": (7,), "names": None},
    }
    ds = LeRobotDataset.create("lab/arm7", fps=10, features=features, root=root, use_videos=False)
    rng = np.random.default_rng(0)
    for episode in range(2):
        for t in range(12):
            ds.add_frame(
                {
                    "observation.image": rng.integers(0, 255, (96, 96, 3), dtype=np.uint8),
                    "observation.state": rng.normal(size=8).astype(np.float32),
                    "observation.environment_state": rng.normal(size=3).astype(np.float32),
                    "action": np.full(7, 100 * episode + t, np.float32),
                    "task": f"stack block {episode}",
                }
            )
        ds.save_episode()
    ds.finalize()
    return root


def test_foreign_dataset_maps_cameras_and_dimensions(foreign_dataset):
    data = LeRobotChunks(
        LeRobotDataConfig(
            root=str(foreign_dataset), cameras={"front": "observation.image"}, chunk_size=5, image_size=64
        )
    )
    assert (data.state_dim, data.action_dim, data.fps) == (8, 7, 10)
    sample = data[9]  # frame 9 of episode 0: actions 9, 10, 11, then padding
    assert sample["images"]["front"].shape == (3, 64, 64)
    assert sample["state"].shape == (8,)
    assert sample["actions"].shape == (5, 7)
    assert sample["actions"][:3, 0].tolist() == [9, 10, 11]
    assert sample["actions_is_pad"].tolist() == [False, False, False, True, True]
    assert sample["task"] == "stack block 0"
    batch = collate([data[0], data[13]])
    assert batch["images"]["front"].shape == (2, 3, 64, 64) and batch["actions"].shape == (2, 5, 7)
    assert batch["task"] == ["stack block 0", "stack block 1"]
    assert data.stats["action"]["max"].shape == (7,)


def test_default_camera_names_come_from_the_keys(foreign_dataset):
    data = LeRobotChunks(LeRobotDataConfig(root=str(foreign_dataset), chunk_size=2))
    assert data.cameras == {"image": "observation.image"}
    assert data[0]["images"]["image"].shape == (3, 96, 96)  # no resize asked


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        (
            {"action_key": "action.joints"},
            ValueError,
            "no action feature 'action.joints'.*dataset.action_key",
        ),
        ({"state_key": "observation.qpos"}, ValueError, "no state feature.*observation.environment_state"),
        (
            {"cameras": {"wrist": "observation.images.wrist"}},
            ValueError,
            "its cameras are.*observation.image",
        ),
    ],
)
def test_missing_features_fail_clearly(foreign_dataset, overrides, error, message):
    with pytest.raises(error, match=message):
        LeRobotChunks(LeRobotDataConfig(root=str(foreign_dataset), **overrides))


def test_bad_config_fails_clearly(tmp_path):
    with pytest.raises(ValueError, match="dataset.root.*dataset.repo_id"):
        LeRobotDataConfig()
    with pytest.raises(ValueError, match="chunk_size"):
        LeRobotDataConfig(root="x", chunk_size=0)
    with pytest.raises(FileNotFoundError, match="not a LeRobot dataset"):
        LeRobotChunks(LeRobotDataConfig(root=str(tmp_path)))


@pytest.mark.parametrize("episodes", [None, [1]])
def test_frame_cache_gives_the_decoded_samples(foreign_dataset, episodes):
    config = dict(root=str(foreign_dataset), chunk_size=5, image_size=48, episodes=episodes)
    plain = LeRobotChunks(LeRobotDataConfig(**config))
    cached = LeRobotChunks(LeRobotDataConfig(**config, cache_frames=True))
    assert cached.cache is not None and len(cached) == len(plain) == (24 if episodes is None else 12)
    assert plain.tasks == (["stack block 0", "stack block 1"] if episodes is None else ["stack block 1"])
    assert cached.cache.nbytes == len(plain) * 3 * 48 * 48
    for index in range(len(plain)):  # every frame, so both episode ends and their padding
        a, b = plain[index], cached[index]
        assert a["task"] == b["task"]
        assert np.allclose(a["images"]["image"], b["images"]["image"], atol=1 / 255 + 1e-6)  # uint8 resize
        for key in ("state", "actions", "actions_is_pad"):
            assert np.array_equal(a[key], b[key]), key


def test_tasks_select_their_episodes(foreign_dataset):
    base = dict(root=str(foreign_dataset), chunk_size=5)
    one = LeRobotChunks(LeRobotDataConfig(**base, tasks=["stack block 1"]))
    assert len(one) == 12 and one.tasks == ["stack block 1"]
    assert one[0]["task"] == "stack block 1" and one[0]["actions"][0, 0] == 100
    with pytest.raises(ValueError, match="hold no episode"):  # episode 0 is stack block 0
        LeRobotChunks(LeRobotDataConfig(**base, tasks=["stack block 1"], episodes=[0]))
    with pytest.raises(ValueError, match=r"\['stack block 9'\] are not tasks.*its tasks are"):
        LeRobotChunks(LeRobotDataConfig(**base, tasks=["stack block 9"]))


def test_several_datasets_train_as_one(foreign_dataset):
    from dvla.data.robot import robot_dataset
    from dvla.processor import ACTION_KEY, STATE_KEY

    base = dict(root=str(foreign_dataset), chunk_size=5, image_size=48)
    whole = LeRobotChunks(LeRobotDataConfig(**base))
    both = robot_dataset([LeRobotDataConfig(**base, episodes=[0]), LeRobotDataConfig(**base, episodes=[1])])
    assert len(both) == len(whole) == 24
    assert both.tasks == ["stack block 0", "stack block 1"]
    assert both[13]["task"] == "stack block 1" and both[13]["actions"][0, 0] == 101
    for key in (STATE_KEY, ACTION_KEY):  # stats over all frames, as if one dataset
        for name, value in whole.stats[key].items():
            np.testing.assert_allclose(both.stats[key][name], value, rtol=1e-9, err_msg=f"{key} {name}")


def test_stats_use_dvla_names_whatever_the_dataset_keys(foreign_dataset):
    from dvla.processor import STATE_KEY

    config = LeRobotDataConfig(root=str(foreign_dataset), state_key="observation.environment_state")
    data = LeRobotChunks(config)
    assert data.stats[STATE_KEY]["q99"].shape == (3,)


def test_datasets_that_do_not_fit_together_are_refused(foreign_dataset):
    from dvla.data.robot import robot_dataset

    base = dict(root=str(foreign_dataset), chunk_size=5, image_size=48)
    other_state = LeRobotDataConfig(**base, state_key="observation.environment_state")
    with pytest.raises(ValueError, match="state dimension 8 vs 3"):
        robot_dataset([LeRobotDataConfig(**base), other_state])
    with pytest.raises(ValueError, match="image_size 48 vs 32"):
        robot_dataset([LeRobotDataConfig(**base), LeRobotDataConfig(**{**base, "image_size": 32})])
