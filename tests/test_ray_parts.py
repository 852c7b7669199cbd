"""Parts written by Ray actors and linked by the driver (:mod:`indexer.ray_parts`, format 4).

The format and the linking first, through the indexer's own write path without Ray or a model;
then Ray builds (one embedded Ray for the module) whose actors write their parts: the same index
as the driver writes and the fallback where the index directory is out of an actor's reach (a driver
killed between an actor's write and its link is test_ray's cluster test).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import local_ray
from imagegen import write_photos
from vector_indexes import DIM, clustered, records, write_vectors_index

from indexer import build_index, ray_parts
from indexer.commit import GenerationWriter, IndexMeta
from indexer.dataset import Item
from indexer.embed import EmbeddedBatch
from indexer.lock import IndexLock
from indexer.parts import MERGE_MIN_PARTS, WrittenPart
from indexer.ray_parts import Stage, by_part, part_columns, write_part
from indexer.sides.registry import side_writers
from retrieval import ImageIndex, verify_index
from retrieval.errors import EngineError, IndexCorruptError, IndexFormatError, UnsupportedFormatError
from retrieval.layout import STAGING_PREFIX, Manifest, PartRef, manifest, read_manifest

ROWS = 60


def _meta() -> IndexMeta:
    return IndexMeta(
        model="synthetic", model_fingerprint="sha256:" + "0" * 64, backend="hf", dim=DIM,
        preprocess={"shortest_edge": 8, "crop_size": [8, 8], "resample": 3, "mean": [0.5] * 3, "std": [0.5] * 3,
                    "rescale_factor": 1 / 255},
        source_root="synthetic", index_options={"index_type": "auto"},
    )


def _linked_index(out: Path, vectors: np.ndarray, chunk: int, finish: bool = True) -> Manifest:
    """``vectors`` as parts written into a stage (as actors write them) and linked by the writer."""
    out.mkdir(parents=True)
    with IndexLock(out):
        writer = GenerationWriter(out, _meta(), None, side_writers)
        stage = Stage(writer, required=False)
        for start in range(0, len(vectors), chunk):
            part = write_part(stage.dir, records(start, min(chunk, len(vectors) - start)), vectors[start: start + chunk], DIM, False)
            writer.adopt_part(stage.dir / part.name, part.rows, part.file_id)
            writer.commit()
            assert stage.dir.is_dir(), "a commit removed the run's live staging folder"
        stage.release()
        writer.finish() if finish else writer.commit()
    return read_manifest(out)


def _staging(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith(STAGING_PREFIX))


def test_linked_parts_read_as_the_driver_writes_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vectors = clustered(ROWS, DIM, seed=4)
    driver = tmp_path / "driver.idx"
    write_vectors_index(driver, vectors, commit_every=20)
    linked = _linked_index(tmp_path / "linked.idx", vectors, chunk=20)
    # Three parts (fewer than a merge takes): the second and third keep their stored ids 0..19.
    assert 3 < MERGE_MIN_PARTS
    assert [(p.first_id, p.id_offset) for p in linked.parts] == [(0, 0), (20, 20), (40, 40)]
    assert linked.format_version == 4 and read_manifest(driver).format_version == 2
    data = json.loads((tmp_path / "linked.idx" / "manifest.json").read_text())
    assert [p.get("id_offset") for p in data["parts"]] == [None, 20, 40]  # left out where 0
    assert _staging(tmp_path / "linked.idx") == []
    a, b = ImageIndex.open(driver), ImageIndex.open(tmp_path / "linked.idx")
    assert b.rows(range(ROWS), columns=("id", "path", "mtime_ns")) == a.rows(range(ROWS), columns=("id", "path", "mtime_ns"))
    assert b.rows([45, 3], columns=("id",)) == [{"id": 45}, {"id": 3}]
    assert b.vectors.embeddings().tobytes() == a.vectors.embeddings().tobytes()
    assert b.metadata.paths_of([59, 0, 21]) == a.metadata.paths_of([59, 0, 21])
    assert np.array_equal(b.vectors.search_ids(vectors[[7, 33, 58]], 3)[1], a.vectors.search_ids(vectors[[7, 33, 58]], 3)[1])
    report = verify_index(tmp_path / "linked.idx")
    assert report.ok, report.problems
    # A reader of version 3 refuses it, saying to upgrade; it still reads the driver's index.
    monkeypatch.setattr(manifest, "FORMAT_VERSION", 3)
    with pytest.raises(UnsupportedFormatError, match="format version 4, newer than this clipsearch reads .*upgrade clipsearch"):
        read_manifest(tmp_path / "linked.idx")
    assert read_manifest(driver).count == ROWS


def test_merging_linked_parts_renumbers_them(tmp_path: Path) -> None:
    """finish() merges runs of small parts, rewriting their ids absolute: format 2 again."""
    vectors = clustered(ROWS, DIM, seed=5)
    merged = _linked_index(tmp_path / "m.idx", vectors, chunk=ROWS // MERGE_MIN_PARTS)
    assert [(p.first_id, p.rows, p.id_offset) for p in merged.parts] == [(0, ROWS, 0)]
    assert merged.format_version == 2
    assert ImageIndex.open(tmp_path / "m.idx").vectors.embeddings().tobytes() == vectors.tobytes()
    assert verify_index(tmp_path / "m.idx").ok


def test_a_linked_index_is_updated_and_reindexed(tmp_path: Path) -> None:
    """An update that drops a row rewrites the parts from it on with absolute ids; reindex keeps
    the linked parts (and their offsets) as they are."""
    from indexer.reindex import reindex

    vectors = clustered(ROWS, DIM, seed=8)
    out = tmp_path / "u.idx"
    first = _linked_index(out, vectors, chunk=20)
    reindex(out, index_type="hnsw")
    again = read_manifest(out)
    assert [(p.first_id, p.id_offset) for p in again.parts] == [(p.first_id, p.id_offset) for p in first.parts]
    assert again.generation != first.generation and again.format_version == 4 and verify_index(out).ok
    keep = np.array([i for i in range(ROWS) if i != 25], np.int64)
    with IndexLock(out):
        writer = GenerationWriter(out, dataclasses.replace(_meta(), index_options=dict(again.index_options)), again, side_writers)
        writer.compact(keep, {})
        writer.finish()
    updated = read_manifest(out)
    # The first part (ids 0..19) is kept; the rest is rewritten as one part of absolute ids.
    assert [(p.first_id, p.rows, p.id_offset) for p in updated.parts] == [(0, 20, 0), (20, 39, 0)]
    assert updated.format_version == 2 and verify_index(out).ok
    index = ImageIndex.open(out)
    assert index.vectors.embeddings().tobytes() == vectors[keep].tobytes()
    assert index.metadata.paths_of([24, 25]) == [records(24, 1)[0].path.decode(), records(26, 1)[0].path.decode()]


def test_a_linked_part_with_other_ids_is_refused(tmp_path: Path) -> None:
    """Open and verify check the stored ids against first_id - id_offset."""
    out = tmp_path / "bad.idx"
    vectors = clustered(30, DIM, seed=6)
    _linked_index(out, vectors, chunk=10, finish=False)
    data = json.loads((out / "manifest.json").read_text())
    m = read_manifest(out)
    # The second part's entry made to claim absolute stored ids: its file stores 0..9.
    parts = [dataclasses.replace(p, id_offset=0) if i == 1 else p for i, p in enumerate(m.parts)]
    manifest.write_manifest(out, dataclasses.replace(m, parts=tuple(parts)))
    with pytest.raises(IndexCorruptError, match=r"ids are not 10\.\.19 in row order"):
        ImageIndex.open(out)
    problems = verify_index(out).problems
    assert len(problems) == 1 and problems[0].file == m.parts[1].path and "are not 10..19" in problems[0].detail
    assert data["format_version"] == 4


def test_manifest_checks_id_offsets() -> None:
    with pytest.raises(ValueError, match="id_offset must be an integer in 0..first_id"):
        PartRef("gen-x/embeddings/part-00001.parquet", 5, 5, "a" * 32, id_offset=6)
    with pytest.raises(ValueError, match="id_offset must be an integer"):
        PartRef("gen-x/embeddings/part-00001.parquet", 5, 5, "a" * 32, id_offset=True)
    parts = (PartRef("gen-x/embeddings/part-00000.parquet", 5, 0, "a" * 32),
             PartRef("gen-x/embeddings/part-00001.parquet", 5, 5, "b" * 32, id_offset=5))
    base = dict(model="m", model_fingerprint="f", backend="hf", dim=4, count=10, skipped=0, preprocess={}, index_type="Flat",
                generation="x", source_root="/", created="t", tool_version="0", parts=parts, faiss=None,
                skipped_file="gen-x/skipped.parquet")
    good = Manifest(**base, format_version=4)  # type: ignore[arg-type]
    assert Manifest.from_dict(good.to_dict()) == good
    data = good.to_dict()
    data["format_version"] = 3
    with pytest.raises(IndexFormatError, match="parts with an id_offset need format version 4"):
        Manifest.from_dict(data)
    assert manifest.format_version_for("Flat", parts) == 4 and manifest.format_version_for("Flat", parts[:1]) == 2


def _item(i: int, error: str | None = None) -> Item:
    return Item(i, None, 8, 8, error, 0.0, 100 + i, i, f"{i:032x}")


def test_stage_links_in_order_and_writes_what_an_actor_sent_back(tmp_path: Path) -> None:
    """Parts an actor wrote are linked as they are; rows an actor sent back (it could not reach
    the folder) are written by the driver; a part delivered in two pieces is linked once."""
    vectors = clustered(12, DIM, seed=7)
    files = [r.path for r in records(0, 12)]
    out = tmp_path / "s.idx"
    out.mkdir()
    with IndexLock(out):
        writer = GenerationWriter(out, _meta(), None, side_writers)
        stage = Stage(writer, required=False)
        first = write_part(stage.dir, records(0, 4), vectors[:4], DIM, False)
        from indexer.discover import ImageFile

        plan_files = [ImageFile(p, 100 + i, i) for i, p in enumerate(files)]
        batches = [
            EmbeddedBatch([_item(0), _item(1)], None, 0, 0, part=first),
            EmbeddedBatch([_item(2), _item(3)], None, 0, 0, part=first),  # the same part's rest
            EmbeddedBatch([_item(4), _item(5, "broken"), _item(6), _item(7), _item(8)], vectors[4:8], 0, 0),  # sent back
            EmbeddedBatch([_item(9, "broken")], None, 0, 0),
        ]
        out_batches = list(stage.link(batches, plan_files, False, DIM))
        assert [b.linked for b in out_batches] == [True, True, True, False]
        assert all(b.vectors is None for b in out_batches)
        assert (stage.by_actors, stage.by_driver, stage.written_by) == (1, 1, "actors+driver")
        stage.release()
        m = writer.commit(complete=False)
    assert [(p.first_id, p.rows, p.id_offset) for p in m.parts] == [(0, 4, 0), (4, 4, 4)]
    index = ImageIndex.open(out)
    assert index.metadata.paths_of(range(8)) == [f.decode() for f in files[:5] + files[6:9]]
    assert index.vectors.embeddings().tobytes() == vectors[:8].tobytes()
    assert _staging(out) == []


def test_by_part_splits_a_block_of_two_answers() -> None:
    a, b = part_columns(WrittenPart("embeddings/a.parquet", 2, "a"), 2), part_columns(None, 1)
    c = part_columns(WrittenPart("embeddings/c.parquet", 3, "c"), 3)
    block = {k: np.concatenate([a[k], b[k], c[k]]) for k in a}
    block["index"] = np.arange(6)
    pieces = by_part(block)
    assert [list(p["index"]) for p in pieces] == [[0, 1], [2], [3, 4, 5]]
    assert [ray_parts.part_of(p) for p in pieces] == [ray_parts.part_of(a), None, ray_parts.part_of(c)]


# -- Ray builds ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_local() -> Iterator[str]:
    with local_ray() as address:
        yield address


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_photos(tmp_path_factory.mktemp("ray_parts") / "photos", 22, size=lambda i: (70 + i % 5, 60 + i % 3))
    (root / "broken.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    return root


@pytest.fixture(scope="module")
def driver_written(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, photos: Path, ray_local: str) -> Path:
    """The reference: a build whose actors do not see the driver's probe (the index directory on
    another file system), so that ``auto`` falls back to the driver writing every row. An explicit
    ``ray_write="driver"`` writes the same index as the actors: bench_shards' Ray write smoke test."""
    base = tmp_path_factory.mktemp("ray_driver")
    made = Stage.__init__

    def elsewhere(self: Stage, writer: GenerationWriter, required: bool) -> None:
        made(self, writer, required)
        self.ref = dataclasses.replace(self.ref, path=str(base / "not-on-this-node").encode())

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Stage, "__init__", elsewhere)
        out = base / "driver.idx"
        report = build_index(photos, out, model=str(tiny_model), engine="ray", actors=2, cpus_per_actor=1, batch_size=4,
                             commit_every=8)
        assert report.ray_write == "driver"
        strict = base / "strict.idx"
        refused = r"^node \S+ cannot reach the index directory \S+strict.idx to write its parts; use --ray-write"
        with pytest.raises(EngineError, match=refused):
            build_index(photos, strict, model=str(tiny_model), engine="ray", actors=2, cpus_per_actor=1, batch_size=4,
                        ray_write="actors")
        assert not strict.exists()  # a new index that failed leaves nothing
    return out


