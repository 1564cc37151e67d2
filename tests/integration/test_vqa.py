"""VQA scenes: every generated answer is checked against the scene's ground truth and the image."""

import json
import re

import numpy as np
import pytest
import torch

from dvla.data import VQAScenes, VQAScenesByImage, collate, collate_by_image
from dvla.sim.vqa_dataset import HELD_OUT, build_vqa_dataset
from dvla.sim.vqa_questions import NUMBER_WORDS, QUESTION_TYPES, generate_questions
from dvla.sim.vqa_scenes import (
    COLORS,
    SHAPES,
    SIZES,
    SceneObject,
    SceneRenderer,
    camera_view,
    sample_scene,
)
from dvla.sim.vqa_targets import CHANNELS, DEPTH_RANGE, POSITION_CHANNELS, scene_map

WORDS = set(COLORS) | set(SHAPES) | set(SIZES)


@pytest.fixture(scope="module")
def renderer():
    renderer = SceneRenderer(128)
    yield renderer
    renderer.close()


def _find(description: str, objects: list[SceneObject]) -> list[SceneObject]:
    """Objects matching a description such as "large red cube" or "blue object"."""
    words = [w for w in description.split() if w in WORDS]
    return [o for o in objects if all(w in (o.color, o.shape, o.size) for w in words)]


def _oracle(question: str, objects: list[SceneObject], renderer: SceneRenderer) -> str:
    """An independent answerer that reads the question text and the scene state; spatial relations
    come from MuJoCo's own camera (pixel columns and depth)."""
    q = question.lower().rstrip("?.")
    if m := re.search(r"(?:how many|count the|number of) (.+?)(?: are there| in the scene|$)", q):
        noun = m.group(1)
        if noun == "objects":
            return NUMBER_WORDS[len(objects)]
        words = noun.replace(" objects", "").split()
        shape = words[-1][:-1] if words[-1][:-1] in SHAPES else None
        n = sum(o.shape == shape if shape else o.color == words[0] for o in objects)
        return NUMBER_WORDS[n]
    if "color" in q:
        ref = re.sub(r"^(what color is the|which color does the|the) ", "", q)
        (obj,) = _find(re.sub(r" (have|is what color)$", "", ref), objects)
        return obj.color
    if "shape" in q:
        (obj,) = _find(q.split(" the ")[-1], objects)
        return obj.shape
    if m := re.search(r"(?:is there a|contain a) (\w+) (\w+)", q):
        return "yes" if any(o.color == m.group(1) and o.shape == m.group(2) for o in objects) else "no"
    m = re.search(r"the (.+?) (?:located |sit )?(left of|right of|in front of|behind) the (.+)", q)
    (a,), (b,) = _find(m.group(1), objects), _find(m.group(3), objects)
    col_a, _, depth_a = renderer.project(a.x, a.y, SIZES[a.size])
    col_b, _, depth_b = renderer.project(b.x, b.y, SIZES[b.size])
    relation = {"left of": (0, -1), "right of": (0, 1), "in front of": (1, -1), "behind": (1, 1)}
    axis, sign = relation[m.group(2)]
    delta = sign * (col_a - col_b, depth_a - depth_b)[axis]
    assert abs(delta) > (5.0 if axis == 0 else 0.03), "an ambiguous relation was asked"
    return "yes" if delta > 0 else "no"


def test_every_answer_matches_the_scene_state(renderer):
    rng = np.random.default_rng(0)
    seen = {t: 0 for t in QUESTION_TYPES}
    answers = {t: set() for t in QUESTION_TYPES}
    for _ in range(300):
        objects = sample_scene(rng)
        for qa in generate_questions(objects, rng):
            assert _oracle(qa.question, objects, renderer) == qa.answer, (qa, objects)
            seen[qa.question_type] += 1
            answers[qa.question_type].add(qa.answer)
    assert min(seen.values()) > 100  # every type is asked often
    assert answers["exist"] == answers["spatial"] == {"yes", "no"}
    assert answers["color"] == set(COLORS) and answers["shape"] == set(SHAPES)


def test_questions_have_several_phrasings():
    rng = np.random.default_rng(1)
    content = WORDS | {"object", "objects", "cubes", "spheres", "cylinders"}
    templates = {t: set() for t in QUESTION_TYPES}
    for _ in range(200):
        for qa in generate_questions(sample_scene(rng), rng):
            words = qa.question.rstrip("?.").split()
            templates[qa.question_type].add(" ".join(w for w in words if w not in content))
    assert all(len(s) >= 3 for s in templates.values()), templates


def test_scenes_are_valid():
    rng = np.random.default_rng(2)
    for _ in range(200):
        objects = sample_scene(rng, forbidden=HELD_OUT)
        assert 2 <= len(objects) <= 6
        assert not {(o.color, o.shape) for o in objects} & HELD_OUT
        for i, a in enumerate(objects):
            for b in objects[i + 1 :]:
                assert np.hypot(a.x - b.x, a.y - b.y) > a.radius + b.radius
    objects = sample_scene(rng, required=HELD_OUT)
    assert {(o.color, o.shape) for o in objects} & HELD_OUT


