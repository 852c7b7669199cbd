"""Choosing an index type: ``indexer.index_types`` plans (size, memory budget, named types), the
auto candidates, memory sizes and index options, and ``clipsearch index --index-type``."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import cli_here
from imagegen import Collection

from indexer.index_types import IndexOptions, ivf_lists, parse_memory, plan_index
from retrieval import InvalidArgumentError
from retrieval.layout import read_manifest


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


def test_auto_candidates_within_budget() -> None:
    from indexer.index_types import candidate_plans

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


def test_cli_index_with_index_type(collection: Collection, tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "typed.idx"
    proc = cli_here(["index", collection.root, out, "--model", tiny_model, "--index-type", "flat", "--no-progress", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert read_manifest(out).index_options["index_type"] == "flat"
    bad = cli_here(["index", str(collection.root), str(tmp_path / "bad.idx"), "--model", str(tiny_model), "--max-memory", "x"])
    assert bad.returncode == 1 and "memory size" in bad.stderr and not (tmp_path / "bad.idx").exists()
    bogus = cli_here(
        ["index", str(collection.root), str(tmp_path / "bogus.idx"), "--model", str(tiny_model), "--index-type", "Bogus7", "--no-progress"]
    )
    assert bogus.returncode == 1 and bogus.stderr.count("\n") == 1 and "could not parse index string Bogus7" in bogus.stderr
    assert not (tmp_path / "bogus.idx").exists()
    # More IVF lists than images: refused after discovery, before any image is embedded.
    ivf = tmp_path / "ivf.idx"
    lists = cli_here(["index", str(collection.root), str(ivf), "--model", str(tiny_model), "--index-type", "IVF4096,Flat", "--no-progress"])
    assert lists.returncode == 1 and lists.stderr.count("\n") == 1, lists.stderr
    assert "'IVF4096,Flat' needs at least 4096 training vectors" in lists.stderr and "--index-type auto" in lists.stderr
    assert not ivf.exists()


def test_untrainable_index_type_found_late_keeps_the_rows_not_the_option(
    collection: Collection, tiny_model: Path, built_index: Path, tmp_path: Path
) -> None:
    # More lists than images that decode, fewer than files found: known only at the end of the build.
    rows, skipped = read_manifest(built_index).count, read_manifest(built_index).skipped
    assert skipped >= 1
    out = tmp_path / "late.idx"
    args = ["index", str(collection.root), str(out), "--model", str(tiny_model), "--no-progress"]
    late = cli_here([*args, "--index-type", f"IVF{rows + 1},Flat", "--commit-every", "8"])
    assert late.returncode == 1 and late.stderr.count("\n") == 1, late.stderr
    assert f"needs at least {rows + 1} training vectors" in late.stderr and f"the {rows} rows are kept" in late.stderr
    kept = read_manifest(out)
    # The chunk commits recorded the option; the last commit puts back what a rerun can build.
    assert not kept.complete and kept.count == rows and kept.index_options["index_type"] == "auto"
    again = cli_here(args)
    assert again.returncode == 0, again.stderr
    done = read_manifest(out)
    assert done.complete and done.count == rows and done.index_type == "Flat"
