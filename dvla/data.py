"""Training data: LeRobot datasets (robot episodes) and VQA scenes, as samples of one format.

A robot sample:  {"images": {camera: float (3, H, W) in [0, 1]}, "state": (S,), "task": str,
                  "actions": (H_chunk, D), "actions_is_pad": bool (H_chunk,)}
A VQA sample:    {"images": {camera: float (3, H, W)}, "question": str, "answer": str,
                  "question_type": str}
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from dvla.processor import ACTION_KEY, SIM_STATE_KEY, SIM_STATE_MIN_SPAN, STATE_KEY
from dvla.sim.recording import VIDEO_BACKEND

STAT_QUANTILES = {"q01": 0.01, "q99": 0.99}


@dataclass
class LeRobotDataConfig:
    """Which LeRobot dataset to read and how its keys map onto dvla's inputs."""

    # Local dataset folder (offline). Give this or repo_id.
    root: str | None = None
    # Hub dataset id, e.g. lerobot/metaworld_mt50 (downloaded when online; with root, cached there).
    repo_id: str | None = None
    # Camera name -> dataset key, e.g. {corner2: observation.image}. Empty = every camera in the dataset,
    # named by the last part of its key.
    cameras: dict[str, str] = field(default_factory=dict)
    # Dataset key of the robot state.
    state_key: str = "observation.state"
    # Dataset key of the action.
    action_key: str = "action"
    # Dataset key of a simulator state to predict as an auxiliary training target (never a policy
    # input), e.g. sim.state in datasets recorded by `dvla collect`. None = no auxiliary target.
    sim_state_key: str | None = None
    # Action chunk length H: actions t .. t+H-1 (padded past the episode end).
    chunk_size: int = 16
    # Resize images to this square size; None keeps the dataset's size.
    image_size: int | None = None
    # Only these episode indices (None = all).
    episodes: list[int] | None = None
    # Only the episodes of these tasks, named by their instruction as the dataset stores it (meta/tasks),
    # e.g. ["Open a drawer"]; combined with `episodes` when both are set. None = every task.
    tasks: list[str] | None = None
    # Video decoder: pyav works everywhere; torchcodec is faster where system FFmpeg is installed.
    video_backend: str = VIDEO_BACKEND
    # Decode every frame once before training and keep it in RAM as uint8 (frames x cameras x 3 x
    # image_size^2 bytes). Epochs then cost no video decoding: much faster on CPU for small datasets.
    cache_frames: bool = False

    def __post_init__(self):
        if not self.root and not self.repo_id:
            raise ValueError("set dataset.root (a local LeRobot dataset) or dataset.repo_id (a hub id)")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.image_size is not None and self.image_size < 8:
            raise ValueError(f"image_size must be >= 8, got {self.image_size}")


def _load_metadata(config: LeRobotDataConfig):
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

    repo_id = config.repo_id or f"local/{Path(config.root).name}"
    if config.root and not config.repo_id and not (Path(config.root) / "meta" / "info.json").exists():
        raise FileNotFoundError(
            f"{config.root} is not a LeRobot dataset (no meta/info.json). "
            "Record one with `dvla collect`, or set dataset.repo_id to load one from the hub."
        )
    return repo_id, LeRobotDatasetMetadata(repo_id, root=config.root)


def select_episodes(config: LeRobotDataConfig, meta) -> list[int] | None:
    """The episode indices `episodes` and `tasks` select (None = every episode)."""
    if config.tasks is None:
        return config.episodes
    known = set(meta.tasks.index)
    unknown = [task for task in config.tasks if task not in known]
    if unknown:
        raise ValueError(
            f"dataset.tasks {unknown} are not tasks of {config.root or config.repo_id}; "
            f"its tasks are {sorted(known)}. Name them by these instructions."
        )
    wanted = set(config.tasks)
    allowed = None if config.episodes is None else {int(e) for e in config.episodes}
    episodes = [
        int(row["episode_index"])
        for row in meta.episodes
        if wanted & set(row["tasks"]) and (allowed is None or int(row["episode_index"]) in allowed)
    ]
    if not episodes:
        raise ValueError(f"dataset.episodes {config.episodes} hold no episode of the tasks {config.tasks}")
    return sorted(episodes)


