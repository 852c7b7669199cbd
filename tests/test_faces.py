"""Faces (groundwork of ``index --faces``): dlib finds and describes real faces, people are grouped.

The real face is scikit-image's ``astronaut`` (Eileen Collins); the checks are on boxes,
landmarks and distances, the mechanics the index will rely on, not on who is who.
"""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest
from PIL import Image

from indexer.faces import ClusterOptions, FaceFinder, FaceOptions, assign_new, cluster_all, regroup
from indexer.faces.detect import check_engine
from indexer.faces.grouping import NOBODY
from retrieval.errors import EngineError, InvalidArgumentError

pytest.importorskip("dlib", reason="the faces extra: pip install 'clipsearch[faces]'")
skdata = pytest.importorskip("skimage.data")

# The astronaut's face in skimage's 512 x 512 picture: inside this box, well away from its edges.
FACE_REGION = (150, 40, 280, 170)


@pytest.fixture(scope="module")
def astronaut() -> Image.Image:
    return Image.fromarray(skdata.astronaut())


@pytest.fixture(scope="module")
def finder() -> FaceFinder:
    return FaceFinder()  # the defaults


def _inside(box: tuple[float, float, float, float], region: tuple[float, float, float, float]) -> bool:
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    return region[0] <= cx <= region[2] and region[1] <= cy <= region[3]


def test_finds_the_face_with_box_landmarks_and_descriptor(astronaut: Image.Image, finder: FaceFinder) -> None:
    faces = finder.find(astronaut)
    assert len(faces) == 1
    face = faces[0]
    assert _inside(face.box, FACE_REGION) and 60 < face.size < 140 and face.score >= 0.5
    assert face.landmarks.shape == (5, 2) and face.landmarks.dtype == np.float32
    left, top, right, bottom = face.box
    assert ((face.landmarks[:, 0] >= left - 5) & (face.landmarks[:, 0] <= right + 5)).all()
    assert ((face.landmarks[:, 1] >= top - 5) & (face.landmarks[:, 1] <= bottom + 5)).all()
    assert face.descriptor.shape == (128,) and face.descriptor.dtype == np.float32
    assert 0.5 < float(np.linalg.norm(face.descriptor)) < 1.5


@pytest.mark.parametrize("mode", ["L", "CMYK", "RGBA", "P"])
def test_any_pil_mode_is_read_as_rgb(astronaut: Image.Image, finder: FaceFinder, mode: str) -> None:
    faces = finder.find(astronaut.convert(mode))
    assert len(faces) == 1 and _inside(faces[0].box, FACE_REGION)


def test_views_of_one_face_stay_close(astronaut: Image.Image, finder: FaceFinder) -> None:
    (base,) = finder.find(astronaut)
    buf = io.BytesIO()
    astronaut.save(buf, "JPEG", quality=20)
    views = [astronaut.transpose(Image.Transpose.FLIP_LEFT_RIGHT), Image.open(io.BytesIO(buf.getvalue())), astronaut.resize((400, 400))]
    for view in views:
        (face,) = finder.find(view)
        assert float(np.linalg.norm(face.descriptor - base.descriptor)) < 0.5


def test_a_large_photo_is_detected_on_a_copy_and_described_at_full_size(astronaut: Image.Image, finder: FaceFinder) -> None:
    big = astronaut.resize((4096, 4096), Image.Resampling.BICUBIC)  # 16.8 MP; detection reads 1024 px
    (face,) = finder.find(big)
    region = tuple(v * 8 for v in FACE_REGION)
    assert _inside(face.box, region) and face.size > 8 * 60
    (small,) = finder.find(astronaut)
    assert float(np.linalg.norm(face.descriptor - small.descriptor)) < 0.5


def test_no_face_and_too_small_faces_give_nothing(astronaut: Image.Image, finder: FaceFinder) -> None:
    assert finder.find(Image.new("RGB", (640, 480), (128, 128, 128))) == []
    assert finder.find(Image.new("RGB", (1, 1))) == []
    assert FaceFinder(FaceOptions(min_size=150)).find(astronaut) == []


@pytest.mark.parametrize(
    "kwargs",
    [{"min_size": 0}, {"min_size": 2.5}, {"min_score": float("nan")}, {"min_score": True}, {"max_side": 10},
     {"upsample": -1}, {"upsample": 5}, {"jitter": 1.5}],
)
def test_bad_face_options_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError):
        FaceOptions(**kwargs)  # type: ignore[arg-type]


def test_a_missing_engine_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "dlib", None)
    with pytest.raises(EngineError, match=r"clipsearch\[faces\]") as info:
        check_engine()
    assert "\n" not in str(info.value)


def _blobs(rng: np.random.Generator, centres: np.ndarray, per: int, spread: float) -> np.ndarray:
    return np.concatenate([c + rng.normal(0, spread, (per, centres.shape[1])) for c in centres]).astype(np.float32)


def test_cluster_all_finds_the_people_and_leaves_the_lonely_faces() -> None:
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 1, (3, 16)) * 2
    faces = np.concatenate([_blobs(rng, centres, 6, 0.03), centres[:1] + 5.0])  # one face far from all
    labels = cluster_all(faces, ClusterOptions(max_distance=0.5, min_faces=3))
    assert labels[-1] == NOBODY
    groups = [set(labels[i * 6 : (i + 1) * 6]) for i in range(3)]
    assert all(len(g) == 1 and NOBODY not in g for g in groups) and len(set.union(*groups)) == 3
    assert cluster_all(np.zeros((0, 16), np.float32)).shape == (0,)


