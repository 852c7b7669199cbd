"""Approximate indexes: planning, streaming builds, tuning, filters, reindex, format 2."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from imagegen import Collection

from indexer.commit import GenerationWriter, IndexMeta
from indexer.lock import IndexLock
from indexer.parts import MERGE_MIN_PARTS
from indexer.reindex import reindex
from indexer.writer import FileRecord
from retrieval import ImageIndex, InvalidArgumentError, faiss_index
from retrieval.errors import IndexFormatError
from retrieval.filters import Filter, parse_time
from retrieval.index_types import IndexOptions, ivf_lists, parse_memory, plan_index
from retrieval.layout import MANIFEST_DIGEST_KEY, PATHS_DIR, read_manifest

DIM = 32
ROWS = 3000


def clustered(n: int, dim: int, seed: int = 0, clusters: int = 30, noise: float = 0.8) -> np.ndarray:
    """L2-normalised vectors around random centres: clustered like real embeddings."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    x = centres[rng.integers(0, clusters, n)] / np.sqrt(dim) * 3 + rng.standard_normal((n, dim)).astype(np.float32) * noise / np.sqrt(dim)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def records(start: int, n: int) -> list[FileRecord]:
    # Paths in 5 folders; widths 100..149; mtimes = id (ns).
    return [
        FileRecord(f"dir{i % 5}/img{i:05d}.jpg".encode(), 100 + i % 50, 60 + i % 7, 1000 + i, i, f"{i:032x}")
        for i in range(start, start + n)
    ]


def write_vectors_index(out: Path, vectors: np.ndarray, commit_every: int, options: dict | None = None) -> None:
    """An index of ``vectors`` through the indexer's own write path (no images, no model)."""
    meta = IndexMeta(
        model="synthetic",
        model_fingerprint="sha256:" + "0" * 64,
        backend="hf",
        dim=vectors.shape[1],
        preprocess={"shortest_edge": 8, "crop_size": [8, 8], "resample": 3, "mean": [0.5] * 3, "std": [0.5] * 3, "rescale_factor": 1 / 255},
        source_root="synthetic",
        index_options=options or {"index_type": "auto"},
    )
    out.mkdir(parents=True)
    with IndexLock(out):
        writer = GenerationWriter(out, meta, None)
        for start in range(0, len(vectors), commit_every):
            chunk = vectors[start : start + commit_every]
            writer.append(records(start, len(chunk)), chunk)
            writer.commit()
        writer.finish()


@pytest.fixture(scope="module")
def drawn() -> np.ndarray:
    return clustered(ROWS + 200, DIM)


@pytest.fixture(scope="module")
def vectors(drawn: np.ndarray) -> np.ndarray:
    return drawn[:ROWS]


@pytest.fixture(scope="module")
def held_out(drawn: np.ndarray) -> np.ndarray:
    """Queries from the collection's distribution that are not in the index."""
    return drawn[ROWS:]


@pytest.fixture(scope="module")
def vec_index(tmp_path_factory: pytest.TempPathFactory, vectors: np.ndarray) -> Path:
    out = tmp_path_factory.mktemp("ann") / "vec.idx"
    write_vectors_index(out, vectors, commit_every=250)
    return out


