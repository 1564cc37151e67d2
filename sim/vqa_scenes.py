"""A MuJoCo tabletop scene generator for VQA: random objects, one fixed camera, ground truth kept.

One MuJoCo model holds a pool of hidden geoms (every shape x size, several copies); a scene moves the
geoms it uses onto the table and colours them, so one renderer serves every scene.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import mujoco
import numpy as np

SHAPES = ("cube", "sphere", "cylinder")
COLORS = {
    "red": (0.85, 0.1, 0.1),
    "green": (0.1, 0.7, 0.15),
    "blue": (0.1, 0.25, 0.9),
    "yellow": (0.95, 0.85, 0.1),
    "purple": (0.55, 0.15, 0.75),
    "orange": (1.0, 0.5, 0.0),
    "cyan": (0.1, 0.8, 0.85),
    "white": (0.95, 0.95, 0.95),
}
SIZES = {"small": 0.03, "large": 0.05}  # half-extent / radius in metres
MIN_OBJECTS, MAX_OBJECTS = 2, 6
TABLE_X, TABLE_Y = 0.28, 0.2  # objects are placed in [-TABLE_X, TABLE_X] x [-TABLE_Y, TABLE_Y]
CAMERA = "scene_cam"
# The camera sits in front of the table (y < 0), looking at its centre. Spatial relations are judged
# as seen from it: left/right by image position, in front of/behind by distance from the camera.
CAMERA_POS = (0.0, -0.75, 0.65)
CAMERA_X, CAMERA_Y = (1.0, 0.0, 0.0), (0.0, 0.65, 0.75)  # MuJoCo `xyaxes`; the camera looks along -X x Y
CAMERA_FOVY = 45.0
_GEOM_TYPE = {"cube": "box", "sphere": "sphere", "cylinder": "cylinder"}


@dataclass(frozen=True)
class SceneObject:
    shape: str
    color: str
    size: str
    x: float
    y: float

    @property
    def radius(self) -> float:
        return SIZES[self.size] * (1.42 if self.shape == "cube" else 1.0)  # cube: half-diagonal


def sample_scene(
    rng: np.random.Generator,
    forbidden: frozenset[tuple[str, str]] = frozenset(),
    required: frozenset[tuple[str, str]] = frozenset(),
) -> list[SceneObject]:
    """2-6 objects at random non-overlapping positions.

    `forbidden` (color, shape) pairs never appear; when `required` is given, at least one object has
    one of those pairs (used for the compositional split).
    """
    combos = [(c, s) for c in COLORS for s in SHAPES if (c, s) not in forbidden]
    n = int(rng.integers(MIN_OBJECTS, MAX_OBJECTS + 1))
    for _ in range(100):
        chosen = [combos[i] for i in rng.integers(0, len(combos), n)]
        if required:
            req = sorted(required)
            chosen[0] = req[int(rng.integers(0, len(req)))]
        objects: list[SceneObject] = []
        for color, shape in chosen:
            size = str(rng.choice(list(SIZES)))
            for _ in range(200):
                x, y = rng.uniform(-TABLE_X, TABLE_X), rng.uniform(-TABLE_Y, TABLE_Y)
                candidate = SceneObject(shape, color, size, round(float(x), 4), round(float(y), 4))
                if all(_apart(candidate, o) for o in objects):
                    objects.append(candidate)
                    break
        if len(objects) == n:
            rng.shuffle(objects)
            return objects
    raise RuntimeError("could not place the objects without overlap")


def _apart(a: SceneObject, b: SceneObject, margin: float = 0.02) -> bool:
    return np.hypot(a.x - b.x, a.y - b.y) > a.radius + b.radius + margin


def camera_view(x: float, y: float, z: float) -> tuple[float, float, float]:
    """Where a world point appears: (u, v, depth) with u, v = image-plane offsets right and up of the
    centre (tan units: column = W/2 + u * W / (2 tan(fovy/2))) and depth along the viewing axis."""
    right = np.array(CAMERA_X) / np.linalg.norm(CAMERA_X)
    up = np.array(CAMERA_Y) / np.linalg.norm(CAMERA_Y)
    forward = -np.cross(right, up)
    d = np.array([x, y, z]) - np.array(CAMERA_POS)
    depth = float(d @ forward)
    return float(d @ right) / depth, float(d @ up) / depth, depth


def object_view(obj: SceneObject) -> tuple[float, float, float]:
    """camera_view of an object's centre."""
    return camera_view(obj.x, obj.y, SIZES[obj.size])


