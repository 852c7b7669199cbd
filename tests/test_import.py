"""``clipsearch import``: an index from embeddings computed elsewhere (clip-retrieval output, Parquet).

Every test runs the command in-process (``clipsearch.cli.main``) on sources written to
``tmp_path``, with the tiny random CLIP checkpoint (48-d) of conftest as the model.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clipsearch.cli import main
from indexer import import_embeddings, import_sources
from retrieval.errors import IndexCorruptError
from retrieval.index import ImageIndex
from retrieval.layout import read_manifest, write_manifest

DIM = 48  # the tiny model's


def _unit(vectors: np.ndarray) -> np.ndarray:
    x = np.asarray(vectors, np.float64)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _clip_retrieval(root: Path, shards: dict[int, np.ndarray], paths: dict[int, Sequence[str]] | None = None) -> Path:
    """clip-retrieval's inference output: img_emb/img_emb_N.npy + metadata/metadata_N.parquet."""
    (root / "img_emb").mkdir(parents=True)
    (root / "metadata").mkdir()
    (root / "text_emb").mkdir()  # written by clip-retrieval too, not ours to read
    for n, vectors in shards.items():
        np.save(root / "img_emb" / f"img_emb_{n}.npy", vectors)
        names = paths[n] if paths is not None else [f"/data/shard{n}/img_{j:03d}.jpg" for j in range(len(vectors))]
        table = pa.table({"image_path": pa.array(names, pa.string()), "caption": [f"caption {j}" for j in range(len(names))]})
        pq.write_table(table, root / "metadata" / f"metadata_{n}.parquet")
    return root


def _parquet(path: Path, paths: Sequence[str | None], vectors: np.ndarray, kind: str = "list") -> Path:
    """A Parquet file with ``path`` and ``embedding`` (``list`` or ``fixed`` size list)."""
    values = pa.array(np.asarray(vectors).reshape(-1))
    d = vectors.shape[1]
    if kind == "fixed":
        embedding: pa.Array = pa.FixedSizeListArray.from_arrays(values, d)
    else:
        embedding = pa.ListArray.from_arrays(pa.array(np.arange(0, len(values) + 1, d, dtype=np.int32)), values)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"path": pa.array(paths, pa.string()), "embedding": embedding}), path)
    return path


def _import(capsys: pytest.CaptureFixture[str], source: Path, out: Path, model: Path, *extra: str) -> tuple[int, str, str]:
    rc = main(["import", str(source), str(out), "--model", str(model), "--no-progress", *extra])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _stored(index: ImageIndex) -> tuple[list[str], np.ndarray]:
    rows = index.rows(list(range(index.count)), columns=("path", "embedding"))
    return [r["path"] for r in rows], np.asarray([r["embedding"] for r in rows], np.float32)


# -- the two layouts --------------------------------------------------------------------------