def resolve_cameras(config: LeRobotDataConfig, features: dict) -> dict[str, str]:
    """Camera name -> dataset key, checked against the dataset's features."""
    camera_keys = [k for k, v in features.items() if v["dtype"] in ("image", "video")]
    if not config.cameras:
        if not camera_keys:
            raise ValueError("the dataset has no image or video features; dvla needs at least one camera")
        short = [k.split(".")[-1] for k in camera_keys]
        if len(set(short)) < len(short):  # e.g. observation.images.front and observation.depth.front
            return {k: k for k in camera_keys}
        return dict(zip(short, camera_keys, strict=True))
    missing = {name: key for name, key in config.cameras.items() if key not in camera_keys}
    if missing:
        raise ValueError(
            f"camera keys {missing} are not image/video features of the dataset; "
            f"its cameras are {camera_keys}. Fix dataset.cameras."
        )
    return dict(config.cameras)


class LeRobotChunks(torch.utils.data.Dataset):
    """A LeRobot dataset read as (images, state, task, action chunk) samples."""

    def __init__(self, config: LeRobotDataConfig):
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        self.config = config
        repo_id, meta = _load_metadata(config)
        features = meta.features
        roles = [("state", config.state_key), ("action", config.action_key)]
        if config.sim_state_key:
            roles.append(("sim_state", config.sim_state_key))
        for role, key in roles:
            if key not in features:
                fix = f"Set dataset.{role}_key."
                if role == "sim_state":
                    fix += " `dvla collect` records sim.state since it exists; re-record, or drop the key."
                raise ValueError(
                    f"the dataset has no {role} feature {key!r}; its features are {sorted(features)}. {fix}"
                )
        self.cameras = resolve_cameras(config, features)
        self.fps = meta.fps
        self.state_dim = int(np.prod(features[config.state_key]["shape"]))
        self.action_dim = int(np.prod(features[config.action_key]["shape"]))
        sim_key = config.sim_state_key
        self.sim_state_dim = int(np.prod(features[sim_key]["shape"])) if sim_key else 0
        delta = {config.action_key: [i / meta.fps for i in range(config.chunk_size)]}
        selected_episodes = select_episodes(config, meta)
        self.dataset = LeRobotDataset(
            repo_id,
            root=config.root,
            episodes=selected_episodes,
            delta_timestamps=delta,
            video_backend=config.video_backend,
        )
        episodes = selected_episodes if selected_episodes is not None else range(meta.total_episodes)
        # the tasks of the selected episodes, in the dataset's order
        selected = {task for e in episodes for task in meta.episodes[int(e)]["tasks"]}
        self.tasks = [task for task in meta.tasks.index if task in selected]
        self.stats = low_dim_stats(self.dataset, config.state_key, config.action_key, sim_key)
        self.cache = None
        if config.cache_frames:
            from dvla.frame_cache import FrameCache

            self.cache = FrameCache(self, num_workers=min(4, os.cpu_count() or 1))

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        if self.cache is not None:
            return self.cache.sample(index)
        item = self.dataset[index]
        key = self.config.action_key
        sample = {
            "images": {
                name: resize_image(item[k], self.config.image_size) for name, k in self.cameras.items()
            },
            "state": item[self.config.state_key].reshape(-1).float(),  # (S,)
            "task": item["task"],
            "actions": item[key].reshape(self.config.chunk_size, -1).float(),  # (H, D)
            "actions_is_pad": item[f"{key}_is_pad"],  # (H,)
        }
        if self.config.sim_state_key:
            sample["sim_state"] = item[self.config.sim_state_key].reshape(-1).float()  # (E,)
        return sample


def resize_image(image: torch.Tensor, size: int | None) -> torch.Tensor:
    """(3, H, W) float -> (3, size, size); unchanged when size is None or already right."""
    if size is None or image.shape[-2:] == (size, size):
        return image
    return F.interpolate(image[None], size=(size, size), mode="bilinear", antialias=True)[0].clamp(0, 1)