def _fmt(values) -> str:
    return " ".join(str(v) for v in values)


def _scene_xml(copies: int) -> str:
    geoms = []
    for shape in SHAPES:
        for size_name, s in SIZES.items():
            size = {"cube": f"{s} {s} {s}", "sphere": f"{s}", "cylinder": f"{s} {s}"}[shape]
            for k in range(copies):
                geoms.append(
                    f'<geom name="{shape}_{size_name}_{k}" type="{_GEOM_TYPE[shape]}" size="{size}" '
                    f'pos="0 0 -1" rgba="1 1 1 0"/>'
                )
    return f"""
<mujoco model="vqa_tabletop">
  <visual><global offwidth="1024" offheight="1024"/><quality shadowsize="0"/></visual>
  <asset>
    <texture name="wood" type="2d" builtin="checker" rgb1="0.55 0.42 0.3" rgb2="0.5 0.38 0.27"
             width="256" height="256"/>
    <material name="table" texture="wood" texrepeat="4 4"/>
  </asset>
  <worldbody>
    <light pos="0 -0.3 1.5" dir="0 0.2 -1" diffuse="0.8 0.8 0.8"/>
    <light pos="0.6 0.4 1.2" dir="-0.4 -0.3 -1" diffuse="0.3 0.3 0.3"/>
    <geom name="table" type="plane" size="1.5 1.5 0.01" material="table"/>
    <camera name="{CAMERA}" pos="{_fmt(CAMERA_POS)}" xyaxes="{_fmt(CAMERA_X + CAMERA_Y)}"
            fovy="{CAMERA_FOVY}"/>
    {"".join(geoms)}
  </worldbody>
</mujoco>"""


class SceneRenderer:
    """Renders scenes (lists of SceneObject) from the fixed camera."""

    def __init__(self, image_size: int = 128):
        self.model = mujoco.MjModel.from_xml_string(_scene_xml(MAX_OBJECTS))
        self.data = mujoco.MjData(self.model)
        self.image_size = image_size
        self._renderer = mujoco.Renderer(self.model, image_size, image_size)
        self._pool = {}
        for shape in SHAPES:
            for size in SIZES:
                self._pool[shape, size] = [
                    mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_GEOM, f"{shape}_{size}_{k}")
                    for k in range(MAX_OBJECTS)
                ]

    def render(self, objects: list[SceneObject]) -> np.ndarray:
        """uint8 (H, W, 3) image of the scene."""
        self.model.geom_pos[:] = np.where(np.arange(self.model.ngeom)[:, None] == 0, 0.0, [0, 0, -1])
        self.model.geom_rgba[1:, 3] = 0.0
        used = {key: 0 for key in self._pool}
        for obj in objects:
            gid = self._pool[obj.shape, obj.size][used[obj.shape, obj.size]]
            used[obj.shape, obj.size] += 1
            self.model.geom_pos[gid] = (obj.x, obj.y, SIZES[obj.size])
            self.model.geom_rgba[gid] = (*COLORS[obj.color], 1.0)
        mujoco.mj_forward(self.model, self.data)
        self._renderer.update_scene(self.data, camera=CAMERA)
        return self._renderer.render()

    def project(self, x: float, y: float, z: float) -> tuple[float, float, float]:
        """Pixel (column, row) and depth of a world point, from MuJoCo's own camera pose."""
        cam = self.model.camera(CAMERA)
        mujoco.mj_forward(self.model, self.data)
        pos, mat = self.data.cam_xpos[cam.id], self.data.cam_xmat[cam.id].reshape(3, 3)
        local = mat.T @ (np.array([x, y, z]) - pos)  # camera frame: looks along -z, y up
        f = 0.5 * self.image_size / np.tan(np.deg2rad(self.model.cam_fovy[cam.id]) / 2)
        col = self.image_size / 2 + f * local[0] / -local[2]
        row = self.image_size / 2 - f * local[1] / -local[2]
        return float(col), float(row), float(-local[2])

    def close(self) -> None:
        self._renderer.close()


def scene_to_dict(objects: list[SceneObject]) -> list[dict]:
    return [asdict(o) for o in objects]