def test_geometric_camera_model_matches_mujoco(renderer):
    f = 64 / np.tan(np.deg2rad(45) / 2)
    for x, y, z in [(0, 0, 0), (0.25, -0.2, 0.05), (-0.28, 0.2, 0.03)]:
        u, v, depth = camera_view(x, y, z)
        col, row, mj_depth = renderer.project(x, y, z)
        np.testing.assert_allclose([64 + f * u, 64 - f * v, depth], [col, row, mj_depth], atol=1e-6)


def test_rendered_image_shows_each_object_where_the_metadata_says(renderer):
    """At each object's projected centre the image has that object's colour (by hue direction)."""
    palette = {c: np.array(v) for c, v in COLORS.items() if c != "white"}
    rng = np.random.default_rng(3)
    for _ in range(5):
        objects = sample_scene(rng)
        image = renderer.render(objects).astype(float)
        for obj in objects:
            col, row, _ = renderer.project(obj.x, obj.y, SIZES[obj.size])
            pixel = image[int(row) - 1 : int(row) + 2, int(col) - 1 : int(col) + 2].reshape(-1, 3).mean(0)
            if obj.color == "white":  # white is told apart by brightness, not hue
                assert pixel.min() > 100, (obj, pixel)
                continue
            cosine = {c: pixel @ v / (np.linalg.norm(pixel) * np.linalg.norm(v)) for c, v in palette.items()}
            assert max(cosine, key=cosine.get) == obj.color, (obj, pixel)


def test_scene_map_marks_each_object_in_the_cell_mujoco_shows_it_in(renderer):
    """The map's cells hold exactly the attributes of the objects whose centres MuJoCo's camera
    projects into them (rows top to bottom, columns left to right, like the encoder's tokens), and
    their positions: MuJoCo's pixel column and row and depth, in cells; NaN for absent pairs."""
    rng = np.random.default_rng(4)
    near, far = DEPTH_RANGE
    for grid in (4, 8):
        for _ in range(5):
            objects = sample_scene(rng)
            expected = [set() for _ in range(grid * grid)]
            places = {}
            for o in objects:
                col, row, depth = renderer.project(o.x, o.y, SIZES[o.size])
                cell = int(row * grid / 128) * grid + int(col * grid / 128)
                names = (f"color={o.color}", f"shape={o.shape}", f"size={o.size}", f"{o.color} {o.shape}")
                expected[cell] |= set(names)
                places[cell, f"{o.color} {o.shape}"] = (
                    col * grid / 128,
                    row * grid / 128,
                    (depth - near) / (far - near) * grid,
                )
            found = scene_map(objects, grid)  # (G*G, C + P)
            assert found.shape == (grid * grid, 37 + 72) and len(CHANNELS) + len(POSITION_CHANNELS) == 109
            hot, positions = found[:, :37], found[:, 37:].reshape(grid * grid, 24, 3)
            assert [{CHANNELS[i] for i in np.flatnonzero(cell)} for cell in hot] == expected
            assert np.isfinite(positions).all(-1).sum() == len(places)  # a (cell, pair) per object
            for (cell, pair), place in places.items():
                k = POSITION_CHANNELS.index(f"{pair} column") // 3
                np.testing.assert_allclose(positions[cell, k], place, atol=1e-3 * grid)
                assert 0 <= place[2] <= grid  # depth within the table's range