def copy_of(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy.idx"
    shutil.copytree(src, dst)
    return dst


def exact_top(vectors: np.ndarray, queries: np.ndarray, k: int, allowed: np.ndarray | None = None) -> np.ndarray:
    scores = queries @ vectors.T
    if allowed is not None:
        scores[:, ~allowed] = -np.inf
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


# -- planning ----------------------------------------------------------------------------------


def test_auto_plan_follows_size_and_memory() -> None:
    assert plan_index(1000, 512, IndexOptions()).factory == "Flat"
    assert plan_index(50_000, 512, IndexOptions()).factory == "Flat"
    hnsw = plan_index(500_000, 512, IndexOptions())
    assert hnsw.factory == "HNSW32" and hnsw.estimated_bytes < 4 * 2**30
    # Past HNSW_AUTO_MAX_ROWS, IVF over full vectors first: no HNSW graph built to be discarded.
    ivf = plan_index(500_001, 512, IndexOptions())
    assert ivf.factory == "IVF2048,Flat" and "HNSW is not tried above 500,000 vectors" in ivf.reason
    sq8 = plan_index(10_000_000, 512, IndexOptions(max_memory=parse_memory("8GB")))
    assert sq8.factory == "IVF8192_HNSW32,SQ8" and sq8.train_rows <= 400_000
    pq = plan_index(10_000_000, 512, IndexOptions(max_memory=parse_memory("1GB")))
    assert pq.factory == "IVF8192_HNSW32,PQ64,Refine(SQfp16)" and pq.estimated_bytes <= 2**30
    # The budget counts the resident codes; the float16 vectors are mapped on top.
    assert pq.mapped_bytes == 10_000_000 * 512 * 2 and "re-ranked" in pq.reason
    # At the default 4 GB, 10M vectors get 4-bit codes re-ranked (full or 8-bit vectors do not fit).
    sq4 = plan_index(10_000_000, 512, IndexOptions())
    assert sq4.factory == "IVF8192_HNSW32,SQ4,Refine(SQfp16)" and sq4.estimated_bytes < 2.6 * 2**30
    tight = plan_index(10_000_000, 512, IndexOptions(max_memory=parse_memory("500MB")))
    assert tight.factory == "IVF8192_HNSW32,PQ32,Refine(SQfp16)" and tight.estimated_bytes <= parse_memory("500MB")
    with pytest.raises(InvalidArgumentError, match="raise --max-memory"):
        plan_index(10_000_000, 512, IndexOptions(max_memory=parse_memory("10MB")))
    # Named types with too few vectors to train fall back to exact search.
    assert plan_index(100, 512, IndexOptions(index_type="ivf-pq")).factory == "Flat"
    assert plan_index(5000, 32, IndexOptions(index_type="IVF16,Flat")).kind == "custom"


def test_auto_candidates_are_tried_until_one_reaches_the_target(
    vec_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import indexer.ann as ann
    from retrieval.index_types import IndexPlan

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


def test_auto_candidates_within_budget() -> None:
    from retrieval.index_types import candidate_plans

    factories = [p.factory for p in candidate_plans(1_000_000, 512, IndexOptions())]
    refined = ["IVF4096_HNSW32,SQ4,Refine(SQfp16)", "IVF4096_HNSW32,PQ64,Refine(SQfp16)"]
    assert factories == ["IVF4096_HNSW32,Flat", "IVF4096_HNSW32,SQ8", *refined]
    mid = [p.factory for p in candidate_plans(200_000, 512, IndexOptions())]
    assert mid == ["HNSW32", "IVF2048,Flat", "IVF2048,SQ8", "IVF2048,SQ4,Refine(SQfp16)", "IVF2048,PQ64,Refine(SQfp16)"]
    # An HNSW index that grows past the threshold is rebuilt as IVF by the update that crosses it.
    import indexer.ann as ann

    assert not ann.needs_rebuild("HNSW32", 500_000, 512, IndexOptions())
    assert ann.needs_rebuild("HNSW32", 500_001, 512, IndexOptions())
    assert [p.factory for p in candidate_plans(1_000_000, 512, IndexOptions(index_type="hnsw"))] == ["HNSW32"]
    small = [p.factory for p in candidate_plans(1_000_000, 512, IndexOptions(max_memory=parse_memory("1GB")))]
    assert small == ["IVF4096_HNSW32,SQ8", *refined]
    # Plain ivf-pq (no re-ranking) is a named type, not an auto candidate; an auto index that an
    # older clipsearch left as IVF-PQ is re-planned (re-ranked) by its next update.
    assert [p.factory for p in candidate_plans(1_000_000, 512, IndexOptions(index_type="ivf-pq"))] == ["IVF4096_HNSW32,PQ128"]
    assert ann.needs_rebuild("IVF4096_HNSW32,PQ128", 1_000_000, 512, IndexOptions(max_memory=parse_memory("1GB")))
    assert [p.factory for p in candidate_plans(1_000_000, 512, IndexOptions(index_type="ivf-flat"))] == ["IVF4096_HNSW32,Flat"]


def test_ivf_lists_keep_enough_training_points() -> None:
    for n in (300, 3000, 100_000, 1_000_000, 10_000_000):
        nlist = ivf_lists(n)
        assert nlist & (nlist - 1) == 0 and n / nlist >= 39
    assert ivf_lists(1_000_000) == 4096


@pytest.mark.parametrize(
    "text,expected", [("4GB", 4 * 2**30), ("512M", 512 * 2**20), ("1.5GiB", int(1.5 * 2**30)), ("1000", 1000), (2048, 2048)]
)
def test_parse_memory(text: str | int, expected: int) -> None:
    assert parse_memory(text) == expected


@pytest.mark.parametrize("bad", ["lots", "-1GB", "0", "4PB", ""])
def test_parse_memory_rejects(bad: str) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_memory(bad)


@pytest.mark.parametrize("kwargs", [{"index_type": ""}, {"target_recall": 0}, {"target_recall": 1.5}, {"max_memory": 0}])
def test_bad_index_options(kwargs: dict) -> None:
    with pytest.raises(InvalidArgumentError):
        IndexOptions(**kwargs)


# -- streaming builds, part merging, path files --------------------------------------------------


def test_finish_merges_chunk_parts_and_writes_path_files(vec_index: Path, vectors: np.ndarray) -> None:
    manifest = read_manifest(vec_index)
    # 12 commits of 250 rows: the finishing commit merged the small parts into one.
    assert 12 >= MERGE_MIN_PARTS and len(manifest.parts) == 1 and manifest.parts[0].rows == ROWS
    assert manifest.format_version == 2 and manifest.index_type == "Flat"
    assert all(p.paths is not None and f"/{PATHS_DIR}/" in p.paths for p in manifest.parts)
    index = ImageIndex.open(vec_index)
    assert np.array_equal(index.embeddings(), vectors)
    assert index.paths_of([0, 2999, 7]) == ["dir0/img00000.jpg", "dir4/img02999.jpg", "dir2/img00007.jpg"]
    assert index.paths_of([5]) == [r["path"] for r in index.rows([5])]


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
    _, found = index.search_ids(tune_queries, 11)
    truth = exact_top(vectors, tune_queries, 11)
    overlaps = []
    for own, got, want in zip(own_ids.tolist(), found.tolist(), truth.tolist(), strict=True):
        got_10 = [i for i in got if i != own][:10]
        want_10 = [i for i in want if i != own][:10]
        overlaps.append(len(set(got_10) & set(want_10)) / 10)
    assert tuning["recall_at_10"] == round(float(np.mean(overlaps)), 4)
    # The recorded recall is what a reader gets: measure it on queries not in the index.
    queries = held_out
    _, ids = index.search_ids(queries, 10)
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
    a = ImageIndex.open(idx, mmap=False).search_ids(vectors[:20], 10)
    b = ImageIndex.open(idx, mmap=True).search_ids(vectors[:20], 10)
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


def test_update_extends_an_approximate_index_and_keeps_its_options(tmp_path: Path) -> None:
    vecs = clustered(4000, DIM, seed=3)
    out = tmp_path / "grow.idx"
    write_vectors_index(out, vecs[:3000], commit_every=1000, options={"index_type": "hnsw", "target_recall": 0.9})
    first = read_manifest(out)
    assert first.index_type == "HNSW32" and first.index_tuning["tuned_rows"] == 3000
    with IndexLock(out):
        meta = IndexMeta(first.model, first.model_fingerprint, first.backend, DIM, first.preprocess, "synthetic", {}, first.index_options)
        writer = GenerationWriter(out, meta, first)
        writer.append(records(3000, 1000), vecs[3000:])
        writer.finish()
    grown = read_manifest(out)
    assert grown.count == 4000 and grown.index_type == "HNSW32" and grown.index_options == first.index_options
    # Grown by a third: re-tuned on the new rows.
    assert grown.index_tuning["tuned_rows"] == 4000
    index = ImageIndex.open(out)
    assert index.search_ids(vecs[3500:3501], 1)[1][0, 0] == 3500


# -- filters -------------------------------------------------------------------------------------


@pytest.mark.parametrize("index_type", ["flat", "hnsw", "ivf-sq8", "ivf-pq", "ivf-pq-refine"])
def test_filters_always_give_k_matching_results(vec_index: Path, tmp_path: Path, vectors: np.ndarray, index_type: str) -> None:
    idx = copy_of(vec_index, tmp_path)
    if index_type != "flat":
        reindex(idx, index_type=index_type)
    index = ImageIndex.open(idx)
    queries = clustered(5, DIM, seed=11)
    paths = np.array(index.paths())
    cases = [
        Filter(path_prefix=("dir3/",)),  # a fifth of the images
        Filter(path_prefix=("dir3/img0001", "dir1/img0002")),  # 10 + 10 images
        Filter(path_glob="dir2/img00[01]?7.jpg"),  # 2 images: fewer than k
        Filter(min_width=148, max_height=61),
        Filter(modified_after=100, modified_before=130),
    ]
    for where in cases:
        allowed = index.mask(where)
        assert allowed.any()
        hits = index.search_vectors(queries, 10, where=where)
        for row in hits:
            assert len(row) == min(10, int(allowed.sum()))
            assert all(allowed[h.id] and paths[h.id] == h.path for h in row)
        if index_type == "flat":
            # Exact search with a filter is exact search over the matching images.
            truth = exact_top(vectors, queries, min(10, int(allowed.sum())), allowed)
            assert [[h.id for h in row] for row in hits] == truth.tolist()


def test_filter_semantics(vec_index: Path) -> None:
    index = ImageIndex.open(vec_index)
    paths = index.paths()
    mask = index.mask(Filter(path_prefix=("dir1/", "dir2/")))
    assert mask.sum() == sum(p.startswith(("dir1/", "dir2/")) for p in paths)
    widths = index.mask(Filter(min_width=120, max_width=121))
    assert widths.sum() == sum(1 for i in range(ROWS) if 120 <= 100 + i % 50 <= 121)
    none = index.mask(Filter(path_prefix=("nowhere/",)))
    assert not none.any() and index.search_vectors(index.embeddings()[:1], 10, where=Filter(path_prefix=("nowhere/",))) == [[]]
    assert not Filter().active and Filter(min_width=1).active


@pytest.mark.parametrize(
    "kwargs", [{"path_prefix": ("",)}, {"min_width": -1}, {"min_width": 10, "max_width": 5}, {"path_glob": ""}, {"min_height": 1.5}]
)
def test_bad_filters(kwargs: dict) -> None:
    with pytest.raises(InvalidArgumentError):
        Filter(**kwargs)


def test_parse_time() -> None:
    assert parse_time("1970-01-01T00:00:01") == 1_000_000_000
    assert parse_time("2024-05-01") == parse_time("2024-05-01T02:00:00+02:00")
    with pytest.raises(InvalidArgumentError, match="ISO"):
        parse_time("last tuesday")


def test_search_filter_ties_and_prefix_property(vec_index: Path) -> None:
    index = ImageIndex.open(vec_index)
    q = index.embeddings()[:2]
    where = Filter(path_prefix=("dir4/",))
    a = index.search_ids(q, 7, where=where)[1]
    b = index.search_ids(q, 8, where=where)[1]
    assert np.array_equal(a, b[:, :7])


# -- version 1 indexes ---------------------------------------------------------------------------


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
    q = expected.embeddings()[:3]
    assert [[h.path for h in r] for r in old.search_vectors(q, 5)] == [[h.path for h in r] for r in expected.search_vectors(q, 5)]
    # Written again (reindex): version 2, path files added, flat kept (the only v1 choice).
    reindex(idx)
    manifest = read_manifest(idx)
    assert manifest.format_version == 2 and manifest.index_type == "Flat" and manifest.index_options["index_type"] == "flat"
    assert all(p.paths is not None and (idx / p.paths).is_file() for p in manifest.parts)
    assert ImageIndex.open(idx).paths_of(range(3)) == expected.paths_of(range(3))


# -- the CLI -------------------------------------------------------------------------------------


def test_cli_reindex_and_info(vec_index: Path, tmp_path: Path) -> None:
    idx = copy_of(vec_index, tmp_path)
    proc = run_cli(["reindex", str(idx), "--index-type", "hnsw", "--target-recall", "0.9", "--json", "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["index_type"] == "HNSW32" and report["index_tuning"]["recall_at_10"] >= 0.9
    info = json.loads(run_cli(["info", str(idx), "--json"]).stdout)
    assert info["index_type"] == "HNSW32" and info["search_params"] == report["search_params"]
    text = run_cli(["reindex", str(idx), "--index-type", "ivf-sq8", "--no-progress"])
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
    proc = run_cli(["reindex", str(idx), *args])
    assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    missing = run_cli(["reindex", str(tmp_path / "nothing")])
    assert missing.returncode == 1 and "not a clipsearch index" in missing.stderr


def test_cli_search_filters(built_index: Path) -> None:
    index = ImageIndex.open(built_index)
    paths = index.paths()
    prefix = paths[0][:1]
    proc = run_cli(["search", str(built_index), "a photo", "--path-prefix", prefix, "-k", "100", "--json"])
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)["results"]
    assert len(results) == sum(p.startswith(prefix) for p in paths)
    assert all(r["path"].startswith(prefix) for r in results)
    wide = run_cli(["search", str(built_index), "a photo", "--min-width", "100000", "--json"])
    assert wide.returncode == 0 and json.loads(wide.stdout)["results"] == []
    for bad, message in ((["--modified-after", "someday"], "ISO"), (["--min-width", "9", "--max-width", "3"], "nothing can match")):
        proc = run_cli(["search", str(built_index), "a photo", *bad])
        assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr


def test_cli_index_with_index_type(collection: Collection, tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "typed.idx"
    proc = run_cli(["index", str(collection.root), str(out), "--model", str(tiny_model), "--index-type", "flat", "--no-progress", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert read_manifest(out).index_options["index_type"] == "flat"
    bad = run_cli(["index", str(collection.root), str(tmp_path / "bad.idx"), "--model", str(tiny_model), "--max-memory", "x"])
    assert bad.returncode == 1 and "memory size" in bad.stderr and not (tmp_path / "bad.idx").exists()
    bogus = run_cli(
        ["index", str(collection.root), str(tmp_path / "bogus.idx"), "--model", str(tiny_model), "--index-type", "Bogus7", "--no-progress"]
    )
    assert bogus.returncode == 1 and bogus.stderr.count("\n") == 1 and "could not parse index string Bogus7" in bogus.stderr
    assert not (tmp_path / "bogus.idx").exists()


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
    monkeypatch.setattr(faiss_index, "set_search_params", lambda idx, p: (tried.append(p.get("nprobe", 0)), real(idx, p)))
    params, recall, reached = faiss_index.tune(index, queries, exact.result()[1], 0.999, exclude=np.arange(200))
    assert not reached and recall < 0.999 and params["nprobe"] in tried
    # 2 bytes per vector plateau early: the search stops long before a full scan (nprobe 64).
    assert max(tried) < 64, tried
