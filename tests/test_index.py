"""Build through the Python API, then open, check and search the index."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import torch
from imagegen import Collection, photo_like

from indexer import build_index
from retrieval import (
    ImageDecodeError,
    ImageIndex,
    IndexDirError,
    IndexFormatError,
    InvalidArgumentError,
    ModelMismatchError,
    NotAnIndexError,
    PhotosDirError,
    UnsupportedFormatError,
)
from retrieval.encoders import HFClipEncoder
from retrieval.images import load_pixels
from retrieval.layout import FORMAT_VERSION, MANIFEST_DIGEST_KEY, display_path, format_version_for


def _file(index_dir: Path, role: str) -> Path:
    """Where the manifest says a data file of the current generation is."""
    manifest = json.loads((index_dir / "manifest.json").read_text())
    rel = {
        "embeddings": manifest["parts"][0]["path"],
        "faiss": (manifest["faiss"] or {}).get("path"),
        "skipped": manifest["skipped_file"],
    }[role]
    return index_dir / rel


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _copy_index(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy.idx"
    shutil.copytree(src, dst)
    return dst


def test_parquet_contract(built_index: Path, collection: Collection) -> None:
    table = ds.dataset(_file(built_index, "embeddings").parent, format="parquet").to_table()
    assert table.schema.field("id").type == "int64"
    assert str(table.schema.field("embedding").type) == "fixed_size_list<element: float>[48]"
    assert table.column("id").to_pylist() == list(range(table.num_rows))
    paths = table.column("path").to_pylist()
    raw = [os.fsdecode(b) for b in table.column("path_bytes").to_pylist()]
    # Every good file indexed once, file symlinks too; directory symlinks are not followed.
    assert sorted(raw) == sorted([*collection.good, *collection.file_symlinks])
    assert paths == [display_path(os.fsencode(p)) for p in raw]
    sizes = dict(zip(raw, zip(table.column("width").to_pylist(), table.column("height").to_pylist(), strict=True), strict=True))
    for rel, size in collection.good.items():
        assert sizes[rel] == size, rel
    emb = np.asarray(table.column("embedding").to_pylist(), dtype=np.float32)
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)



def test_file_facts_are_stored(built_index: Path, collection: Collection) -> None:
    import hashlib

    table = pq.read_table(_file(built_index, "embeddings"), columns=["path_bytes", "size", "mtime_ns", "content_hash"])
    for row in table.to_pylist():
        data = (collection.root / os.fsdecode(row["path_bytes"])).read_bytes()
        st = (collection.root / os.fsdecode(row["path_bytes"])).stat()
        assert row["size"] == len(data) and row["mtime_ns"] == st.st_mtime_ns
        assert row["content_hash"] == hashlib.blake2b(data, digest_size=16).hexdigest()
    skipped = pq.read_table(_file(built_index, "skipped")).to_pylist()
    for row in skipped:
        path = collection.root / row["path"]
        assert row["size"] == path.stat().st_size and row["content_hash"] is not None


def test_parquet_readable_by_pandas_and_duckdb(built_index: Path) -> None:
    import duckdb
    import pandas as pd

    frame = pd.read_parquet(_file(built_index, "embeddings").parent)
    assert list(frame.columns[:2]) == ["id", "path"] and len(frame) == len(ImageIndex.open(built_index))
    rows = duckdb.sql(
        f"SELECT id, path, len(embedding) AS d FROM read_parquet('{built_index}/gen-*/embeddings/*.parquet') ORDER BY id"
    ).fetchall()
    assert [r[0] for r in rows] == list(range(len(frame)))
    assert {r[2] for r in rows} == {48}
    assert [r[1] for r in rows] == frame["path"].tolist()


def test_manifest_contract(built_index: Path, tiny_model: Path, collection: Collection) -> None:
    manifest = json.loads((built_index / "manifest.json").read_text())
    assert manifest["format_version"] == format_version_for(manifest["index_type"]) == 2  # version 3 only for a re-ranked FAISS file
    assert manifest["model"] == str(tiny_model.resolve())
    assert manifest["model_fingerprint"].startswith("sha256:")
    assert manifest["dim"] == 48
    assert manifest["preprocess"]["crop_size"] == [64, 64]
    assert manifest["preprocess"]["alpha"] == "white"
    assert manifest["count"] == len(collection.good) + len(collection.file_symlinks)
    assert manifest["skipped"] == len(collection.broken)
    assert not [p for p in built_index.iterdir() if p.name.startswith(".")]  # no staging left


def test_skipped_files_with_reasons(built_index: Path, collection: Collection) -> None:
    skipped = {s.path: s.reason for s in ImageIndex.open(built_index).metadata.skipped()}
    assert set(skipped) == set(collection.broken)
    words = {"empty": "empty", "truncated": "truncated", "not-an-image": "not an image", "bomb": "decompression bomb"}
    for path, kind in collection.broken.items():
        assert words[kind] in skipped[path], (path, skipped[path])


def test_flat_search_equals_brute_force(built_index: Path) -> None:
    index = ImageIndex.open(built_index, device="cpu", precision="fp32")  # exact scores, both text paths
    emb = index.vectors.embeddings()
    queries = ["a dog on a beach", "red", "日本語"]
    q = index.encoders.encoder.embed_texts(queries)
    for text, vec in zip(queries, q, strict=True):
        hits = index.search(text, k=len(index), mode="vector")
        scores = emb @ vec
        expected = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        assert [h.id for h in hits] == expected
        assert np.allclose([h.score for h in hits], scores[expected], atol=1e-5)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_image_search_finds_itself(built_index: Path, collection: Collection) -> None:
    index = ImageIndex.open(built_index, device="cpu")
    hits = index.search_image(collection.root / "photos" / "a.jpg", k=3)
    assert hits[0].score == pytest.approx(1.0, abs=1e-5)
    assert hits[0].path in ("photos/a.jpg", "link_to_photo.jpg")


def test_unicode_and_non_utf8_names_are_found(built_index: Path, collection: Collection) -> None:
    import faiss

    index = ImageIndex.open(built_index, device="cpu")
    emb = index.vectors.embeddings()
    paths = index.metadata.paths()
    exact = faiss.IndexFlatIP(emb.shape[1])
    exact.add(emb)
    names = [rel for rel in collection.good if not rel.isascii()]
    assert len(names) == 3
    for rel in names:
        i = paths.index(display_path(os.fsencode(rel)))
        hits = index.search_vectors(emb[i], k=3)[0]
        scores, ids = exact.search(emb[i : i + 1], 3)
        # The exact answer: the image first (no other indexed image has the same pixels), found
        # under its own name, then the same neighbours as exhaustive search, with its scores.
        assert ids[0][0] == i and hits[0].id == i and hits[0].path == display_path(os.fsencode(rel))
        assert [h.id for h in hits] == ids[0].tolist()
        assert np.allclose([h.score for h in hits], scores[0], atol=1e-6)
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)
    assert "intl/latin1_caf\\xe9.jpg" in paths


def test_k_larger_than_index(built_index: Path) -> None:
    index = ImageIndex.open(built_index, device="cpu")
    assert len(index.search("anything", k=10_000)) == len(index)


@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_bad_k(built_index: Path, k) -> None:
    with pytest.raises(InvalidArgumentError):
        ImageIndex.open(built_index, device="cpu").search("x", k=k)


@pytest.mark.parametrize("query", ["", "   ", "\n"])
def test_empty_query(built_index: Path, query: str) -> None:
    with pytest.raises(InvalidArgumentError):
        ImageIndex.open(built_index, device="cpu").search(query)


def test_undecodable_query_image(built_index: Path, collection: Collection) -> None:
    index = ImageIndex.open(built_index, device="cpu")
    for rel in collection.broken:
        with pytest.raises(ImageDecodeError):
            index.search_image(collection.root / rel)


def test_other_model_is_refused_naming_both(built_index: Path, tiny_model: Path, other_model: Path) -> None:
    index = ImageIndex.open(built_index, model=str(other_model), device="cpu")
    with pytest.raises(ModelMismatchError) as err:
        index.search("a cat")
    assert str(tiny_model.resolve()) in str(err.value) and str(other_model.resolve()) in str(err.value)
    # The same weights under another path are the same model.
    copy = other_model.parent / "same-weights"
    if not copy.exists():
        shutil.copytree(tiny_model, copy)
    assert ImageIndex.open(built_index, model=str(copy), device="cpu").search("a cat", k=1)


def test_changed_checkpoint_is_refused(built_index: Path, tiny_model: Path, tmp_path: Path) -> None:
    idx = _copy_index(built_index, tmp_path)
    manifest = json.loads((idx / "manifest.json").read_text())
    manifest["model_fingerprint"] = "sha256:" + "0" * 64
    manifest.pop(MANIFEST_DIGEST_KEY)  # hand-edited: a stale digest would be reported as damage first
    (idx / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelMismatchError):
        ImageIndex.open(idx, device="cpu").search("x")


def test_injected_encoder(built_index: Path, tiny_model: Path) -> None:
    enc = HFClipEncoder.load(str(tiny_model), device="cpu")
    hits = ImageIndex.open(built_index, encoder=enc).search("x", k=2)
    assert len(hits) == 2


def test_newer_format_is_refused(built_index: Path, tmp_path: Path) -> None:
    idx = _copy_index(built_index, tmp_path)
    manifest = json.loads((idx / "manifest.json").read_text())
    manifest["format_version"] = FORMAT_VERSION + 1
    manifest.pop(MANIFEST_DIGEST_KEY)  # hand-edited: a stale digest would be reported as damage first
    (idx / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UnsupportedFormatError, match="upgrade clipsearch"):
        ImageIndex.open(idx)


@pytest.mark.parametrize("damage", ["no-faiss", "bad-faiss", "no-parquet", "count", "file-id", "ids", "part-rows"])
def test_inconsistent_index_is_refused(built_index: Path, tmp_path: Path, damage: str) -> None:
    idx = _copy_index(built_index, tmp_path)
    manifest = json.loads((idx / "manifest.json").read_text())
    # The structural checks, as for an index written before checksums (with them, the digest or
    # the recorded sizes catch these first: tests/test_verify.py).
    manifest.pop(MANIFEST_DIGEST_KEY)
    manifest.pop("checksums")
    if damage == "no-faiss":
        _file(idx, "faiss").unlink()
    elif damage == "bad-faiss":
        _file(idx, "faiss").write_bytes(b"garbage")
    elif damage == "no-parquet":
        _file(idx, "embeddings").unlink()
    elif damage == "count":
        manifest["count"] += 1
    elif damage == "file-id":
        manifest["parts"][0]["file_id"] = "0" * 32
    elif damage == "part-rows":
        manifest["parts"][0]["rows"] += 1
    elif damage == "ids":
        table = pq.read_table(_file(idx, "embeddings"))
        # Open checks id ranges from the row groups' statistics (O(parts), not O(rows)): a
        # part holding other ids than the manifest says is refused.
        ids = table.column("id").to_numpy() + 1
        table = table.set_column(0, "id", __import__("pyarrow").array(ids))
        pq.write_table(table, _file(idx, "embeddings"))
    (idx / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexFormatError):
        ImageIndex.open(idx)


def test_not_an_index(tmp_path: Path) -> None:
    with pytest.raises(NotAnIndexError):
        ImageIndex.open(tmp_path)
    with pytest.raises(NotAnIndexError):
        ImageIndex.open(tmp_path / "missing")


def test_bad_photos_dirs(tmp_path: Path, tiny_model: Path) -> None:
    with pytest.raises(PhotosDirError, match="does not exist"):
        build_index(tmp_path / "missing", tmp_path / "idx", model=str(tiny_model))
    (tmp_path / "file.jpg").write_bytes(b"x")
    with pytest.raises(PhotosDirError, match="not a directory"):
        build_index(tmp_path / "file.jpg", tmp_path / "idx", model=str(tiny_model))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no images here")
    with pytest.raises(PhotosDirError, match="no images"):
        build_index(tmp_path / "empty", tmp_path / "idx", model=str(tiny_model))
    assert not (tmp_path / "idx").exists()


def test_refuses_to_write_into_a_non_index_directory(tmp_path: Path, tiny_model: Path) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    photo_like(80, 60, 0).save(photos / "a.jpg")
    target = tmp_path / "docs"
    target.mkdir()
    (target / "thesis.tex").write_text("precious")
    with pytest.raises(IndexDirError, match="refusing"):
        build_index(photos, target, model=str(tiny_model), workers=0)
    assert (target / "thesis.tex").read_text() == "precious" and len(list(target.iterdir())) == 1
    (tmp_path / "afile").write_text("x")
    with pytest.raises(IndexDirError):
        build_index(photos, tmp_path / "afile", model=str(tiny_model), workers=0)


def test_rebuild_replaces_index_and_failure_keeps_old(tmp_path: Path, tiny_model: Path) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(3):
        photo_like(80, 60, i).save(photos / f"{i}.jpg")
    idx = tmp_path / "idx"
    first = build_index(photos, idx, model=str(tiny_model), workers=0)
    assert first.indexed == 3
    photo_like(80, 60, 9).save(photos / "new.jpg")
    assert build_index(photos, idx, model=str(tiny_model), workers=0).indexed == 4
    before = _snapshot(idx)

    class Boom(RuntimeError):
        pass

    class FailingEncoder(HFClipEncoder):
        def embed_pixels(self, pixel_values):  # type: ignore[override]  # untyped override of the typed embed_pixels
            raise Boom("model crashed mid-build")

    enc = FailingEncoder.load(str(tiny_model), device="cpu")
    with pytest.raises(Boom):
        build_index(photos, idx, encoder=enc, workers=0, rebuild=True)
    assert _snapshot(idx) == before
    assert len(ImageIndex.open(idx)) == 4


def test_failed_first_build_leaves_nothing(tmp_path: Path, tiny_model: Path) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    photo_like(80, 60, 0).save(photos / "a.jpg")

    class FailingEncoder(HFClipEncoder):
        def embed_pixels(self, pixel_values):  # type: ignore[override]  # untyped override of the typed embed_pixels
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_index(photos, tmp_path / "idx", encoder=FailingEncoder.load(str(tiny_model), device="cpu"), workers=0)
    assert not (tmp_path / "idx").exists()


def test_all_images_broken_gives_an_empty_index(tmp_path: Path, tiny_model: Path) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "a.jpg").write_bytes(b"")
    report = build_index(photos, tmp_path / "idx", model=str(tiny_model), workers=0)
    assert (report.indexed, report.skipped) == (0, 1)
    index = ImageIndex.open(tmp_path / "idx")
    assert index.search("anything") == []


def test_workers_give_the_same_embeddings_as_in_process(tmp_path: Path, tiny_model: Path, collection: Collection) -> None:
    a = build_index(collection.root, tmp_path / "a", model=str(tiny_model), workers=0, batch_size=5)
    b = build_index(collection.root, tmp_path / "b", model=str(tiny_model), workers=2, batch_size=64)
    assert a.indexed == b.indexed and a.skipped == b.skipped
    ea, eb = ImageIndex.open(tmp_path / "a").vectors.embeddings(), ImageIndex.open(tmp_path / "b").vectors.embeddings()
    assert np.abs(ea - eb).max() < 1e-5


def test_in_process_decoding_on_threads_equals_a_worker_process(tmp_path: Path, tiny_model: Path, collection: Collection) -> None:
    from indexer.build import default_workers

    assert default_workers("cpu") == 0  # the CPU default decodes in-process, between batches
    common = dict(model=str(tiny_model), batch_size=7, precision="fp32", device="cpu")
    a = build_index(collection.root, tmp_path / "a", workers=0, threads=2, **common)
    b = build_index(collection.root, tmp_path / "b", workers=1, threads=2, **common)
    assert (a.workers, a.threads) == (0, 2)
    ia, ib = ImageIndex.open(tmp_path / "a"), ImageIndex.open(tmp_path / "b")
    assert ia.metadata.paths() == ib.metadata.paths() and a.skipped == b.skipped > 0
    assert [(s.path, s.reason) for s in ia.metadata.skipped()] == [(s.path, s.reason) for s in ib.metadata.skipped()]
    np.testing.assert_array_equal(ia.vectors.embeddings(), ib.vectors.embeddings())  # same pixels, same batches


def test_dataset_decodes_a_batch_on_threads_in_order(tiny_model: Path, collection: Collection) -> None:
    import pickle

    from indexer.dataset import ImageDataset
    from indexer.discover import discover
    from retrieval.encoders import HFClipEncoder

    files = discover(collection.root).files
    cfg = HFClipEncoder.load(str(tiny_model), device="cpu").preprocess
    serial = ImageDataset(collection.root, files, cfg)
    threaded = ImageDataset(collection.root, files, cfg, threads=3)
    threads_before = torch.get_num_threads()
    try:
        indices = list(range(len(files)))[::-1]
        got, want = threaded.__getitems__(indices), serial.__getitems__(indices)
        assert torch.get_num_threads() == threads_before  # decode threads use 1; the model keeps its own
        assert [it.index for it in got] == indices
        assert [it.error for it in got] == [it.error for it in want] and any(it.error for it in got)
        for g, w in zip(got, want, strict=True):
            assert (g.pixels is None and w.pixels is None) or torch.equal(g.pixels, w.pixels)
        copy = pickle.loads(pickle.dumps(threaded))  # what a worker process gets: no pool
        assert copy._pool is None and threaded._pool is not None and copy.threads == 3
    finally:
        threaded.close()
    assert threaded._pool is None


def test_stored_embedding_equals_single_image_encoding(built_index: Path, collection: Collection, tiny_model: Path) -> None:
    index = ImageIndex.open(built_index, device="cpu")
    enc = index.encoders.encoder
    paths = index.metadata.paths()
    emb = index.vectors.embeddings()
    for rel in ("photos/a.jpg", "formats/rgba.png", "formats/gray16.png", "exif/rotated_6.jpg"):
        pixels, _, _ = load_pixels(collection.root / rel, enc.preprocess)
        assert float(enc.embed_pixels(pixels[None])[0] @ emb[paths.index(rel)]) > 0.99999


@pytest.mark.parametrize("where", ["faiss", "publish", "manifest"])
def test_write_failure_keeps_previous_index(tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    import errno

    photos = tmp_path / "photos"
    photos.mkdir()
    photo_like(80, 60, 0).save(photos / "a.jpg")
    idx = tmp_path / "idx"
    build_index(photos, idx, model=str(tiny_model), workers=0)
    before = _snapshot(idx)
    photo_like(80, 60, 1).save(photos / "b.jpg")

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    import indexer.new_generation as new_generation

    # Fail while writing FAISS, while renaming the generation into place, or after that,
    # while switching the manifest.
    target = {
        "faiss": (new_generation.faiss_index, "write"),
        "publish": (new_generation, "publish_generation"),
        "manifest": (new_generation, "write_manifest"),
    }[where]
    monkeypatch.setattr(*target, disk_full)
    with pytest.raises(IndexDirError, match="No space left on device"):
        build_index(photos, idx, model=str(tiny_model), workers=0)
    assert _snapshot(idx) == before  # nothing left over, nothing changed
    assert len(ImageIndex.open(idx)) == 1


def test_reader_keeps_answering_after_a_rebuild(tmp_path: Path, tiny_model: Path) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(3):
        photo_like(80, 60, i).save(photos / f"{i}.jpg")
    idx = tmp_path / "idx"
    build_index(photos, idx, model=str(tiny_model), workers=0)
    old = ImageIndex.open(idx, device="cpu")
    (photos / "0.jpg").unlink()
    build_index(photos, idx, model=str(tiny_model), workers=0)
    assert len([p for p in idx.iterdir() if p.name.startswith("gen-")]) == 1  # old generation removed
    assert [h.path for h in old.search("x", k=5)] and len(old.metadata.skipped()) == 0  # files it opened still read
    assert len(old.vectors.embeddings()) == 3
    assert len(ImageIndex.open(idx)) == 2


def test_manifest_file_names_must_stay_inside_the_index(built_index: Path, tmp_path: Path) -> None:
    idx = _copy_index(built_index, tmp_path)
    manifest = json.loads((idx / "manifest.json").read_text())
    manifest["parts"][0]["path"] = "../../etc/passwd"
    manifest.pop(MANIFEST_DIGEST_KEY)
    (idx / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexFormatError, match="inside the index"):
        ImageIndex.open(idx)


def test_ties_at_the_cut_follow_the_id_rule(tmp_path: Path) -> None:
    # Five identical vectors tie; whatever k cuts them, the lowest ids come first.
    from retrieval import faiss_index

    vecs = np.tile(np.eye(4, dtype=np.float32)[0], (5, 1))
    vecs = np.vstack([np.eye(4, dtype=np.float32)[1], vecs])
    index = faiss_index.build(vecs)
    query = np.eye(4, dtype=np.float32)[:1]
    for k in range(1, 7):
        _, ids = faiss_index.search(index, query, k)
        assert ids[0].tolist() == [1, 2, 3, 4, 5, 0][:k]


def test_open_follows_a_generation_switched_under_it(tmp_path: Path, built_index: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A reader that read the manifest just before a writer switched it and removed that
    # generation: its files are gone, the manifest now names another one; open that instead.
    import dataclasses

    from retrieval import generation
    from retrieval.layout import read_manifest

    idx = tmp_path / "idx"
    shutil.copytree(built_index, idx)
    current = read_manifest(idx)
    gone = tuple(dataclasses.replace(p, path=f"gen-{'0' * 32}/gone.parquet") for p in current.parts)
    removed = dataclasses.replace(current, generation="0" * 32, parts=gone, checksums={})
    answers = iter([removed])
    monkeypatch.setattr(generation, "read_manifest", lambda path: next(answers, None) or read_manifest(path))
    assert ImageIndex.open(idx, device="cpu").manifest == current

    # The manifest unchanged: the files really are missing, and that is said.
    monkeypatch.setattr(generation, "read_manifest", lambda path: removed)
    with pytest.raises(IndexFormatError, match=r"gone.parquet is damaged \(missing\)"):
        ImageIndex.open(idx, device="cpu")
