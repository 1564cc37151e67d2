"""Recording MetaWorld episodes into LeRobot datasets through lerobot's own writer API.

A collection is written as *parts*: small LeRobot datasets, each owned by one worker process and
finalized every few episodes. A finished part carries a `part.json` manifest (written last, atomically),
so an interrupted collection keeps every finished part and drops only the one being written. At the
end the parts are merged with lerobot's `aggregate_datasets` into the dataset at `--root`.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dvla.sim.metaworld_env import ACTION_DIM, SIM_STATE_DIM, STATE_DIM

PART_MANIFEST = "part.json"
ROBOT_TYPE = "sawyer"  # MetaWorld's arm; other environments pass their own
# MetaWorld's full 39-D observation (hand, object poses, goal). Deliberately not under "observation.":
# lerobot policies would take it as an input there, and the real env gives policies no such thing.
# dvla can learn to predict it from the cameras, as an auxiliary training target
# (`--dataset.sim_state_key sim.state --model.adapters.sim_state.weight W`).
SIM_STATE_KEY = "sim.state"
# Frames lerobot's streaming video encoder may buffer per camera: more than the longest episode (500).
ENCODER_QUEUE_FRAMES = 1024
# torchcodec needs system FFmpeg libraries and otherwise prints a long traceback before lerobot falls
# back to pyav; dvla asks for pyav directly. Users with FFmpeg installed can pass "torchcodec".
VIDEO_BACKEND = "pyav"


def image_key(camera: str) -> str:
    """LeRobot feature key for a camera (lerobot's multi-camera convention)."""
    return f"observation.images.{camera}"


def metaworld_features(cameras: list[str], image_size: int, use_videos: bool, sim_state: bool = True) -> dict:
    """LeRobot feature spec of a MetaWorld collection (with SIM_STATE_KEY when `sim_state`)."""
    image_dtype = "video" if use_videos else "image"
    features = {
        image_key(c): {
            "dtype": image_dtype,
            "shape": (image_size, image_size, 3),
            "names": ["height", "width", "channels"],
        }
        for c in cameras
    }
    features["observation.state"] = {
        "dtype": "float32",
        "shape": (STATE_DIM,),
        "names": ["hand_x", "hand_y", "hand_z", "gripper"],
    }
    features["action"] = {"dtype": "float32", "shape": (ACTION_DIM,), "names": ["dx", "dy", "dz", "grip"]}
    if sim_state:
        features[SIM_STATE_KEY] = {"dtype": "float32", "shape": (SIM_STATE_DIM,), "names": None}
    features["next.reward"] = {"dtype": "float32", "shape": (1,), "names": None}
    features["next.success"] = {"dtype": "bool", "shape": (1,), "names": None}
    return features


class FrameError(ValueError):
    """A frame that must not be recorded (missing key, wrong shape or dtype, NaN/inf)."""


def validate_frame(frame: dict, features: dict) -> None:
    """Raise FrameError for a frame with a missing key, a wrong shape or dtype, or NaN/inf values."""
    missing = [k for k in features if k not in frame]
    if missing or "task" not in frame:
        raise FrameError(f"frame is missing {missing + ([] if 'task' in frame else ['task'])}")
    extra = [k for k in frame if k not in features and k != "task"]
    if extra:
        raise FrameError(f"frame has keys not in the dataset features: {extra}")
    if not isinstance(frame["task"], str) or not frame["task"]:
        raise FrameError(f"frame task must be a non-empty string, got {frame['task']!r}")
    for key, spec in features.items():
        value = frame[key]
        if not isinstance(value, np.ndarray):
            raise FrameError(f"frame[{key!r}] must be a numpy array, got {type(value).__name__}")
        if value.shape != tuple(spec["shape"]):
            raise FrameError(f"frame[{key!r}] has shape {value.shape}, expected {tuple(spec['shape'])}")
        if spec["dtype"] in ("image", "video"):
            if value.dtype != np.uint8:
                raise FrameError(f"frame[{key!r}] must be uint8 (H, W, 3), got {value.dtype}")
            continue
        if value.dtype != np.dtype(spec["dtype"]):
            raise FrameError(f"frame[{key!r}] has dtype {value.dtype}, expected {spec['dtype']}")
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            raise FrameError(f"frame[{key!r}] contains NaN or inf: {value}; the episode is not recorded")


@dataclass
class EpisodeRecord:
    """One recorded episode, as listed in a part manifest."""

    task: str
    seed: int
    length: int


def write_json_atomic(path: Path, payload: dict | list) -> None:
    """Write JSON so that a crash leaves either the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=2))
    os.replace(tmp, path)


class PartWriter:
    """Appends episodes to one part dataset; `commit()` finalizes it and writes its manifest."""

    def __init__(self, path: Path, features: dict, fps: int, use_videos: bool, robot_type: str = ROBOT_TYPE):
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        self.path = path
        self.features = features
        self.episodes: list[EpisodeRecord] = []
        self._dataset = LeRobotDataset.create(
            repo_id=f"local/{path.name}",
            fps=fps,
            features=features,
            root=path,
            robot_type=robot_type,
            use_videos=use_videos,
            video_backend=VIDEO_BACKEND,
            # Encode each camera stream while frames arrive (2x faster than writing PNGs, then encoding).
            streaming_encoding=use_videos,
            # lerobot's streaming encoder is made for live capture: when its queue is full it drops the
            # frame (a warning, no error). We add a whole episode at once, so the queue holds one.
            encoder_queue_maxsize=ENCODER_QUEUE_FRAMES,
        )

    def add_episode(self, frames: list[dict], task: str, seed: int) -> None:
        """Validate every frame (FrameError leaves the part unchanged), then write the episode."""
        for frame in frames:
            validate_frame(frame, self.features)
        for frame in frames:
            self._dataset.add_frame(frame)
        # One encoder per camera in this process: a process pool per episode costs more than it saves.
        self._dataset.save_episode(parallel_encoding=False)
        self.episodes.append(EpisodeRecord(task, seed, len(frames)))

    def commit(self) -> None:
        """Finalize the part (parquet footers, metadata) and mark it finished; drop it if empty."""
        if not self.episodes:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        self._dataset.finalize()
        check_video_frames(self.path)  # before the manifest: a bad part stays unfinished, re-recorded
        write_json_atomic(self.path / PART_MANIFEST, [vars(e) for e in self.episodes])


def check_video_frames(root: Path) -> None:
    """Every camera's videos must hold exactly one frame per dataset frame; raise if not."""
    import av

    info = json.loads((root / "meta" / "info.json").read_text())
    for key, feature in info["features"].items():
        if feature["dtype"] != "video":
            continue
        count = 0
        for path in sorted((root / "videos" / key).rglob("*.mp4")):
            with av.open(str(path)) as container:
                stream = container.streams.video[0]
                count += stream.frames or sum(1 for _ in container.decode(stream))
        if count != info["total_frames"]:
            raise RuntimeError(
                f"{root}: the {key} videos hold {count} frames for {info['total_frames']} dataset frames "
                "(the video encoder dropped frames); the part is left unfinished and is recorded again "
                "on --resume"
            )


def finished_parts(parts_dir: Path) -> list[tuple[Path, list[EpisodeRecord]]]:
    """Finished parts (those with a manifest) and their episodes, sorted by name."""
    found = []
    for manifest in sorted(parts_dir.glob(f"*/{PART_MANIFEST}")):
        found.append((manifest.parent, [EpisodeRecord(**e) for e in json.loads(manifest.read_text())]))
    return found


def drop_unfinished_parts(parts_dir: Path) -> int:
    """Delete parts cut off while being written (their episodes are recorded again); return how many."""
    unfinished = [p for p in parts_dir.iterdir() if p.is_dir() and not (p / PART_MANIFEST).exists()]
    for path in unfinished:
        shutil.rmtree(path)
    return len(unfinished)


def merge_parts(parts: list[Path], out: Path) -> None:
    """Merge finished parts into one LeRobot dataset at `out` (which must not exist)."""
    from lerobot.datasets.aggregate import aggregate_datasets

    aggregate_datasets(
        repo_ids=[f"local/{p.name}" for p in parts],
        aggr_repo_id=f"local/{out.name}",
        roots=list(parts),
        aggr_root=out,
    )
    check_video_frames(out)
