"""``index --ocr`` on an index embedded without it (issue 42): the text of its images is read and
stored in their rows, without embedding any of them again (indexer/backfill.py).

OCR is a fake keyed by the image's width (``indexer.ocr.recognise`` monkeypatched in this process,
replaced by ``_fake_cli.py`` in a CLI subprocess) except in one test that runs the real engine on a
rendered sign. The model is the tiny random one: these tests check what is stored, never ranking.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image, ImageDraw, ImageFont
from shardgen import make_samples, write_shards

from indexer import build_index, ocr
from indexer.build_report import BuildReport
from retrieval import ImageIndex
from retrieval.layout import STAGING_PREFIX, checksum_file, read_manifest, write_manifest
from retrieval.tools.verify import verify_index

N_IMAGES = 10
# The fake OCR's text by image width: the images are N_IMAGES noise pictures 60, 62, ... px wide.
TEXT = {60: "INVOICE4711", 62: "TokyoMarathon2026"}
UNREADABLE = 64  # the width the fake engine fails on, where a test asks for it


def _noise(seed: int, width: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (48, width, 3), dtype=np.uint8))


def _fake_recognise(image: Image.Image) -> str | None:
    return TEXT.get(image.size[0])


def _build(photos: Path, out: Path, model: Path, **kw: Any) -> BuildReport:
    return build_index(photos, out, model=str(model), batch_size=4, workers=0, device="cpu", precision="fp32", **kw)


@pytest.fixture(scope="module")
def plain_index(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> tuple[Path, Path]:
    """Photos, and an index of them embedded without --ocr."""
    photos = tmp_path_factory.mktemp("backfill") / "photos"
    photos.mkdir()
    for i in range(N_IMAGES):
        _noise(i, 60 + 2 * i).save(photos / f"img_{i:02d}.png")
    out = photos.parent / "plain.idx"
    _build(photos, out, tiny_model)
    assert not read_manifest(out).keywords.ocr  # type: ignore[union-attr]
    return photos, out


@pytest.fixture
def copy(plain_index: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """A private copy of the photos and of the plain index."""
    photos, out = tmp_path / "photos", tmp_path / "idx"
    shutil.copytree(plain_index[0], photos)
    shutil.copytree(plain_index[1], out)
    return photos, out


@pytest.fixture
def fake_ocr(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """OCR replaced by :func:`_fake_recognise`; the list receives the width of every image read."""
    calls: list[int] = []

    def recognise(image: Image.Image) -> str | None:
        calls.append(image.size[0])
        if image.size[0] == UNREADABLE and os.environ.get("BACKFILL_FAIL"):
            raise RuntimeError("engine failure")
        return _fake_recognise(image)

    monkeypatch.setattr(ocr, "recognise", recognise)
    monkeypatch.setattr(ocr, "check_engine", lambda: None)
    return calls


@dataclass(frozen=True)
class Rows:
    """Every row of an index in id order: ids, paths, vectors, the OCR columns."""

    ids: list[int]
    paths: list[str]
    vectors: np.ndarray
    ocr_text: dict[str, str | None]
    ocr_read: list[bool | None]

    def same_rows(self, other: Rows) -> bool:
        """The same ids and paths, and the same vectors byte for byte."""
        return (self.ids, self.paths, self.vectors.tobytes()) == (other.ids, other.paths, other.vectors.tobytes())


def _rows(out: Path) -> Rows:
    m = read_manifest(out)
    table = pa.concat_tables(
        [pq.read_table(out / p.path, columns=["id", "path", "embedding", "ocr_text", "ocr_read"]) for p in m.parts]
    )
    vectors = np.asarray(table.column("embedding").combine_chunks().flatten(), np.float32).reshape(table.num_rows, m.dim)
    paths = table.column("path").to_pylist()
    return Rows(table.column("id").to_pylist(), paths, vectors,
                dict(zip(paths, table.column("ocr_text").to_pylist(), strict=True)), table.column("ocr_read").to_pylist())


def test_backfill_keeps_every_vector_and_makes_the_text_findable(copy: tuple[Path, Path], tiny_model: Path,
                                                                 fake_ocr: list[int]) -> None:
    photos, out = copy
    before, m_before = _rows(out), read_manifest(out)
    report = _build(photos, out, tiny_model, ocr=True)
    assert report.text_read == N_IMAGES and report.embedded == 0 and report.added == 0
    assert report.with_ocr_text == 2 and report.text_notes == 0
    # The backfill's time is its own field, not part of committing the embedded rows.
    assert report.text_seconds > 0 and report.write_seconds < report.seconds - report.text_seconds
    assert sorted(fake_ocr) == [60 + 2 * i for i in range(N_IMAGES)]  # each image read once
    after, m = _rows(out), read_manifest(out)
    # Same ids, same paths, the same vectors byte for byte; the FAISS file is the same file.
    assert after.same_rows(before)
    assert m.faiss is not None and m_before.faiss is not None
    assert m.checksums[m.faiss.path] == m_before.checksums[m_before.faiss.path]
    assert m.keywords is not None and m.keywords.ocr and "ocr" in m.keywords.sources and m.complete
    assert after.ocr_text["img_00.png"] == "INVOICE4711" and after.ocr_text["img_03.png"] is None
    assert after.ocr_read == [True] * N_IMAGES
    index = ImageIndex.open(out, device="cpu")
    hits = index.search("4711", mode="keyword")
    assert [h.path for h in hits] == ["img_00.png"] and hits[0].matched == {"ocr": ("4711",)}
    assert [h.path for h in index.search("marathon", mode="keyword")] == ["img_01.png"]
    assert verify_index(out).ok
    assert not [p for p in out.iterdir() if p.name.startswith(STAGING_PREFIX)]
    # A second run, with or without --ocr, reads nothing again.
    fake_ocr.clear()
    for again in (None, True):
        report = _build(photos, out, tiny_model, ocr=again)
        assert report.text_read == 0 and not fake_ocr
    assert read_manifest(out).generation == m.generation  # up to date: no new generation


def test_new_changed_and_deleted_files_in_the_same_run(copy: tuple[Path, Path], tiny_model: Path, fake_ocr: list[int]) -> None:
    photos, out = copy
    before = _rows(out)
    (photos / "img_05.png").unlink()
    _noise(99, 62).save(photos / "new.png")  # 62 px: the fake reads "TokyoMarathon2026"
    report = _build(photos, out, tiny_model, ocr=True)
    assert (report.added, report.removed, report.text_read) == (1, 1, N_IMAGES - 1)
    after = _rows(out)
    kept = [i for i, p in enumerate(before.paths) if p != "img_05.png"]
    assert after.paths == [before.paths[i] for i in kept] + ["new.png"]
    assert after.vectors[: len(kept)].tobytes() == before.vectors[kept].tobytes()
    assert after.ocr_text["new.png"] == "TokyoMarathon2026" and after.ocr_read == [True] * N_IMAGES
    assert {h.path for h in ImageIndex.open(out, device="cpu").search("marathon", mode="keyword")} == {"img_01.png", "new.png"}
    assert verify_index(out).ok


def test_an_unreadable_image_is_counted_not_fatal(copy: tuple[Path, Path], tiny_model: Path, fake_ocr: list[int],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    photos, out = copy
    monkeypatch.setenv("BACKFILL_FAIL", "1")
    report = _build(photos, out, tiny_model, ocr=True)
    assert report.text_read == N_IMAGES and report.text_notes == 1 and report.with_ocr_text == 2
    rows = _rows(out)
    assert rows.ocr_text["img_02.png"] is None and rows.ocr_read == [True] * N_IMAGES
    assert read_manifest(out).keywords.ocr  # type: ignore[union-attr]


def test_no_ocr_then_ocr_again_reads_only_the_images_embedded_meanwhile(copy: tuple[Path, Path], tiny_model: Path,
                                                                        fake_ocr: list[int]) -> None:
    photos, out = copy
    _build(photos, out, tiny_model, ocr=True)
    _noise(7, 60).save(photos / "while_off.png")  # 60 px: "INVOICE4711"
    report = _build(photos, out, tiny_model, ocr=False)
    assert report.added == 1 and not read_manifest(out).keywords.ocr  # type: ignore[union-attr]
    assert _rows(out).ocr_read[-1] is None
    fake_ocr.clear()
    report = _build(photos, out, tiny_model, ocr=True)
    assert report.text_read == 1 and fake_ocr == [60]
    assert {h.path for h in ImageIndex.open(out, device="cpu").search("4711", mode="keyword")} == {"img_00.png", "while_off.png"}


def test_an_index_written_before_the_marker_column(copy: tuple[Path, Path], tiny_model: Path, fake_ocr: list[int]) -> None:
    """Parts as an earlier release wrote them (no ocr_read): the index opens and searches, and
    --ocr reads the text of every row."""
    photos, out = copy
    before, m = _rows(out), read_manifest(out)
    for ref in m.parts:
        path = out / ref.path
        old = pq.read_table(path)
        table = old.drop_columns(["ocr_read"]).replace_schema_metadata(old.schema.metadata)
        pq.write_table(table, path, compression="zstd", write_page_checksum=True)
        assert "ocr_read" not in pq.read_schema(path).names
    write_manifest(out, dataclasses.replace(m, checksums={**m.checksums, **{r.path: checksum_file(out / r.path) for r in m.parts}}))
    assert verify_index(out).ok and len(ImageIndex.open(out, device="cpu").search("noise", k=3)) == 3
    report = _build(photos, out, tiny_model, ocr=True)
    assert report.text_read == N_IMAGES and report.embedded == 0
    after = _rows(out)
    assert after.same_rows(before) and after.ocr_read == [True] * N_IMAGES and after.ocr_text["img_00.png"] == "INVOICE4711"
    assert verify_index(out).ok


def test_an_index_of_shards_reads_its_members_text(tmp_path: Path, tiny_model: Path, fake_ocr: list[int]) -> None:
    """Rows from WebDataset shards: each member is read again out of its tar, by its offset."""
    samples = make_samples(5)
    write_shards(tmp_path / "shards", samples, 2)
    out = tmp_path / "s.idx"
    _build(tmp_path / "shards", out, tiny_model)
    before = _rows(out)
    report = _build(tmp_path / "shards", out, tiny_model, ocr=True)
    assert report.text_read == 5 and report.embedded == 0 and len(fake_ocr) == 5
    after = _rows(out)
    assert after.same_rows(before) and after.ocr_read == [True] * 5 and read_manifest(out).keywords.ocr  # type: ignore[union-attr]


# -- killed mid-way: the CLI in a subprocess, OCR faked there by a wrapper script ---------------------

_FAKE_CLI = """
import sys
from indexer import ocr
TEXT = {text!r}
ocr.check_engine = lambda: None
ocr.recognise = lambda image: TEXT.get(image.size[0])
from clipsearch.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _cli(tmp_path: Path, args: list[str | os.PathLike[str]], crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "_fake_cli.py"
    script.write_text(_FAKE_CLI.format(text=TEXT))
    env = {**os.environ, "CLIPSEARCH_IMAGE_RUNTIME": "torch"}
    env.pop("CLIPSEARCH_CRASH_AT", None)
    if crash_at is not None:
        env["CLIPSEARCH_CRASH_AT"] = crash_at
    cmd = [sys.executable, str(script), *(os.fspath(a) for a in args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("crash_at", ["decode:2", "commit:1"])
def test_killed_mid_backfill_the_index_stays_verifiable_and_a_rerun_finishes(
    copy: tuple[Path, Path], tiny_model: Path, tmp_path: Path, crash_at: str
) -> None:
    photos, out = copy
    before, m_before = _rows(out), read_manifest(out)
    cmd: list[str | os.PathLike[str]] = ["index", photos, out, "--model", tiny_model, "--ocr", "--commit-every", "3", "--workers", "0",
           "--precision", "fp32", "--device", "cpu", "--no-progress"]  # fmt: skip
    killed = _cli(tmp_path, cmd, crash_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert verify_index(out).ok
    m = read_manifest(out)
    assert m.keywords is not None and not m.keywords.ocr  # not every row has its text yet
    partial = _rows(out)
    assert partial.same_rows(before)
    read_before = sum(bool(r) for r in partial.ocr_read)
    if crash_at.startswith("decode"):
        assert m == m_before and read_before == 0  # killed before the first commit: the index as it was
    else:
        assert read_before == 3 and not m.complete  # the first commit of three images' text
        assert [h.path for h in ImageIndex.open(out, device="cpu").search("4711", mode="keyword")] == ["img_00.png"]
    done = _cli(tmp_path, cmd)
    assert done.returncode == 0, done.stderr
    assert f"text read for {N_IMAGES - read_before} images without re-embedding" in done.stderr
    after, m = _rows(out), read_manifest(out)
    assert after.same_rows(before)
    assert after.ocr_read == [True] * N_IMAGES and m.keywords is not None and m.keywords.ocr and m.complete
    assert verify_index(out).ok


# -- the real engine -------------------------------------------------------------------------------


def test_real_ocr_adds_the_text_of_a_rendered_sign(tmp_path: Path, tiny_model: Path) -> None:
    pytest.importorskip("rapidocr_onnxruntime")
    photos = tmp_path / "photos"
    photos.mkdir()
    sign = Image.new("RGB", (360, 120), (235, 235, 225))
    font: ImageFont.FreeTypeFont | ImageFont.ImageFont
    try:
        font = ImageFont.truetype("DejaVuSans-Bold.ttf", 28)
    except OSError:
        font = ImageFont.load_default(28)
    ImageDraw.Draw(sign).text((20, 40), "INVOICE 4711", font=font, fill=(0, 0, 0))
    sign.save(photos / "scan.jpg", quality=90)
    _noise(1, 64).save(photos / "plain.jpg")
    out = tmp_path / "idx"
    _build(photos, out, tiny_model)
    assert not ImageIndex.open(out, device="cpu").search("4711", mode="keyword")
    report = _build(photos, out, tiny_model, ocr=True)
    assert report.text_read == 2 and report.embedded == 0 and report.with_ocr_text == 1
    hit = ImageIndex.open(out, device="cpu").search("4711", mode="keyword")[0]
    assert hit.path == "scan.jpg" and "4711" in (hit.ocr_text or "")
