"""VQA scenes (`dvla collect --suite vqa-scenes`) read as question samples:

{"images": {"scene": float (3, H, W)}, "question": str, "answer": str, "question_type": str}
plus the targets adapters ask for ("scene_map", "referents"; built by `dvla.sim.vqa_targets`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from dvla.data.images import collate, resize_image
from dvla.types import VQA_CAMERA


class VQAScenes(torch.utils.data.Dataset):
    """One split of a VQA scenes dataset written by `dvla collect --suite vqa-scenes`."""

    CAMERA = VQA_CAMERA

    def __init__(
        self,
        root: str | Path,
        split: str = "train",
        image_size: int | None = None,
        targets: dict[str, dict] | None = None,
    ):
        """`targets` are what the model's adapters train on, {name: options}
        (`DiffusionVLA.data_targets()`): "scene_map" {"grid": G} adds each scene's map (G*G, C);
        "referents" {"grid": G} adds the cell and place of the two objects a spatial question
        names (2, 4). Both come from the scene's ground truth (`dvla.sim.vqa_targets`)."""
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
        self.root, self.split, self.data = root, split, splits[split]
        self.image_size = image_size
        self.targets = dict(targets or {})
        unknown = set(self.targets) - set(TARGETS)
        if unknown:
            raise ValueError(
                f"VQA scenes have no target(s) {sorted(unknown)}; they provide {sorted(TARGETS)}"
            )

    def with_targets(self, targets: dict[str, dict]) -> VQAScenes:
        """The same split, providing `targets` too."""
        return VQAScenes(self.root, self.split, self.image_size, targets)

    @staticmethod
    def facts() -> dict:
        """What the data tells adapters' configs (`fit`): the scene map's channel counts."""
        from dvla.sim.vqa_targets import CHANNELS, POSITION_CHANNELS

        return {"scene_map_channels": len(CHANNELS), "scene_map_position_channels": len(POSITION_CHANNELS)}

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict:
        row = self.data[int(index)]
        image = torch.from_numpy(np.array(row["image"].convert("RGB"))).permute(2, 0, 1).float() / 255
        sample = {
            "images": {self.CAMERA: resize_image(image, self.image_size)},  # (3, H, W)
            "question": row["question"],
            "answer": row["answer"],
            "question_type": row["question_type"],
        }
        if "scene_map" in self.targets:
            sample["scene_map"] = self.scene_map(row)
        if "referents" in self.targets:
            sample["referents"] = self.referents([row["question"]], row)[0]  # (2, 4)
        return sample

    def scene_map(self, row: dict) -> torch.Tensor:
        """(G*G, C) the scene map of `row`'s scene."""
        from dvla.sim.vqa_targets import scene_map

        return torch.from_numpy(scene_map(_scene_objects(row), self.targets["scene_map"]["grid"]))

    def referents(self, questions: list[str], row: dict) -> torch.Tensor:
        """(Q, 2, 4) `referent_targets` of each question about `row`'s scene."""
        from dvla.sim.vqa_targets import referent_targets

        objects, grid = _scene_objects(row), self.targets["referents"]["grid"]
        return torch.from_numpy(np.stack([referent_targets(q, objects, grid) for q in questions]))


TARGETS = ("scene_map", "referents")  # the adapters' targets VQA scenes can provide


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
        if "referents" in self.questions.targets:  # (Q, 2, 4): one pair per question, extras included
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
