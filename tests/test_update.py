"""Updating an index in place and resuming interrupted runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from imagegen import photo_like, write_photos

from indexer import build_index
from retrieval import ImageIndex, ModelMismatchError
from retrieval.encoders import HFClipEncoder


def by_path(index_dir: Path) -> dict[str, np.ndarray]:
    """path -> embedding of an index; also checks ids are unique and 0..n-1."""
    index = ImageIndex.open(index_dir)
    rows = index.rows(range(len(index)), columns=("id", "path"))
    assert [r["id"] for r in rows] == list(range(len(index)))
    emb = index.vectors.embeddings()
    paths = [r["path"] for r in rows]
    assert len(set(paths)) == len(paths), "a path is indexed twice"
    return dict(zip(paths, emb, strict=True))


def assert_same_index(a: Path, b: Path) -> None:
    ea, eb = by_path(a), by_path(b)
    assert sorted(ea) == sorted(eb)
    for path in ea:
        assert np.allclose(ea[path], eb[path], atol=1e-6), path


def _manifest(index_dir: Path) -> dict:
    return json.loads((index_dir / "manifest.json").read_text())


class CountingEncoder(HFClipEncoder):
    """Counts the images it embeds; can fail after a number of batches."""

    embedded = 0
    fail_after_batches: int | None = None
    batches = 0

    def embed_pixels(self, pixel_values):  # type: ignore[override]  # untyped override of the typed embed_pixels
        type(self).batches += 1
        if self.fail_after_batches is not None and type(self).batches > self.fail_after_batches:
            raise KeyboardInterrupt  # what Ctrl-C in the middle of a run raises
        type(self).embedded += len(pixel_values)
        return super().embed_pixels(pixel_values)


@pytest.fixture()
def counting(tiny_model: Path):
    CountingEncoder.embedded = CountingEncoder.batches = 0
    CountingEncoder.fail_after_batches = None
    # auto, like build_index's default, so indexes built with it equal default clean builds.
    return CountingEncoder.load(str(tiny_model), device="cpu", precision="auto")


def test_update_in_place(tmp_path: Path, tiny_model: Path, counting) -> None:
    photos = write_photos(tmp_path / "photos", 8)
    idx = tmp_path / "idx"
    first = build_index(photos, idx, encoder=counting, workers=0)
    assert (first.added, first.total, CountingEncoder.embedded) == (8, 8, 8)

    photo_like(80, 60, seed=100).save(photos / "new.jpg")  # added
    photo_like(72, 60, seed=101).save(photos / "img_001.jpg", quality=90)  # changed content
    os.utime(photos / "img_002.jpg", ns=(1, 1))  # touched, same bytes
    (photos / "img_003.jpg").unlink()  # removed
    CountingEncoder.embedded = 0
    report = build_index(photos, idx, encoder=counting, workers=0)
    assert (report.added, report.updated, report.removed, report.unchanged, report.total) == (1, 1, 1, 6, 8)
    assert CountingEncoder.embedded == 2  # only the new and the changed file were embedded
    assert_same_index(idx, build_index(photos, tmp_path / "clean", model=str(tiny_model), workers=0) and tmp_path / "clean")

    # The touched file's new mtime was recorded: the next run does not even hash it.
    CountingEncoder.embedded = 0
    before = _manifest(idx)
    again = build_index(photos, idx, encoder=counting, workers=0)
    assert (again.added, again.updated, again.removed, again.unchanged, again.commits) == (0, 0, 0, 8, 0)
    assert CountingEncoder.embedded == 0 and _manifest(idx) == before  # nothing to do, nothing written


def test_broken_file_retried_only_when_changed(tmp_path: Path, counting) -> None:
    photos = write_photos(tmp_path / "photos", 3)
    (photos / "broken.jpg").write_bytes(b"not yet")
    idx = tmp_path / "idx"
    assert build_index(photos, idx, encoder=counting, workers=0).newly_skipped == 1
    second = build_index(photos, idx, encoder=counting, workers=0)
    assert (second.newly_skipped, second.skipped, second.commits) == (0, 1, 0)
    photo_like(64, 64, seed=7).save(photos / "broken.jpg")
    fixed = build_index(photos, idx, encoder=counting, workers=0)
    assert (fixed.added, fixed.skipped, fixed.total) == (1, 0, 4)
    (photos / "broken.jpg").unlink()
    gone = build_index(photos, idx, encoder=counting, workers=0)
    assert (gone.removed, gone.total) == (1, 3)


def test_deleted_broken_file_leaves_the_skip_list(tmp_path: Path, counting) -> None:
    photos = write_photos(tmp_path / "photos", 2)
    (photos / "broken.jpg").write_bytes(b"")
    idx = tmp_path / "idx"
    build_index(photos, idx, encoder=counting, workers=0)
    (photos / "broken.jpg").unlink()
    report = build_index(photos, idx, encoder=counting, workers=0)
    assert report.skipped == 0 and ImageIndex.open(idx).metadata.skipped() == []


def test_other_model_refused_unless_rebuild(tmp_path: Path, tiny_model: Path, other_model: Path) -> None:
    photos = write_photos(tmp_path / "photos", 3)
    idx = tmp_path / "idx"
    build_index(photos, idx, model=str(tiny_model), workers=0)
    with pytest.raises(ModelMismatchError) as err:
        build_index(photos, idx, model=str(other_model), workers=0)
    assert str(tiny_model.resolve()) in str(err.value) and str(other_model.resolve()) in str(err.value)
    assert "--rebuild" in str(err.value)
    report = build_index(photos, idx, model=str(other_model), workers=0, rebuild=True)
    assert (report.added, report.total) == (3, 3)
    assert ImageIndex.open(idx).manifest.model == str(other_model.resolve())


def test_chunk_commits_make_parts_and_equal_a_single_build(tmp_path: Path, tiny_model: Path) -> None:
    photos = write_photos(tmp_path / "photos", 11)
    report = build_index(photos, tmp_path / "chunked", model=str(tiny_model), workers=0, batch_size=2, commit_every=3)
    assert report.commits >= 4
    manifest = _manifest(tmp_path / "chunked")
    assert [p["rows"] for p in manifest["parts"]] == [4, 4, 3] and manifest["complete"] and manifest["faiss"]["rows"] == 11
    assert len([p for p in (tmp_path / "chunked").iterdir() if p.name.startswith("gen-")]) == 1
    build_index(photos, tmp_path / "single", model=str(tiny_model), workers=0)
    assert_same_index(tmp_path / "chunked", tmp_path / "single")


def test_interrupted_run_is_searchable_and_resumes(tmp_path: Path, tiny_model: Path, counting) -> None:
    photos = write_photos(tmp_path / "photos", 10)
    idx = tmp_path / "idx"
    CountingEncoder.fail_after_batches = 3
    with pytest.raises(KeyboardInterrupt):
        build_index(photos, idx, encoder=counting, workers=0, batch_size=2, commit_every=2)
    manifest = _manifest(idx)
    assert not manifest["complete"] and manifest["count"] == 6  # three batches were committed
    partial = ImageIndex.open(idx, device="cpu")
    assert len(partial) == 6 and len(partial.search("x", k=10)) == 6  # searchable, FAISS rebuilt from parts
    CountingEncoder.fail_after_batches = None
    CountingEncoder.embedded = 0
    report = build_index(photos, idx, encoder=counting, workers=0, batch_size=2, commit_every=2)
    assert report.resumed and CountingEncoder.embedded == 4  # committed images were not embedded again
    assert (report.added, report.unchanged, report.total) == (4, 6, 10)
    assert _manifest(idx)["complete"]
    build_index(photos, tmp_path / "clean", model=str(tiny_model), workers=0)
    assert_same_index(idx, tmp_path / "clean")


def test_leftovers_of_a_killed_first_build_are_reused(tmp_path: Path, tiny_model: Path) -> None:
    photos = write_photos(tmp_path / "photos", 2)
    idx = tmp_path / "idx"
    (idx / ".staging-deadbeef" / "embeddings").mkdir(parents=True)
    (idx / "lock").write_text("")
    report = build_index(photos, idx, model=str(tiny_model), workers=0)
    assert report.total == 2
    assert sorted(p.name for p in idx.iterdir() if not p.name.startswith("gen-")) == ["lock", "manifest.json"]


def test_damaged_index_is_replaced_only_with_rebuild(tmp_path: Path, tiny_model: Path) -> None:
    from retrieval import IndexDirError, IndexFormatError

    photos = write_photos(tmp_path / "photos", 2)
    idx = tmp_path / "idx"
    build_index(photos, idx, model=str(tiny_model), workers=0)
    manifest = _manifest(idx)
    del manifest["parts"]
    del manifest["manifest_digest"]  # hand-edited: a stale digest would be reported as damage first
    (idx / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexFormatError, match="missing 'parts'.*--rebuild"):
        build_index(photos, idx, model=str(tiny_model), workers=0)
    assert build_index(photos, idx, model=str(tiny_model), workers=0, rebuild=True).total == 2
    assert len(ImageIndex.open(idx)) == 2

    other = tmp_path / "webapp"
    other.mkdir()
    (other / "manifest.json").write_text('{"name": "my web app"}')
    with pytest.raises(IndexDirError, match="not a clipsearch index"):
        build_index(photos, other, model=str(tiny_model), workers=0, rebuild=True)
    assert (other / "manifest.json").read_text() == '{"name": "my web app"}'


def test_update_and_rebuild_without_model_keep_the_index_model(tmp_path: Path, other_model: Path) -> None:
    """Without model= an existing index is updated, and rebuilt, with the model it records, as
    search uses it; not with the default model (which, offline and uncached, cannot even load)."""
    from indexer.build import load_model
    from indexer.build_base import with_model
    from indexer.build_config import BuildConfig
    from retrieval.encoders import DEFAULT_MODEL

    photos = write_photos(tmp_path / "photos", 3)
    idx = tmp_path / "idx"
    recorded = str(other_model.resolve())
    build_index(photos, idx, model=str(other_model), workers=0)
    write_photos(photos, 1, start=3)
    update = build_index(photos, idx, workers=0)
    assert (update.model, update.added, update.unchanged, update.total) == (recorded, 1, 3, 4)
    rebuilt = build_index(photos, idx, workers=0, rebuild=True)
    assert (rebuilt.model, rebuilt.added, rebuilt.total) == (recorded, 4, 4)
    assert ImageIndex.open(idx).manifest.model == recorded
    # Watch mode loads its encoder the same way; a new directory keeps today's default.
    assert load_model(BuildConfig(), idx).name == recorded
    assert with_model(BuildConfig(), tmp_path / "new").model == DEFAULT_MODEL
    assert with_model(BuildConfig(model="m"), idx).model == "m"


def test_recorded_model_that_moved_names_the_index_and_the_way_on(tmp_path: Path, tiny_model: Path) -> None:
    import shutil

    from retrieval import store
    from retrieval.errors import ModelLoadError
    from retrieval.layout import read_manifest

    photos = write_photos(tmp_path / "photos", 3)
    idx = tmp_path / "idx"
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    build_index(photos, idx, model=str(model), workers=0)
    moved = model.rename(tmp_path / "moved")
    with pytest.raises(ModelLoadError) as err:
        build_index(photos, idx, workers=0)
    assert f"{idx} records the model {model.resolve()}, which cannot be loaded" in str(err.value)
    assert "pass --model naming where that model is now" in str(err.value)
    # The repair command a damaged index prints asks for it too.
    hint = store.rebuild_hint(idx, read_manifest(idx))
    assert f"--rebuild --model MODEL`, MODEL where its model is now ({model.resolve()}," in hint
    # The same weights where they are now: no rebuild needed; an update that commits records that place.
    write_photos(photos, 1, start=3)
    assert build_index(photos, idx, model=str(moved), workers=0).unchanged == 3
    assert read_manifest(idx).model == str(moved.resolve())
    assert store.rebuild_hint(idx, read_manifest(idx)).endswith("--rebuild`")
    assert build_index(photos, idx, workers=0).unchanged == 4


@pytest.mark.parametrize("model", ["", "  ", 5])
def test_empty_or_non_string_model_is_refused(model: object) -> None:
    from indexer.build_config import BuildConfig
    from retrieval.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="model must be a non-empty name or path"):
        BuildConfig(model=model)  # type: ignore[arg-type]
