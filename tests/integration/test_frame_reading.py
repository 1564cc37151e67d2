"""dvla reads samples without lerobot's per-item path, and must give what that path gives: the same
action chunks and padding as `delta_timestamps`, the same images as `LeRobotDataset.__getitem__`
(video and image features; cached frames are resized in uint8, within one level)."""

import itertools

import numpy as np
import pytest
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata

from dvla.data import LeRobotChunks, LeRobotDataConfig
from dvla.data.frames import FrameReader
from dvla.data.images import keep_aspect, resize_image
from dvla.sim.recording import VIDEO_BACKEND

CHUNK = 6


def _reference(root, chunk: int, episodes=None) -> LeRobotDataset:
    """lerobot's own reading: every image feature decoded, the chunk through delta_timestamps."""
    meta = LeRobotDatasetMetadata(f"local/{root.name}", root=root)
    delta = {"action": [i / meta.fps for i in range(chunk)]}
    return LeRobotDataset(f"local/{root.name}", root=root, episodes=episodes, delta_timestamps=delta,
                          video_backend=VIDEO_BACKEND)  # fmt: skip


def _assert_same_samples(ours: LeRobotChunks, reference: LeRobotDataset, height, atol: float) -> None:
    """Every sample equal to lerobot's, its images resized to `height` with their aspect ratio."""
    assert len(ours) == len(reference)
    for index in range(len(ours)):  # every row, so every episode end and its padding
        mine, theirs = ours[index], reference[index]
        assert mine["task"] == theirs["task"]
        assert torch.equal(mine["state"], theirs["observation.state"].float())
        assert torch.equal(mine["actions"], theirs["action"].float())
        assert torch.equal(mine["actions_is_pad"], theirs["action_is_pad"])
        for name, key in ours.cameras.items():
            expected = resize_image(theirs[key], keep_aspect(theirs[key].shape[-2:], height))
            assert mine["images"][name].shape == expected.shape
            assert torch.allclose(mine["images"][name], expected, atol=atol), (index, name)


@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("episodes", [None, [1, 3]])
def test_video_samples_equal_lerobots(tiny_dataset, cache, episodes):
    root, _ = tiny_dataset
    config = LeRobotDataConfig(root=str(root), chunk_size=CHUNK, image_size=48, episodes=episodes,
                               cache_frames=cache)  # fmt: skip
    ours = LeRobotChunks(config)
    assert set(ours.frames.video) == {"corner2", "gripperPOV"}
    _assert_same_samples(ours, _reference(root, CHUNK, episodes), 48, atol=1 / 255 + 1e-6 if cache else 1e-6)


@pytest.fixture(scope="module")
def image_dataset(tmp_path_factory):
    """PNG image features (two cameras, one of them never asked for), 3 short episodes."""
    root = tmp_path_factory.mktemp("images") / "pngs"
    image = {"dtype": "image", "shape": (30, 40, 3), "names": ["height", "width", "channels"]}
    features = {
        "observation.images.top": image,
        "observation.images.wrist": image,
        "observation.state": {"dtype": "float32", "shape": (14,), "names": None},
        "action": {"dtype": "float32", "shape": (14,), "names": None},
    }
    data = LeRobotDataset.create("lab/pngs", fps=50, features=features, root=root, use_videos=False)
    rng = np.random.default_rng(0)
    for episode, length in enumerate((9, 4, 7)):
        for _ in range(length):
            data.add_frame(
                {
                    "observation.images.top": rng.integers(0, 255, (30, 40, 3), dtype=np.uint8),
                    "observation.images.wrist": rng.integers(0, 255, (30, 40, 3), dtype=np.uint8),
                    "observation.state": rng.normal(size=14).astype(np.float32),
                    "action": rng.normal(size=14).astype(np.float32),
                    "task": f"task {episode % 2}",
                }
            )
        data.save_episode()
    data.finalize()
    return root


@pytest.mark.parametrize("cache", [False, True])
def test_image_feature_samples_equal_lerobots(image_dataset, cache):
    config = LeRobotDataConfig(root=str(image_dataset), cameras={"top": "observation.images.top"},
                               chunk_size=CHUNK, image_size=24, cache_frames=cache)  # fmt: skip
    ours = LeRobotChunks(config)
    assert ours.frames.image == {"top": "observation.images.top"} and not ours.frames.video
    _assert_same_samples(ours, _reference(image_dataset, CHUNK), 24, atol=1 / 255 + 1e-6 if cache else 1e-6)


def test_only_the_chosen_cameras_are_decoded(image_dataset):
    ours = LeRobotChunks(
        LeRobotDataConfig(root=str(image_dataset), cameras={"top": "observation.images.top"})
    )
    assert list(ours.frames._images.column_names) == ["observation.images.top"]
    assert set(ours[0]["images"]) == {"top"}


def test_video_windows_cover_each_episode_in_order(tiny_dataset):
    root, _ = tiny_dataset
    ours = LeRobotChunks(LeRobotDataConfig(root=str(root), chunk_size=2))
    reader: FrameReader = ours.frames
    windows = reader.windows(length=16)
    assert windows[0][0] == 0 and windows[-1][1] == len(ours)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(windows))  # contiguous
    for start, stop in windows:
        assert 0 < stop - start <= 16 and len(set(ours.table.episode_index[start:stop])) == 1
    with pytest.raises(ValueError, match="more than one episode"):
        first_end = ours.table.episode_ranges()[0][1]
        reader.window(first_end, first_end + 2)
