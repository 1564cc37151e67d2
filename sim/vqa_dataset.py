"""Build the VQA scenes dataset: rendered scenes + generated questions, saved as a `datasets` DatasetDict.

Splits: train / val / test are drawn i.i.d. from scenes that never contain the held-out colour-shape
pairs; `compositional` scenes each contain at least one held-out pair (never seen in training).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from dvla.sim.collect import prepare_root
from dvla.sim.recording import write_json_atomic
from dvla.sim.vqa_questions import QUESTION_TYPES, generate_questions
from dvla.sim.vqa_scenes import SceneRenderer, sample_scene, scene_to_dict

# (color, shape) pairs that never appear in train/val/test scenes: one per colour for six colours,
# covering every shape twice, so each held-out word is seen in training in other combinations.
HELD_OUT = frozenset(
    {
        ("red", "sphere"),
        ("green", "cylinder"),
        ("blue", "cube"),
        ("yellow", "sphere"),
        ("purple", "cylinder"),
        ("orange", "cube"),
    }
)
SPLITS = ("train", "val", "test", "compositional")
SPLIT_FRACTIONS = {"train": 0.8, "val": 0.1, "test": 0.1}
REPORT_FILE = "vqa_report.json"
BUILDING_MARKER = ".dvla_vqa_building"  # present from the first write until the report is written


def split_sizes(scenes: int, compositional_fraction: float = 0.1) -> dict[str, int]:
    """Number of scenes per split for `scenes` i.i.d. scenes (+ a compositional split)."""
    if scenes < 3:
        raise ValueError(f"--scenes must be >= 3 (train, val and test need one scene each), got {scenes}")
    val = max(1, round(scenes * SPLIT_FRACTIONS["val"]))
    test = max(1, round(scenes * SPLIT_FRACTIONS["test"]))
    return {
        "train": scenes - val - test,
        "val": val,
        "test": test,
        "compositional": max(1, round(scenes * compositional_fraction)),
    }


def generate_split(renderer: SceneRenderer, split: str, n_scenes: int, seed: int, bar) -> dict[str, list]:
    """Rows (one per question) of one split; deterministic in (seed, split)."""
    rng = np.random.default_rng([seed, SPLITS.index(split)])
    compositional = split == "compositional"
    rows = {k: [] for k in ("image", "question", "answer", "question_type", "scene_id", "objects")}
    for i in range(n_scenes):
        objects = sample_scene(
            rng,
            forbidden=frozenset() if compositional else HELD_OUT,
            required=HELD_OUT if compositional else frozenset(),
        )
        image = renderer.render(objects)
        # exist questions about absent objects never name a held-out pair outside the compositional split
        for qa in generate_questions(objects, rng, forbidden=frozenset() if compositional else HELD_OUT):
            rows["image"].append(image)
            rows["question"].append(qa.question)
            rows["answer"].append(qa.answer)
            rows["question_type"].append(qa.question_type)
            rows["scene_id"].append(f"{split}-{i:06d}")
            rows["objects"].append(json.dumps(scene_to_dict(objects)))
        bar.update(1)
    return rows


def build_vqa_dataset(
    root: Path,
    scenes: int = 1000,
    image_size: int = 128,
    seed: int = 0,
    resume: bool = False,
    overwrite: bool = False,
) -> dict:
    """Render the scenes, generate questions and save the DatasetDict at `root`.

    Generation is deterministic in `seed`; an interrupted build is simply built again on --resume.
    """
    import datasets

    root = Path(root)
    sizes = split_sizes(scenes)
    resumed = prepare_root(root, resume, overwrite)
    if resumed and (root / REPORT_FILE).exists():
        report = json.loads((root / REPORT_FILE).read_text())
        if report["scenes"] != scenes or report["image_size"] != image_size or report["seed"] != seed:
            raise ValueError(f"{root} holds a finished VQA dataset with other settings; use --overwrite")
        print(f"{root} is already complete; nothing to do.")
        return report
    if resumed:
        if not (root / BUILDING_MARKER).exists():
            raise FileExistsError(
                f"{root} is not an unfinished VQA scenes build; use --overwrite or another --root"
            )
        shutil.rmtree(root)  # an unfinished build: nothing in it is trusted, build it again
    root.mkdir(parents=True, exist_ok=True)
    (root / BUILDING_MARKER).touch()

    start = time.perf_counter()
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "question": datasets.Value("string"),
            "answer": datasets.Value("string"),
            "question_type": datasets.Value("string"),
            "scene_id": datasets.Value("string"),
            "objects": datasets.Value("string"),
        }
    )
    renderer = SceneRenderer(image_size)
    splits = {}
    try:
        with tqdm(total=sum(sizes.values()), desc="vqa scenes", unit="scene") as bar:
            for split, n in sizes.items():
                rows = generate_split(renderer, split, n, seed, bar)
                splits[split] = datasets.Dataset.from_dict(rows, features=features)
    finally:
        renderer.close()
    datasets.DatasetDict(splits).save_to_disk(str(root))
    report = {
        "scenes": scenes,
        "image_size": image_size,
        "seed": seed,
        "split_scenes": sizes,
        "split_questions": {split: len(ds) for split, ds in splits.items()},
        "questions_per_type": {
            split: {t: ds["question_type"].count(t) for t in QUESTION_TYPES} for split, ds in splits.items()
        },
        "held_out_pairs": sorted(" ".join(p) for p in HELD_OUT),
        "elapsed_s": time.perf_counter() - start,
    }
    write_json_atomic(root / REPORT_FILE, report)  # written last: marks the dataset complete
    (root / BUILDING_MARKER).unlink()
    return report