def test_clip_retrieval_output_becomes_a_searchable_index(tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    # Shards 2 and 10: numeric order, where name order would put img_emb_10 first.
    shards = {10: rng.standard_normal((5, DIM)).astype(np.float16), 2: rng.standard_normal((7, DIM)).astype(np.float16)}
    source = _clip_retrieval(tmp_path / "cr", shards)
    out = tmp_path / "idx"
    options = ["--index-type", "flat", "--max-memory", "1GB", "--target-recall", "0.9", "--commit-every", "4"]
    rc, stdout, err = _import(capsys, source, out, tiny_model, "--json", *options)
    assert rc == 0, err
    report = json.loads(stdout)
    assert report["imported"] == 12 and report["dim"] == DIM and report["source_format"] == "clip-retrieval"
    assert report["index_type"] == "flat" and report["factory"] == "Flat" and report["commits"] == 3
    assert report["model"] == str(tiny_model) and report["rows_per_second"] > 0

    index = ImageIndex.open(out)
    assert dict(index.manifest.index_options) == {"index_type": "flat", "max_memory": 1 << 30, "target_recall": 0.9}
    inputs = np.concatenate([shards[2], shards[10]])
    expected_paths = [f"/data/shard2/img_{j:03d}.jpg" for j in range(7)] + [f"/data/shard10/img_{j:03d}.jpg" for j in range(5)]
    paths, stored = _stored(index)
    assert index.count == 12 and paths == expected_paths
    assert [r["id"] for r in index.rows(list(range(12)), columns=("id",))] == list(range(12))
    unit = _unit(inputs)
    np.testing.assert_allclose(stored, unit, atol=1e-6)
    # Rows have no file behind them: honest blanks, and no folder to serve originals from.
    row = index.rows([0], columns=("width", "height", "size", "content_hash"))[0]
    assert (row["width"], row["height"], row["size"], row["content_hash"]) == (0, 0, -1, "")
    assert index.manifest.source_root == ""
    with pytest.raises(IndexCorruptError):
        index.files.path(0)  # what serve's /api/images/{id} turns into a 404

    # Vector search ranks exactly as brute force over the normalised inputs.
    query = _unit(rng.standard_normal((1, DIM)))[0]
    hits = index.search_vectors(query[None], k=12)[0]
    brute = np.argsort(-(unit @ query), kind="stable")
    assert [h.id for h in hits] == brute.tolist()
    np.testing.assert_allclose([h.score for h in hits], (unit @ query)[brute], atol=1e-5)

    # Text queries run with the model named at import.
    assert main(["search", str(out), "a photo of a cat", "-k", "3", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["results"]) == 3

    assert main(["info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["imported_from"] == "clip-retrieval" and info["imported_source"] == str(source.resolve())
    assert info["model_info"]["imported_from"] == "clip-retrieval"
    assert main(["verify", str(out)]) == 0
    assert "ok" in capsys.readouterr().out


def test_parquet_parts_in_natural_order_list_and_fixed_size(tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(1)
    parts = {
        "part-2.parquet": ("list", rng.standard_normal((4, DIM)).astype(np.float32)),
        "part-10.parquet": ("fixed", rng.standard_normal((3, DIM)).astype(np.float16)),
        "part-1.parquet": ("list", rng.standard_normal((2, DIM))),  # float64
    }
    source = tmp_path / "pq"
    for name, (kind, vectors) in parts.items():
        _parquet(source / name, [f"{name}/{j}.jpg" for j in range(len(vectors))], vectors, kind)
    (source / "_SUCCESS").write_text("")  # Spark's marker, ignored
    out = tmp_path / "idx"
    rc, stdout, err = _import(capsys, source, out, tiny_model)
    assert rc == 0, err
    assert "imported 9 vectors (parquet)" in stdout and err.count("\n") <= 1
    order = ["part-1.parquet", "part-2.parquet", "part-10.parquet"]
    paths, stored = _stored(ImageIndex.open(out))
    assert paths == [f"{name}/{j}.jpg" for name in order for j in range(len(parts[name][1]))]
    np.testing.assert_allclose(stored, _unit(np.concatenate([parts[name][1].astype(np.float64) for name in order])), atol=1e-6)
    assert read_manifest(out).model_info["imported_from"] == "parquet"


def test_one_parquet_file_read_in_small_batches_with_hnsw(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(import_sources, "BATCH_ROWS", 64)  # several batches per file, as a big file would be read
    n = 300  # hnsw needs at least MIN_ANN_ROWS (256) vectors, else flat is built
    rng = np.random.default_rng(2)
    vectors = rng.standard_normal((n, DIM)).astype(np.float32) * 1000
    source = _parquet(tmp_path / "emb.parquet", [f"p{j}" for j in range(n)], vectors, "fixed")
    report = import_embeddings(source, tmp_path / "idx", model=str(tiny_model), index_type="hnsw", commit_every=100)
    assert report.imported == n and report.index_type == "hnsw" and report.factory.startswith("HNSW")
    assert report.commits == 3 and "efSearch" in report.search_params  # at rows 128 and 256, then finish
    manifest = read_manifest(tmp_path / "idx")
    assert manifest.index_type == report.factory and manifest.index_options["index_type"] == "hnsw"
    index = ImageIndex.open(tmp_path / "idx")
    paths, stored = _stored(index)
    assert paths == [f"p{j}" for j in range(n)]
    np.testing.assert_allclose(stored, _unit(vectors), atol=1e-6)
    assert [h.id for h in index.search_vectors(stored[5:6], k=1)[0]] == [5]


# -- bad input: one line, exit 1, nothing written ---------------------------------------------


def _vectors(n: int, seed: int = 0, dtype: type = np.float16) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(dtype)


def _with(vectors: np.ndarray, row: int, value: float) -> np.ndarray:
    """``vectors`` with row ``row`` all zeros (``value`` 0) or holding ``value`` once."""
    vectors = vectors.copy()
    if value == 0:
        vectors[row] = 0
    else:
        vectors[row, 5] = value
    return vectors


def _table(root: Path, table: pa.Table) -> Path:
    root.mkdir()
    pq.write_table(table, root / "a.parquet")
    return root / "a.parquet"


def _bad_npy(root: Path) -> Path:
    source = _clip_retrieval(root, {0: _vectors(3)})
    (source / "img_emb" / "img_emb_0.npy").write_bytes(b"not an array")
    return source


def _no_image_path(root: Path) -> Path:
    source = _clip_retrieval(root, {0: _vectors(3)})
    pq.write_table(pa.table({"url": ["a", "b", "c"]}), source / "metadata" / "metadata_0.parquet")
    return source


def _missing_metadata(root: Path) -> Path:
    source = _clip_retrieval(root, {0: _vectors(3), 1: _vectors(2)})
    (source / "metadata" / "metadata_1.parquet").unlink()
    return source


def _empty_dir(root: Path) -> Path:
    root.mkdir()
    (root / "notes.txt").write_text("nothing to import")
    return root


BAD_SOURCES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "missing": (lambda root: root / "nowhere", "nowhere: no such file or directory"),
    "neither layout (a file)": (lambda root: _empty_dir(root) / "notes.txt", "notes.txt: not a Parquet file"),
    "neither layout (a folder)": (_empty_dir, "holds neither img_emb/ nor *.parquet files"),
    "empty clip-retrieval": (lambda root: _clip_retrieval(root, {0: _vectors(0)}), "holds no rows"),
    "empty parquet": (lambda root: _parquet(root / "e.parquet", [], _vectors(0), "fixed"), "holds no rows"),
    "no img_emb files": (lambda root: _clip_retrieval(root, {}), "img_emb: holds no img_emb_N.npy files"),
    "npy unreadable": (_bad_npy, "img_emb_0.npy: not a readable .npy file"),
    "dim": (lambda root: _clip_retrieval(root, {0: np.zeros((2, 32), np.float16)}), "img_emb_0.npy: holds 32-d vectors, but"),
    "dim of fixed_size_list": (
        lambda root: _parquet(root / "a.parquet", ["x"], np.ones((1, 32), np.float32), "fixed"),
        "a.parquet: holds 32-d vectors",
    ),
    "dim of one list": (
        lambda root: _parquet(root / "a.parquet", ["x", "y"], np.ones((2, 24), np.float32)),  # 48 values: 2 lists of 24
        "a.parquet: row 0: embedding has 24 values, but the model's vectors have 48",
    ),
    "row counts": (
        lambda root: _clip_retrieval(root, {0: _vectors(7)}, {0: [f"p{j}" for j in range(6)]}),
        "img_emb_0.npy: holds 7 vectors but metadata_0.parquet has 6 rows",
    ),
    "missing metadata file": (_missing_metadata, "img_emb_1.npy: has no metadata file"),
    "no image_path column": (_no_image_path, "metadata_0.parquet: has no 'image_path' column (columns: url)"),
    "no embedding column": (
        lambda root: _table(root, pa.table({"path": ["a"], "vec": [[1.0]]})),
        "a.parquet: has no 'embedding' column (columns: path, vec)",
    ),
    "embedding not floats": (
        lambda root: _table(root, pa.table({"path": ["a"], "embedding": ["x"]})),
        "column 'embedding' is string, not a list of float16, float32 or float64",
    ),
    "NaN in a later shard and batch": (
        lambda root: _clip_retrieval(root, {0: _vectors(4), 1: _with(_vectors(8, 1), 6, np.nan)}),
        "img_emb_1.npy: row 6: embedding holds NaN or inf",
    ),
    "inf": (
        lambda root: _parquet(root / "a.parquet", list("abcd"), _with(_vectors(4, 2, np.float32), 2, np.inf)),
        "a.parquet: row 2: embedding holds NaN or inf",
    ),
    "zero vector": (
        lambda root: _clip_retrieval(root, {0: _with(_vectors(5), 4, 0.0)}),
        "img_emb_0.npy: row 4: embedding is all zeros and cannot be normalised",
    ),
    "duplicate paths across shards": (
        lambda root: _clip_retrieval(root, {0: _vectors(3), 1: _vectors(4, 1)}, {0: ["a", "b", "c"], 1: ["d", "e", "b", "f"]}),
        "metadata_1.parquet: row 2: path 'b' is repeated (first at",
    ),
    "null path": (lambda root: _parquet(root / "a.parquet", ["a", None], _vectors(2, 0, np.float32)), "a.parquet: row 1: path is null"),
}


@pytest.mark.parametrize("case", list(BAD_SOURCES))
def test_bad_source_is_one_line_and_writes_nothing(
    case: str, tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(import_sources, "BATCH_ROWS", 4)  # a bad row in a later batch keeps its row number
    make, expected = BAD_SOURCES[case]
    source = make(tmp_path / "src")
    out = tmp_path / "idx"
    rc, stdout, err = _import(capsys, source, out, tiny_model)
    assert rc == 1 and stdout == ""
    assert err.startswith("clipsearch: error: ") and err.count("\n") == 1, err
    assert expected in err, err
    assert not out.exists()


def test_index_dir_must_be_new_or_empty(tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _parquet(tmp_path / "a.parquet", ["a", "b"], _vectors(2))
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    rc, _, err = _import(capsys, source, busy, tiny_model)
    assert rc == 1 and "busy exists and is not empty" in err and err.count("\n") == 1
    assert [p.name for p in busy.iterdir()] == ["keep.txt"]

    empty = tmp_path / "empty"
    empty.mkdir()
    assert _import(capsys, source, empty, tiny_model)[0] == 0
    rc, _, err = _import(capsys, source, empty, tiny_model)
    assert rc == 1 and "already holds a clipsearch index" in err
    assert ImageIndex.open(empty).count == 2

    # An import killed after a commit (complete=False) is started over, not refused.
    manifest = read_manifest(empty)
    write_manifest(empty, dataclasses.replace(manifest, complete=False))
    assert _import(capsys, _parquet(tmp_path / "b.parquet", ["c"], _vectors(1)), empty, tiny_model)[0] == 0
    assert read_manifest(empty).complete and ImageIndex.open(empty).count == 1


def test_index_refuses_an_imported_index_and_rebuild_replaces_it(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from PIL import Image

    source = _parquet(tmp_path / "a.parquet", ["x.png", "y.png"], _vectors(2))
    out = tmp_path / "idx"
    assert _import(capsys, source, out, tiny_model)[0] == 0
    photos = tmp_path / "photos"
    photos.mkdir()
    for name, color in (("x.png", "red"), ("z.png", "blue")):
        Image.new("RGB", (32, 32), color).save(photos / name)
    before = read_manifest(out)

    rc = main(["index", str(photos), str(out), "--model", str(tiny_model), "--no-progress", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1
    assert "was made by `clipsearch import` from parquet embeddings" in err and "--rebuild" in err
    assert read_manifest(out) == before

    # Reindexing only rebuilds FAISS from the stored vectors: allowed, and still marked imported.
    assert main(["reindex", str(out), "--index-type", "flat", "--no-progress"]) == 0
    assert read_manifest(out).model_info["imported_from"] == "parquet"
    capsys.readouterr()

    rc = main(["index", str(photos), str(out), "--model", str(tiny_model), "--no-progress", "--device", "cpu", "--rebuild"])
    assert rc == 0, capsys.readouterr().err
    rebuilt = read_manifest(out)
    assert "imported_from" not in rebuilt.model_info and rebuilt.source_root == str(photos.resolve())
    assert sorted(_stored(ImageIndex.open(out))[0]) == ["x.png", "z.png"]


def test_serve_searches_an_imported_index_and_serves_no_files(tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from clipsearch.server.app import create_app

    source = _parquet(tmp_path / "a.parquet", ["/etc/passwd", "../x.jpg"], _vectors(2))
    out = tmp_path / "idx"
    assert _import(capsys, source, out, tiny_model)[0] == 0
    with TestClient(create_app([out], cache_dir=tmp_path / "cache", warm=False, device="cpu")) as client:
        found = client.get("/api/search", params={"q": "a cat", "k": 2})
        assert found.status_code == 200 and len(found.json()["results"]) == 2
        for url in ("/api/images/0", "/api/images/1", "/api/thumbnails/0?size=256"):
            assert client.get(url).status_code == 404, url
        assert "imported from embeddings" in client.get("/api/images/0").json()["error"]