def low_dim_values(dataset, key: str) -> np.ndarray:
    """A low-dimensional feature of every selected frame: (N, D) float64."""
    column = dataset.hf_dataset.select_columns([key]).with_format("numpy")[:][key]
    return np.asarray(column, dtype=np.float64).reshape(len(column), -1)


def stats_of(values: np.ndarray) -> dict[str, np.ndarray]:
    """Exact mean/std/min/max/q01/q99 over the frames of (N, D) values."""
    return {
        "mean": values.mean(0),
        "std": values.std(0),
        "min": values.min(0),
        "max": values.max(0),
        **{name: np.quantile(values, q, axis=0) for name, q in STAT_QUANTILES.items()},
    }


def low_dim_stats(
    dataset, state_key: str, action_key: str, sim_state_key: str | None = None
) -> dict[str, dict[str, np.ndarray]]:
    """Stats of the state and action (and the simulator state, when given) under dvla's names
    (STATE_KEY, ACTION_KEY, SIM_STATE_KEY), whatever the dataset calls them.

    Recomputed from the data rather than read from meta/stats.json: lerobot's stats of a dataset
    merged from parts (as `dvla collect` writes) carry averaged, not exact, quantiles.
    """
    stats = {
        STATE_KEY: stats_of(low_dim_values(dataset, state_key)),
        ACTION_KEY: stats_of(low_dim_values(dataset, action_key)),
    }
    if sim_state_key:
        stats[SIM_STATE_KEY] = sim_state_stats(low_dim_values(dataset, sim_state_key))
    return stats


def sim_state_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """stats_of (N, E) simulator states, with q99 raised to at least q01 + SIM_STATE_MIN_SPAN: the
    checkpoint keeps the widened range, so the target is normalised the same way wherever it is read."""
    stats = stats_of(values)
    stats["q99"] = np.maximum(stats["q99"], stats["q01"] + SIM_STATE_MIN_SPAN)
    return stats


class VQAScenes(torch.utils.data.Dataset):
    """One split of a VQA scenes dataset written by `dvla collect --suite vqa-scenes`."""

    CAMERA = "scene"  # = dvla.policy.VQA_CAMERA

    def __init__(
        self,
        root: str | Path,
        split: str = "train",
        image_size: int | None = None,
        scene_map_grid: int | None = None,
        referent_grid: int | None = None,
    ):
        """`scene_map_grid` adds each scene's map on that grid (`dvla.sim.vqa_scene_map`) as
        "scene_map" (G*G, C), the target of the model's auxiliary scene-map head. `referent_grid`
        adds "referents" (2, 4): cell and place of the two objects a spatial question names
        (`dvla.sim.vqa_scene_map.referent_targets`), the target of the model's referent pointers."""
        import datasets

        root = Path(root)
        if not (root / "dataset_dict.json").exists():
            raise FileNotFoundError(
                f"{root} is not a VQA scenes dataset; create one with "
                "`dvla collect --suite vqa-scenes --root DIR`"
            )
        splits = datasets.load_from_disk(str(root))
        if split not in splits:
            raise ValueError(f"no split {split!r} in {root}; splits: {list(splits)}")
        self.data = splits[split]
        self.image_size = image_size
        self.scene_map_grid = scene_map_grid
        self.referent_grid = referent_grid

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict:
        row = self.data[int(index)]
        referents = self.referents([row["question"]], row)[0] if self.referent_grid else None  # (2, 4)
        image = torch.from_numpy(np.array(row["image"].convert("RGB"))).permute(2, 0, 1).float() / 255
        return {
            "images": {self.CAMERA: resize_image(image, self.image_size)},  # (3, H, W)
            "question": row["question"],
            "answer": row["answer"],
            "question_type": row["question_type"],
            **({"scene_map": self._scene_map(row)} if self.scene_map_grid else {}),
            **({"referents": referents} if referents is not None else {}),
        }

    def _scene_map(self, row: dict) -> torch.Tensor:
        from dvla.sim.vqa_scene_map import scene_map

        return torch.from_numpy(scene_map(_scene_objects(row), self.scene_map_grid))  # (G*G, C)

    def referents(self, questions: list[str], row: dict) -> torch.Tensor:
        """(Q, 2, 4) `referent_targets` of each question about `row`'s scene."""
        from dvla.sim.vqa_scene_map import referent_targets

        objects = _scene_objects(row)
        return torch.from_numpy(
            np.stack([referent_targets(q, objects, self.referent_grid) for q in questions])
        )