def _assert_same(a: Path, b: Path) -> None:
    ia, ib = ImageIndex.open(a), ImageIndex.open(b)
    assert len(ia) == len(ib)
    assert ib.rows(range(len(ib)), columns=("id", "path")) == ia.rows(range(len(ia)), columns=("id", "path"))
    assert ib.vectors.embeddings().tobytes() == ia.vectors.embeddings().tobytes()
    assert sorted((s.path, s.reason) for s in ib.metadata.skipped()) == sorted((s.path, s.reason) for s in ia.metadata.skipped())
    queries = ia.vectors.embeddings()[[0, 5, 11]]
    assert np.array_equal(ib.vectors.search_ids(queries, 4)[1], ia.vectors.search_ids(queries, 4)[1])
    assert verify_index(b).ok
    assert _staging(b) == []


def test_actor_written_equals_driver_written(tmp_path: Path, tiny_model: Path, photos: Path, driver_written: Path) -> None:
    out = tmp_path / "actors.idx"
    report = build_index(photos, out, model=str(tiny_model), engine="ray", actors=2, cpus_per_actor=1, batch_size=4,
                         commit_every=8)
    assert report.ray_write == "actors" and report.to_dict()["ray_write"] == "actors"
    m = read_manifest(out)
    # 23 files in parts of 8 (two model calls each), the broken one (the first) skipped: ids linked 0, 7, 15.
    assert m.format_version == 4 and [(p.first_id, p.id_offset) for p in m.parts] == [(0, 0), (7, 7), (15, 15)]
    _assert_same(driver_written, out)


def test_unreachable_index_dir_falls_back_to_the_driver(driver_written: Path) -> None:
    """Actors that do not see the driver's probe send their rows back (``auto``), and refuse
    with one line where ``--ray-write actors`` was asked for (both in the fixture)."""
    assert read_manifest(driver_written).complete
    assert verify_index(driver_written).ok and _staging(driver_written) == []
