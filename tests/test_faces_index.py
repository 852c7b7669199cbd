"""``index --faces``: the faces side of a generation, built, carried by updates, added later, checked.

Real faces: views of scikit-image's ``astronaut``; scikit-image's ``coffee`` has none.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import cli_here
from faultctl import run_killed_at

from indexer import build_index
from retrieval import verify_index
from retrieval.errors import EngineError
from retrieval.layout import read_manifest

pytest.importorskip("dlib", reason="the faces extra: pip install 'clipsearch[faces]'")
skdata = pytest.importorskip("skimage.data")

from PIL import Image  # noqa: E402


def _photos(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    face = Image.fromarray(skdata.astronaut())
    face.save(folder / "a1.jpg", quality=92)
    face.transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(folder / "a2.jpg", quality=92)
    face.resize((400, 400)).convert("L").save(folder / "a3.png")
    face.convert("CMYK").save(folder / "a4.jpg")
    Image.fromarray(skdata.coffee()).save(folder / "coffee.jpg")
    (folder / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    return folder


def _build(photos: Path, out: Path, model: Path, **kw: object):  # type: ignore[no-untyped-def]
    return build_index(photos, out, model=str(model), batch_size=4, workers=0, device="cpu", precision="fp32", progress=False, **kw)


def _faces(out: Path) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    m = read_manifest(out)
    assert m.faces is not None
    return pq.read_table(out / m.faces.path).to_pylist(), pq.read_table(out / m.faces.read_path).to_pylist()


def _vectors(out: Path) -> dict[bytes, np.ndarray]:
    m = read_manifest(out)
    rows = [r for p in m.parts for r in pq.read_table(out / p.path, columns=["path_bytes", "embedding"]).to_pylist()]
    return {r["path_bytes"]: np.asarray(r["embedding"]) for r in rows}


@pytest.fixture(scope="module")
def faces_index(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("faces")
    photos = _photos(root / "photos")
    out = root / "photos.idx"
    report = _build(photos, out, tiny_model, faces=True)
    assert report.faces_read == 5 and report.people == 1
    return photos, out


def test_a_build_with_faces_records_every_face_and_every_image_read(faces_index: tuple[Path, Path]) -> None:
    _, out = faces_index
    m = read_manifest(out)
    assert m.faces is not None and m.faces.complete and m.faces.rows == m.count == 5
    assert m.faces.options["min_size"] == 32 and m.faces.options["max_distance"] == 0.4
    faces, read = _faces(out)
    by_path = {r["path_bytes"]: r for r in read}
    assert sorted(by_path) == [b"a1.jpg", b"a2.jpg", b"a3.png", b"a4.jpg", b"coffee.jpg"]
    assert by_path[b"coffee.jpg"]["faces"] == 0
    astronaut = [f for f in faces if f["path_bytes"] != b"coffee.jpg"]
    assert {f["path_bytes"] for f in astronaut} == {b"a1.jpg", b"a2.jpg", b"a3.png", b"a4.jpg"}
    # Four views of one face, read from RGB, grey and CMYK files: one person.
    assert len({f["person"] for f in astronaut}) == 1 and astronaut[0]["person"] == 0
    a1 = next(f for f in faces if f["path_bytes"] == b"a1.jpg")
    assert 150 < (a1["left"] + a1["right"]) / 2 < 280 and len(a1["descriptor"]) == 128 and len(a1["landmarks"]) == 10
    assert verify_index(out).ok


def test_the_faces_side_is_read_by_duckdb(faces_index: tuple[Path, Path]) -> None:
    duckdb = pytest.importorskip("duckdb")
    _, out = faces_index
    m = read_manifest(out)
    assert m.faces is not None
    people = duckdb.sql(f"SELECT person, count(*) FROM '{out / m.faces.path}' GROUP BY person").fetchall()
    assert people == [(0, 4)]


def test_an_update_reads_only_new_files_and_moves_the_faces_with_their_rows(
    tmp_path: Path, faces_index: tuple[Path, Path], tiny_model: Path,
) -> None:
    import shutil

    photos = tmp_path / "photos"
    shutil.copytree(faces_index[0], photos)
    out = tmp_path / "idx"
    shutil.copytree(faces_index[1], out)
    (photos / "a1.jpg").unlink()
    Image.fromarray(skdata.astronaut()).rotate(4).save(photos / "a5.jpg")
    report = _build(photos, out, tiny_model)  # --faces is recorded: kept without the flag
    assert report.faces_read == 1 and report.people == 1
    faces, read = _faces(out)
    m = read_manifest(out)
    ids = {}
    for p in m.parts:
        for r in pq.read_table(out / p.path, columns=["path_bytes"]).to_pylist():
            ids[r["path_bytes"]] = len(ids)
    assert {r["path_bytes"] for r in read} == set(ids)  # every row read, a1 gone
    for f in faces:
        assert ids[f["path_bytes"]] == f["id"]  # renumbered with its row
    a5 = [f for f in faces if f["path_bytes"] == b"a5.jpg" and f["score"] > 0.9]
    assert a5 and a5[0]["person"] == 0  # a new photo joins the person already there
    assert verify_index(out).ok


def test_reindex_keeps_the_faces(tmp_path: Path, faces_index: tuple[Path, Path]) -> None:
    import shutil

    from indexer.reindex import reindex

    out = tmp_path / "idx"
    shutil.copytree(faces_index[1], out)
    before = read_manifest(out).faces
    reindex(out, index_type="Flat")
    after = read_manifest(out).faces
    assert before is not None and after is not None
    assert (after.checksum, after.options, after.people) == (before.checksum, before.options, before.people)
    assert verify_index(out).ok


def test_faces_added_to_an_index_without_embedding_it_again(tmp_path: Path, tiny_model: Path) -> None:
    photos = _photos(tmp_path / "photos")
    out = tmp_path / "idx"
    _build(photos, out, tiny_model)
    assert read_manifest(out).faces is None
    before = _vectors(out)
    report = _build(photos, out, tiny_model, faces=True)
    assert report.embedded == 0 and report.faces_read == 5 and report.faces >= 4
    after = _vectors(out)
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
    # Off again: the side goes, and a run without the flag keeps it off.
    _build(photos, out, tiny_model, faces=False)
    assert read_manifest(out).faces is None
    _build(photos, out, tiny_model)
    assert read_manifest(out).faces is None


def test_the_cli_flag_and_its_summary(tmp_path: Path, tiny_model: Path) -> None:
    photos = _photos(tmp_path / "photos")
    out = tmp_path / "idx"
    result = cli_here(["index", photos, out, "--model", tiny_model, "--faces", "--workers", "0", "--precision", "fp32"])
    assert result.returncode == 0, result.stderr
    assert "faces: " in result.stderr and "forming 1 people" in result.stderr
    assert re.search(r"faces: \d+ found in 5 images read this run in \d+\.\d s,", result.stderr), result.stderr
    verified = cli_here(["verify", out])
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_verify_finds_a_damaged_faces_file(tmp_path: Path, faces_index: tuple[Path, Path]) -> None:
    import shutil

    out = tmp_path / "idx"
    shutil.copytree(faces_index[1], out)
    m = read_manifest(out)
    assert m.faces is not None
    path = out / m.faces.path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    report = verify_index(out)
    assert not report.ok and any(p.file == m.faces.path for p in report.problems)


def _processes_naming(path: Path) -> list[int]:
    """The processes whose command line names ``path`` (a build's forked workers keep its command line)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(path).encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_a_build_killed_while_finding_faces_resumes(tmp_path: Path, tiny_model: Path) -> None:
    photos = _photos(tmp_path / "photos")
    out = tmp_path / "idx"
    args = ["index", photos, out, "--model", tiny_model, "--faces", "--workers", "0", "--precision", "fp32", "--commit-every", "1"]
    killed = run_killed_at(args, "faces", 3)
    assert killed.killed, killed.stderr
    # Its face workers leave with it (they wait on a queue no one will write to again).
    deadline = time.monotonic() + 15
    while _processes_naming(out) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_naming(out) == [], "the killed build's face workers live on"
    m = read_manifest(out)
    assert m.faces is not None and m.faces.read == 2 and not m.faces.complete  # two chunks of one committed
    # People are formed when the stage ends: the faces the killed run committed are nobody's yet.
    assert {f["person"] for f in _faces(out)[0]} == {-1}
    resumed = cli_here(args)
    assert resumed.returncode == 0, resumed.stderr
    m = read_manifest(out)
    assert m.faces is not None and m.faces.complete and m.faces.read == 5
    # The resumed run grouped them with its own: the four views of one face are one person.
    assert {f["person"] for f in _faces(out)[0] if f["path_bytes"] != b"coffee.jpg"} == {0} and m.faces.people == 1
    assert "faces: " in resumed.stderr and "in 3 images read this run" in resumed.stderr
    assert verify_index(out).ok


def test_people_are_formed_once_per_run_not_once_per_chunk(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from indexer.faces import stage

    calls: list[int] = []
    real = stage.assign_new

    def counted(descriptors: np.ndarray, *args: object, **kw: object) -> np.ndarray:
        calls.append(len(descriptors))
        return real(descriptors, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(stage, "assign_new", counted)
    photos = _photos(tmp_path / "photos")
    report = _build(photos, tmp_path / "idx", tiny_model, faces=True, commit_every=1)
    # Five chunks of one image committed; the faces of all of them grouped in one call.
    assert report.faces_read == 5 and report.commits >= 5 and report.people == 1
    assert calls == [report.faces_found] and report.faces_seconds > 0
    assert report.write_seconds < report.seconds - report.faces_seconds


def test_a_missing_face_engine_fails_before_any_work(tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    photos = _photos(tmp_path / "photos")
    monkeypatch.setitem(sys.modules, "dlib", None)
    with pytest.raises(EngineError, match=r"clipsearch\[faces\]"):
        _build(photos, tmp_path / "idx", tiny_model, faces=True)
    assert not (tmp_path / "idx").exists()