def _scene_objects(row: dict) -> list:
    from dvla.sim.vqa_scenes import SceneObject

    return [SceneObject(**o) for o in json.loads(row["objects"])]


TEXT_FIELDS = ("question", "answer", "question_type")  # the per-question fields of a VQA sample


class VQAScenesByImage(torch.utils.data.Dataset):
    """The same questions grouped by scene: item i is one image with all of its questions, so the
    vision encoder reads it once for all of them (`--vqa.images_per_batch`; batch with
    `collate_by_image`)."""

    def __init__(self, questions: VQAScenes, extra_spatial: int = 0, seed: int = 0):
        """`extra_spatial` adds that many more spatial questions to each scene, generated from its
        ground truth (`dvla.sim.vqa_questions`) and fixed by (seed, scene): other object pairs and
        relations of the same image, as a training augmentation; the stored questions stay."""
        if extra_spatial < 0:
            raise ValueError(f"extra_spatial must be >= 0, got {extra_spatial}")
        self.questions = questions
        groups: dict[int, list[int]] = {}
        for row, scene in enumerate(questions.data["scene_id"]):
            groups.setdefault(scene, []).append(row)
        self.rows = list(groups.values())
        self.text = questions.data.select_columns(list(TEXT_FIELDS))
        self.objects = questions.data.select_columns(["objects"])
        self.extra_spatial, self.seed = extra_spatial, seed

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        rows = self.rows[int(index)]
        first = self.questions[rows[0]]  # the image (and scene map) once
        text = self.text[rows]  # question, answer, question_type: lists over its rows
        if self.extra_spatial:
            text = self._add_spatial(int(index), rows[0], text)
        if self.questions.referent_grid:  # (Q, 2, 4): one pair per question, extras included
            first["referents"] = self.questions.referents(text["question"], self.objects[rows[0]])
        return {**first, **text}

    def _add_spatial(self, index: int, row: int, text: dict) -> dict:
        from dvla.sim.vqa_questions import spatial_question

        objects = _scene_objects(self.objects[row])
        rng = np.random.default_rng([self.seed, index])
        text = {k: list(v) for k, v in text.items()}
        asked, added = set(text["question"]), 0
        for _ in range(4 * self.extra_spatial):  # a scene of two objects has few distinct questions
            qa = spatial_question(objects, rng)
            if qa is not None and qa.question not in asked:
                asked.add(qa.question)
                added += 1
                for key, value in zip(TEXT_FIELDS, (qa.question, qa.answer, qa.question_type), strict=True):
                    text[key].append(value)
            if added == self.extra_spatial:
                break
        return text


def collate_by_image(samples: list[dict]) -> dict:
    """VQAScenesByImage items -> one batch: images (I, 3, H, W) once each, the questions of all
    of them flattened (B), and "image_index" (B,), the image row of each question."""
    counts = torch.tensor([len(s["question"]) for s in samples])
    per_question = (*TEXT_FIELDS, "referents")
    out = collate([{k: v for k, v in s.items() if k not in per_question} for s in samples])
    for key in TEXT_FIELDS:
        out[key] = [text for s in samples for text in s[key]]
    if "referents" in samples[0]:
        out["referents"] = torch.cat([s["referents"] for s in samples])  # (B, 2, 4)
    out["image_index"] = torch.repeat_interleave(torch.arange(len(samples)), counts)  # (B,)
    return out


def collate(samples: list[dict]) -> dict:
    """Stack tensors (and dicts of tensors); keep strings as lists."""
    out = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        if isinstance(values[0], dict):
            out[key] = {k: torch.stack([v[k] for v in values]) for k in values[0]}
        elif isinstance(values[0], torch.Tensor):
            out[key] = torch.stack(values)
        else:
            out[key] = values
    return out
