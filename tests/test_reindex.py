"""``indexer.reindex``: building an approximate index from the stored vectors, tuning it to a target
recall (FAISS's exact top-k and ``tune``), recording the result, format 1 upgraded on write,
and ``clipsearch reindex``."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_here
from vector_indexes import DIM, ROWS, clustered, copy_of, exact_top

from indexer.index_types import IndexOptions
from indexer.reindex import reindex
from retrieval import ImageIndex, InvalidArgumentError, faiss_index
from retrieval.errors import IndexFormatError
from retrieval.layout import MANIFEST_DIGEST_KEY, PATHS_DIR, read_manifest


def test_auto_candidates_are_tried_until_one_reaches_the_target(
    vec_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import indexer.ann as ann
    from indexer.index_types import IndexPlan

    plans = [IndexPlan("IVF16,PQ2x4", "ivf", 2000, 0, "too coarse"), IndexPlan("IVF16,Flat", "ivf", 2000, 0, "exact lists")]
    monkeypatch.setattr(ann, "candidate_plans", lambda n, dim, options: plans)
    idx = copy_of(vec_index, tmp_path)
    reindex(idx, index_type="auto", target_recall=0.97)
    manifest = read_manifest(idx)
    assert manifest.index_type == "IVF16,Flat" and manifest.index_tuning["reached"]
    tried = manifest.index_tuning["tried"]
    assert [t["factory"] for t in tried] == ["IVF16,PQ2x4", "IVF16,Flat"] and not tried[0]["reached"]
    # An update keeps a fallback choice: it is still one of the candidates.
    assert not ann.needs_rebuild("IVF16,Flat", ROWS + 10, DIM, IndexOptions())


def test_search_params_validated_in_manifest(vec_index: Path, tmp_path: Path) -> None:
    idx = copy_of(vec_index, tmp_path)
    data = json.loads((idx / "manifest.json").read_text())
    data.pop(MANIFEST_DIGEST_KEY)  # hand-edited: a stale digest would be reported as damage first
    data["search_params"] = {"nprobe": 0}
    (idx / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(IndexFormatError, match="search parameter"):
        ImageIndex.open(idx)


@pytest.mark.parametrize(
    "index_type,factory_start",
    [
        ("hnsw", "HNSW32"),
        ("ivf-sq8", "IVF"),
        ("ivf-pq", "IVF64,PQ8x6"),
        ("ivf-pq-refine", "IVF64,PQ4x6,Refine(SQfp16)"),
        ("ivf-sq4-refine", "IVF64,SQ4,Refine(SQfp16)"),
        ("IVF32,Flat", "IVF32,Flat"),
    ],
)
def test_reindex_builds_tunes_and_records(
    vec_index: Path,
    tmp_path: Path,
    vectors: np.ndarray,
    held_out: np.ndarray,
    index_type: str,
    factory_start: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    idx = copy_of(vec_index, tmp_path)
    tuned: list[tuple[np.ndarray, np.ndarray]] = []
    tune = faiss_index.tune

    def recording_tune(index, queries, truth, target, exclude=None, k=10):  # type: ignore[no-untyped-def]  # stand-in for faiss_index.tune
        tuned.append((queries.copy(), np.asarray(exclude).copy()))
        return tune(index, queries, truth, target, exclude=exclude, k=k)

    monkeypatch.setattr(faiss_index, "tune", recording_tune)
    report = reindex(idx, index_type=index_type, target_recall=0.9)
    monkeypatch.undo()
    manifest = read_manifest(idx)
    assert manifest.index_type.startswith(factory_start) and report.index_type == manifest.index_type
    assert manifest.index_options["index_type"] == index_type
    tuning = manifest.index_tuning
    knobs = {"efSearch"} if index_type == "hnsw" else {"nprobe", "k_factor"} if index_type.endswith("-refine") else {"nprobe"}
    assert set(manifest.search_params) == knobs
    index = ImageIndex.open(idx)
    assert index.info()["search_params"] == manifest.search_params
    # The recorded tuning recall, worked out here: the tuning queries (stored vectors) searched
    # in the index as written, against exact numpy search, each query's own row left out of both.
    [(tune_queries, own_ids)] = tuned
    assert tuning["queries"] == len(tune_queries) == 1000
    assert np.array_equal(tune_queries, vectors[own_ids])
    _, found = index.vectors.search_ids(tune_queries, 11)
    truth = exact_top(vectors, tune_queries, 11)
    overlaps = []
    for own, got, want in zip(own_ids.tolist(), found.tolist(), truth.tolist(), strict=True):
        got_10 = [i for i in got if i != own][:10]
        want_10 = [i for i in want if i != own][:10]
        overlaps.append(len(set(got_10) & set(want_10)) / 10)
    assert tuning["recall_at_10"] == round(float(np.mean(overlaps)), 4)
    # The recorded recall is what a reader gets: measure it on queries not in the index.
    queries = held_out
    _, ids = index.vectors.search_ids(queries, 10)
    truth = exact_top(vectors, queries, 10)
    measured = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids.tolist(), truth.tolist(), strict=True)])
    if index_type != "ivf-pq":  # PQ codes of 8 bytes cannot reach 0.9 here, and say so
        assert tuning["reached"] and tuning["recall_at_10"] >= 0.9
        assert measured >= 0.85, measured
    else:
        assert tuning["reached"] == (float(np.mean(overlaps)) >= 0.9)


def test_reindex_mmap_gives_the_same_answers(vec_index: Path, tmp_path: Path, vectors: np.ndarray) -> None:
    idx = copy_of(vec_index, tmp_path)
    reindex(idx, index_type="ivf-sq8")
    a = ImageIndex.open(idx, mmap=False).vectors.search_ids(vectors[:20], 10)
    b = ImageIndex.open(idx, mmap=True).vectors.search_ids(vectors[:20], 10)
    assert np.array_equal(a[1], b[1]) and np.allclose(a[0], b[0])


def test_reindex_bad_inputs(vec_index: Path, tmp_path: Path) -> None:
    idx = copy_of(vec_index, tmp_path)
    before = (idx / "manifest.json").read_text()
    with pytest.raises(InvalidArgumentError, match="FAISS cannot build"):
        reindex(idx, index_type="NotAFactory99")
    with pytest.raises(InvalidArgumentError):
        reindex(idx, max_memory="plenty")
    assert (idx / "manifest.json").read_text() == before  # nothing changed
    data = json.loads(before)
    data.pop(MANIFEST_DIGEST_KEY)
    data["complete"] = False
    (idx / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(IndexFormatError, match="interrupted build"):
        reindex(idx, index_type="hnsw")


def test_reindex_with_more_clusters_than_vectors_changes_nothing(vec_index: Path, tmp_path: Path) -> None:
    idx = copy_of(vec_index, tmp_path)
    before = (idx / "manifest.json").read_text()
    for factory, need in (("IVF4096,Flat", 4096), ("IVF16,PQ8x12", 4096)):
        with pytest.raises(InvalidArgumentError, match=f"needs at least {need} training vectors.*this index has {ROWS}.*auto"):
            reindex(idx, index_type=factory)
    proc = cli_here(["reindex", str(idx), "--index-type", "IVF4096,Flat", "--no-progress"])
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "'IVF4096,Flat' needs at least 4096 training vectors" in proc.stderr and "Traceback" not in proc.stderr
    assert (idx / "manifest.json").read_text() == before  # the option was not recorded
    # So a later run without --index-type keeps what the index had.
    reindex(idx)
    assert read_manifest(idx).index_options["index_type"] == json.loads(before)["index_options"]["index_type"] == "auto"


def test_version_1_index_is_read_and_upgraded_on_write(built_index: Path, tmp_path: Path) -> None:
    idx = copy_of(built_index, tmp_path)
    data = json.loads((idx / "manifest.json").read_text())
    data["format_version"] = 1
    for key in ("index_options", "search_params", "index_tuning", "checksums", MANIFEST_DIGEST_KEY):
        data.pop(key, None)
    for part in data["parts"]:
        part.pop("paths", None)
    (idx / "manifest.json").write_text(json.dumps(data))
    for gen in idx.glob("gen-*"):
        shutil.rmtree(gen / PATHS_DIR)
    old = ImageIndex.open(idx)
    expected = ImageIndex.open(built_index)
    q = expected.vectors.embeddings()[:3]
    assert [[h.path for h in r] for r in old.search_vectors(q, 5)] == [[h.path for h in r] for r in expected.search_vectors(q, 5)]
    # Written again (reindex): version 2, path files added, flat kept (the only v1 choice).
    reindex(idx)
    manifest = read_manifest(idx)
    assert manifest.format_version == 2 and manifest.index_type == "Flat" and manifest.index_options["index_type"] == "flat"
    assert all(p.paths is not None and (idx / p.paths).is_file() for p in manifest.parts)
    assert ImageIndex.open(idx).metadata.paths_of(range(3)) == expected.metadata.paths_of(range(3))


def test_cli_reindex_and_info(vec_index: Path, tmp_path: Path) -> None:
    idx = copy_of(vec_index, tmp_path)
    proc = cli_here(["reindex", str(idx), "--index-type", "hnsw", "--target-recall", "0.9", "--json", "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["index_type"] == "HNSW32" and report["index_tuning"]["recall_at_10"] >= 0.9
    info = json.loads(cli_here(["info", str(idx), "--json"]).stdout)
    assert info["index_type"] == "HNSW32" and info["search_params"] == report["search_params"]
    text = cli_here(["reindex", str(idx), "--index-type", "ivf-sq8", "--no-progress"])
    assert text.returncode == 0 and "reindexed 3000 vectors as IVF" in text.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["--index-type", "Bogus7"], "FAISS cannot build"),
        (["--max-memory", "lots"], "cannot read memory size"),
        (["--target-recall", "2"], "target recall"),
    ],
)
def test_cli_reindex_bad_inputs(vec_index: Path, tmp_path: Path, args: list[str], message: str) -> None:
    idx = copy_of(vec_index, tmp_path)
    proc = cli_here(["reindex", str(idx), *args])
    assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    missing = cli_here(["reindex", str(tmp_path / "nothing")])
    assert missing.returncode == 1 and "not a clipsearch index" in missing.stderr


def _chunks(vectors: np.ndarray, step: int) -> Iterator[tuple[int, np.ndarray]]:
    for start in range(0, len(vectors), step):
        yield start, vectors[start : start + step]


def test_exact_top_k_over_chunks_equals_brute_force(vectors: np.ndarray) -> None:
    queries = clustered(7, DIM, seed=5)
    exact = faiss_index.ExactTopK(queries, 11)
    for first, chunk in _chunks(vectors, 333):
        exact.add(first, chunk)
    _, ids = exact.result()
    assert ids.tolist() == exact_top(vectors, queries, 11).tolist()


def test_tuning_stops_when_compressed_codes_cap_recall(vectors: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    index = faiss_index.create("IVF64,PQ2x4", DIM)
    faiss_index.train(index, vectors)
    faiss_index.add(index, vectors)
    queries = vectors[:200]
    exact = faiss_index.ExactTopK(queries, 11)
    exact.add(0, vectors)
    tried: list[int] = []
    real = faiss_index.set_search_params
    monkeypatch.setattr(faiss_index.tuning, "set_search_params", lambda idx, p: (tried.append(p.get("nprobe", 0)), real(idx, p)))
    params, recall, reached = faiss_index.tune(index, queries, exact.result()[1], 0.999, exclude=np.arange(200))
    assert not reached and recall < 0.999 and params["nprobe"] in tried
    # 2 bytes per vector plateau early: the search stops long before a full scan (nprobe 64).
    assert max(tried) < 64, tried