def test_built_dataset_splits_and_loading(tmp_path, renderer):
    root = tmp_path / "vqa"
    report = build_vqa_dataset(root, scenes=20, image_size=48, seed=0)
    assert report["split_scenes"] == {"train": 16, "val": 2, "test": 2, "compositional": 2}
    import datasets

    dd = datasets.load_from_disk(str(root))
    assert set(dd) == {"train", "val", "test", "compositional"}
    held_out = {" ".join(p) for p in HELD_OUT}
    for split in ("train", "val", "test"):
        for objs in dd[split]["objects"]:
            assert not {f"{o['color']} {o['shape']}" for o in json.loads(objs)} & held_out
    for objs in dd["compositional"]["objects"]:
        assert {f"{o['color']} {o['shape']}" for o in json.loads(objs)} & held_out
    for row in dd["test"]:
        objects = [SceneObject(**o) for o in json.loads(row["objects"])]
        assert _oracle(row["question"], objects, renderer) == row["answer"]
    for split in ("train", "val", "test"):  # no i.i.d. question names a held-out pair either
        assert not any(pair in q for q in dd[split]["question"] for pair in held_out)

    data = VQAScenes(root, "test", image_size=32)
    batch = collate([data[0], data[1]])
    assert batch["images"]["scene"].shape == (2, 3, 32, 32)
    assert isinstance(batch["question"][0], str) and batch["question_type"][0] in QUESTION_TYPES
    assert "scene_map" not in batch
    grouped = VQAScenesByImage(VQAScenes(root, "train", image_size=32))
    assert len(grouped) == 16 and sum(len(r) for r in grouped.rows) == len(dd["train"])
    two = collate_by_image([grouped[0], grouped[1]])
    assert two["images"]["scene"].shape == (2, 3, 32, 32)
    rows = grouped.rows[0] + grouped.rows[1]
    assert two["question"] == dd["train"][rows]["question"] and two["answer"] == dd["train"][rows]["answer"]
    assert len(set(dd["train"][grouped.rows[0]]["scene_id"])) == 1  # one scene per item
    plain = VQAScenes(root, "train", image_size=32)
    for j, i in enumerate(two["image_index"].tolist()):  # each question points at its own scene's image
        assert torch.equal(two["images"]["scene"][i], plain[rows[j]]["images"]["scene"])
    extra = VQAScenesByImage(VQAScenes(root, "train", image_size=32), extra_spatial=3, seed=5)
    for i in range(4):  # the stored questions first, then up to 3 new spatial ones, all correct
        item, stored = extra[i], dd["train"][grouped.rows[i]]
        n = len(stored["question"])
        assert item["question"][:n] == stored["question"] and item["answer"][:n] == stored["answer"]
        added = list(zip(item["question"][n:], item["answer"][n:], item["question_type"][n:], strict=True))
        assert 1 <= len(added) <= 3 and len(set(item["question"])) == len(item["question"])
        objects = [SceneObject(**o) for o in json.loads(stored["objects"][0])]
        for question, answer, kind in added:
            assert kind == "spatial" and _oracle(question, objects, renderer) == answer
        assert extra[i]["question"] == item["question"]  # fixed per (seed, scene)
    assert collate_by_image([extra[0], extra[1]])["image_index"].shape == (
        len(extra[0]["question"]) + len(extra[1]["question"]),
    )
    with pytest.raises(ValueError, match="extra_spatial"):
        VQAScenesByImage(plain, extra_spatial=-1)
    mapped = VQAScenes(root, "test", image_size=32, targets={"scene_map": {"grid": 4}})
    objects = [SceneObject(**o) for o in json.loads(dd["test"][1]["objects"])]
    np.testing.assert_array_equal(mapped[1]["scene_map"].numpy(), scene_map(objects, 4))
    _check_referents(root, dd, renderer)

    # deterministic: the same seed builds the same questions
    again = build_vqa_dataset(tmp_path / "vqa2", scenes=20, image_size=48, seed=0)
    assert again["split_questions"] == report["split_questions"]
    assert datasets.load_from_disk(str(tmp_path / "vqa2"))["train"]["question"] == dd["train"]["question"]


def _check_referents(root, dd, renderer):
    """Each spatial question's two cells and places are where MuJoCo's camera shows the objects it
    names, in the order it names them; other questions get -1; grouped batches carry one pair per
    question."""
    pointed = VQAScenes(root, "train", image_size=32, targets={"referents": {"grid": 4}})
    spatial = 0
    for i, row in enumerate(dd["train"]):
        targets = pointed[i]["referents"]  # (2, 4)
        if row["question_type"] != "spatial":
            assert targets[:, 0].tolist() == [-1, -1] and targets[:, 1:].isnan().all()
            continue
        spatial += 1
        objects = [SceneObject(**o) for o in json.loads(row["objects"])]
        m = re.search(
            r"the (.+?) (?:located |sit )?(?:left of|right of|in front of|behind) the (.+)\?", row["question"]
        )
        for name, target in zip(m.groups(), targets.tolist(), strict=True):
            (obj,) = _find(name, objects)
            col, row_px, _ = renderer.project(obj.x, obj.y, SIZES[obj.size])
            assert target[0] == int(row_px * 4 / 128) * 4 + int(col * 4 / 128)
            np.testing.assert_allclose(target[1:3], (col * 4 / 128, row_px * 4 / 128), atol=4e-3)
    assert spatial > 5
    grouped = VQAScenesByImage(pointed, extra_spatial=2, seed=1)
    batch = collate_by_image([grouped[0], grouped[1]])
    assert batch["referents"].shape == (len(batch["question"]), 2, 4)
    kinds = torch.tensor([t == "spatial" for t in batch["question_type"]])
    assert torch.equal(batch["referents"][:, 0, 0] >= 0, kinds)


def test_vqa_errors(tmp_path):
    with pytest.raises(ValueError, match=">= 3"):
        build_vqa_dataset(tmp_path / "a", scenes=2)
    with pytest.raises(FileNotFoundError, match="not a VQA scenes dataset"):
        VQAScenes(tmp_path)
    root = tmp_path / "b"
    build_vqa_dataset(root, scenes=3, image_size=32)
    with pytest.raises(FileExistsError):
        build_vqa_dataset(root, scenes=3, image_size=32)
    with pytest.raises(ValueError, match="other settings"):
        build_vqa_dataset(root, scenes=4, image_size=32, resume=True)
    with pytest.raises(ValueError, match="no split"):
        VQAScenes(root, "dev")
    with pytest.raises(ValueError, match="no target"):
        VQAScenes(root, "train", targets={"keypoints": {}})
