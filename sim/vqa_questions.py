"""Questions and answers generated from a scene's ground truth (never hand-labelled).

Question types: count, color, shape, exist (yes/no), spatial (left/right/front/behind as seen from the
camera). Objects are referred to by the shortest description that is unique in the scene.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dvla.sim.vqa_scenes import COLORS, SHAPES, SceneObject, object_view

QUESTION_TYPES = ("count", "color", "shape", "exist", "spatial")
# Relations closer than these are ambiguous and never asked: image-plane offset (tan units, ~12 px at
# 128 px) for left/right, metres of depth for in front of/behind.
LATERAL_MARGIN = 0.08
DEPTH_MARGIN = 0.06
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six")

_COUNT = ("How many {noun} are there?", "Count the {noun}.", "What is the number of {noun} in the scene?")
_COLOR = ("What color is the {ref}?", "Which color does the {ref} have?", "The {ref} is what color?")
_SHAPE = ("What shape is the {ref}?", "What is the shape of the {ref}?", "Which shape is the {ref}?")
_EXIST = ("Is there a {desc}?", "Is there a {desc} in the scene?", "Does the scene contain a {desc}?")
_SPATIAL = (
    "Is the {a} {rel} the {b}?",
    "Is the {a} located {rel} the {b}?",
    "Does the {a} sit {rel} the {b}?",
)
RELATIONS = {"left": "left of", "right": "right of", "front": "in front of", "behind": "behind"}


@dataclass(frozen=True)
class QA:
    question: str
    answer: str
    question_type: str


def _plural(shape: str) -> str:
    return shape + "s"


_REFERENCE_KEYS = {
    None: (("shape",), ("color", "shape"), ("size", "color", "shape")),
    "color": (("shape",), ("size", "shape")),
    "shape": (("color",), ("size", "color")),
}


def reference(obj: SceneObject, objects: list[SceneObject], omit: str | None = None) -> str | None:
    """Shortest unique description of `obj` ("cube", "red cube", "large red cube"), or None.

    `omit` ("color" or "shape") leaves that attribute out, for questions asking about it.
    """
    for key in _REFERENCE_KEYS[omit]:
        matches = [o for o in objects if all(getattr(o, k) == getattr(obj, k) for k in key)]
        if len(matches) == 1:
            words = [getattr(obj, k) for k in key] + ([] if "shape" in key else ["object"])
            return " ".join(words)
    return None


def relation_holds(a: SceneObject, b: SceneObject, relation: str) -> bool | None:
    """Whether `a` is `relation` of `b` as seen from the camera; None when too close to call."""
    (ua, _, da), (ub, _, db) = object_view(a), object_view(b)
    axis, sign, margin = {
        "left": (0, -1, LATERAL_MARGIN),
        "right": (0, 1, LATERAL_MARGIN),
        "front": (1, -1, DEPTH_MARGIN),
        "behind": (1, 1, DEPTH_MARGIN),
    }[relation]
    delta = sign * ((ua - ub), (da - db))[axis]
    if abs(delta) < margin:
        return None
    return delta > 0


def count_question(objects, rng) -> QA:
    kind = rng.integers(0, 3)
    if kind == 0:
        noun, n = "objects", len(objects)
    elif kind == 1:
        shape = str(rng.choice(SHAPES))
        noun, n = _plural(shape), sum(o.shape == shape for o in objects)
    else:
        color = str(rng.choice(list(COLORS)))
        noun, n = f"{color} objects", sum(o.color == color for o in objects)
    return QA(str(rng.choice(_COUNT)).format(noun=noun), NUMBER_WORDS[n], "count")


def attribute_question(objects, rng, attribute: str) -> QA | None:
    """Ask the `attribute` ("color" or "shape") of an object named without it, e.g. "the large cube"."""
    templates = {"color": _COLOR, "shape": _SHAPE}[attribute]
    for i in rng.permutation(len(objects)):
        ref = reference(objects[i], objects, omit=attribute)
        if ref:
            return QA(str(rng.choice(templates)).format(ref=ref), getattr(objects[i], attribute), attribute)
    return None


def exist_question(objects, rng, forbidden=frozenset()) -> QA:
    present = {(o.color, o.shape) for o in objects}
    if rng.random() < 0.5:
        color, shape = sorted(present)[int(rng.integers(0, len(present)))]
    else:
        absent = [(c, s) for c in COLORS for s in SHAPES if (c, s) not in present | set(forbidden)]
        color, shape = absent[int(rng.integers(0, len(absent)))]
    answer = "yes" if (color, shape) in present else "no"
    return QA(str(rng.choice(_EXIST)).format(desc=f"{color} {shape}"), answer, "exist")


def spatial_question(objects, rng) -> QA | None:
    for _ in range(20):
        i, j = rng.choice(len(objects), 2, replace=False)
        a, b = objects[i], objects[j]
        ref_a, ref_b = reference(a, objects), reference(b, objects)
        relation = str(rng.choice(list(RELATIONS)))
        holds = relation_holds(a, b, relation)
        if ref_a and ref_b and holds is not None:
            q = str(rng.choice(_SPATIAL)).format(a=ref_a, b=ref_b, rel=RELATIONS[relation])
            return QA(q, "yes" if holds else "no", "spatial")
    return None


def generate_questions(
    objects: list[SceneObject], rng: np.random.Generator, forbidden=frozenset()
) -> list[QA]:
    """One question of each type that the scene allows (unique references, clear relations)."""
    makers = {
        "count": lambda: count_question(objects, rng),
        "color": lambda: attribute_question(objects, rng, "color"),
        "shape": lambda: attribute_question(objects, rng, "shape"),
        "exist": lambda: exist_question(objects, rng, forbidden),
        "spatial": lambda: spatial_question(objects, rng),
    }
    return [qa for qa in (make() for make in makers.values()) if qa is not None]


def _spatial_patterns() -> list:
    """One regular expression per spatial template, capturing the two object names."""
    import re

    relation = "(?:" + "|".join(re.escape(r) for r in RELATIONS.values()) + ")"
    slots = {r"\{a\}": "(?P<a>.+?)", r"\{rel\}": relation, r"\{b\}": "(?P<b>.+?)"}
    patterns = []
    for template in _SPATIAL:
        pattern = re.escape(template)
        for slot, group in slots.items():
            pattern = pattern.replace(slot, group)
        patterns.append(re.compile(f"^{pattern}$"))
    return patterns


_SPATIAL_PATTERNS = _spatial_patterns()


def spatial_referents(question: str, objects: list[SceneObject]) -> tuple[int, int] | None:
    """Indices into `objects` of the two objects a spatial question names (first, second), or None
    when it is not a spatial question or a name does not fit exactly one object."""
    names = {reference(o, objects): i for i, o in enumerate(objects)}  # unique names only
    names.pop(None, None)
    for pattern in _SPATIAL_PATTERNS:  # "Is the a located left of b?" also fits "Is the {a} {rel}..."
        match = pattern.match(question)
        if match and match.group("a") in names and match.group("b") in names:
            return names[match.group("a")], names[match.group("b")]
    return None