def test_assign_new_keeps_every_person_and_joins_or_founds() -> None:
    rng = np.random.default_rng(1)
    a, b, c = rng.normal(0, 1, (3, 16)) * 2
    known = _blobs(rng, np.stack([a, b]), 4, 0.03)
    people = np.array([7] * 4 + [2] * 4)  # numbers a user's edits may have left
    new = np.concatenate([a + rng.normal(0, 0.03, (1, 16)), _blobs(rng, c[None], 3, 0.03), c[None] + 6.0]).astype(np.float32)
    labels = assign_new(np.concatenate([known, new]), np.concatenate([people, [NOBODY] * len(new)]))
    assert list(labels[:8]) == list(people)
    assert labels[8] == 7  # joins the nearest person
    assert len(set(labels[9:12])) == 1 and labels[9] == 8  # three close faces found a new person
    assert labels[12] == NOBODY  # alone: waits


def test_assign_new_never_moves_a_face_that_has_a_person() -> None:
    rng = np.random.default_rng(2)
    a = rng.normal(0, 1, 16)
    faces = _blobs(rng, a[None], 6, 0.01)
    people = np.array([0, 0, 0, 1, 1, NOBODY])  # a split the user made stays a split
    labels = assign_new(faces, people)
    assert list(labels[:5]) == [0, 0, 0, 1, 1] and labels[5] in (0, 1)


@pytest.mark.parametrize(
    ("faces", "people"),
    [
        (np.zeros((3, 4)), np.zeros(2)),
        (np.zeros((2, 4)), np.array([-2, 0])),
        (np.full((1, 4), np.nan), np.array([-1])),
        (np.zeros(4), np.zeros(4)),
    ],
)
def test_assign_new_refuses_bad_input(faces: np.ndarray, people: np.ndarray) -> None:
    with pytest.raises(InvalidArgumentError):
        assign_new(faces, people)


def test_regroup_keeps_numbers_by_overlap_and_the_kept_faces() -> None:
    rng = np.random.default_rng(3)
    a, b, c = rng.normal(0, 1, (3, 16)) * 2
    faces = np.concatenate([_blobs(rng, np.stack([a, b, c]), 4, 0.03), a[None] + 6.0])
    # Before: a's faces were #5 (one of them wrongly #9), b's and c's one person #2, the far face #9.
    before = np.array([5, 5, 5, 9, 2, 2, 2, 2, 2, 2, 2, 2, 9])
    after = regroup(faces, before, np.zeros(len(faces), bool), ClusterOptions(max_distance=0.5, min_faces=2), first_new=11)
    assert after[:4].tolist() == [5] * 4  # the group keeps the number it overlaps most
    assert {int(after[4]), int(after[8])} == {2, 11} and len(set(after[4:8])) == len(set(after[8:12])) == 1
    assert after[12] == NOBODY  # alone
    kept = np.zeros(len(faces), bool)
    kept[3] = kept[12] = True  # the user's word on those two faces
    again = regroup(faces, before, kept, ClusterOptions(max_distance=0.5, min_faces=2), first_new=11)
    assert again[3] == 9 and again[12] == 9 and again[:3].tolist() == [5] * 3
    # A lower number wins a tie; new people start above every number used before.
    tie = regroup(faces[:8], np.array([4, 4, 7, 7, 1, 1, 1, 1]), np.zeros(8, bool), ClusterOptions(0.5, 2))
    assert tie.tolist() == [4, 4, 4, 4, 1, 1, 1, 1]
    assert regroup(faces[:4], np.array([-1, -1, -1, 3]), np.zeros(4, bool), ClusterOptions(0.5, 2)).tolist() == [3] * 4
    assert regroup(faces[:4], np.array([-1] * 4), np.zeros(4, bool), ClusterOptions(0.5, 2), first_new=6).tolist() == [6] * 4
    # Two people the user vouched for, look-alikes one loose group holds: each other face goes to
    # the person of its nearest kept face, not all to the one the group overlaps most.
    twins = np.concatenate([_blobs(rng, np.stack([a, a + 0.05]), 3, 0.01), a[None] + 0.06, a[None] - 0.01])
    people, kept = np.array([0, 0, 0, 1, 1, 1, -1, -1]), np.array([True] * 6 + [False] * 2)
    assert regroup(twins, people, kept, ClusterOptions(0.5, 2)).tolist()[6:] == [1, 0]
    kept[:3] = False  # only #1 vouched for: the group is #0's (it overlaps it as much, lower number)
    assert regroup(twins, people, kept, ClusterOptions(0.5, 2)).tolist() == [0, 0, 0, 1, 1, 1, 0, 0]
    for bad_people, bad_kept in ((np.zeros(3), np.zeros(4, bool)), (np.array([-2, 0, 0, 0]), np.zeros(4, bool)),
                                 (np.zeros(4), np.zeros(2, bool))):
        with pytest.raises(InvalidArgumentError):
            regroup(faces[:4], bad_people, bad_kept)


@pytest.mark.parametrize("kwargs", [{"max_distance": 0}, {"max_distance": 2.5}, {"max_distance": "0.5"}, {"min_faces": 0}])
def test_bad_cluster_options_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError):
        ClusterOptions(**kwargs)  # type: ignore[arg-type]
