"""Filtered search (``retrieval.filters``): every index type gives k matching results, the filter
semantics, bad filters, times, and ``clipsearch search``'s filter options."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_here
from vector_indexes import DIM, ROWS, clustered, copy_of, exact_top

from indexer.reindex import reindex
from retrieval import ImageIndex, InvalidArgumentError
from retrieval.filters import Filter, parse_time


@pytest.mark.parametrize("index_type", ["flat", "hnsw", "ivf-sq8", "ivf-pq", "ivf-pq-refine"])
def test_filters_always_give_k_matching_results(vec_index: Path, tmp_path: Path, vectors: np.ndarray, index_type: str) -> None:
    idx = copy_of(vec_index, tmp_path)
    if index_type != "flat":
        reindex(idx, index_type=index_type)
    index = ImageIndex.open(idx)
    queries = clustered(5, DIM, seed=11)
    paths = np.array(index.metadata.paths())
    cases = [
        Filter(path_prefix=("dir3/",)),  # a fifth of the images
        Filter(path_prefix=("dir3/img0001", "dir1/img0002")),  # 10 + 10 images
        Filter(path_glob="dir2/img00[01]?7.jpg"),  # 2 images: fewer than k
        Filter(min_width=148, max_height=61),
        Filter(modified_after=100, modified_before=130),
    ]
    for where in cases:
        allowed = index.metadata.mask(where)
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
    paths = index.metadata.paths()
    mask = index.metadata.mask(Filter(path_prefix=("dir1/", "dir2/")))
    assert mask.sum() == sum(p.startswith(("dir1/", "dir2/")) for p in paths)
    widths = index.metadata.mask(Filter(min_width=120, max_width=121))
    assert widths.sum() == sum(1 for i in range(ROWS) if 120 <= 100 + i % 50 <= 121)
    none = index.metadata.mask(Filter(path_prefix=("nowhere/",)))
    assert not none.any() and index.search_vectors(index.vectors.embeddings()[:1], 10, where=Filter(path_prefix=("nowhere/",))) == [[]]
    assert not Filter().active and Filter(min_width=1).active
    # Globs of several stars (fnmatch writes them with groups RE2 cannot read) match as fnmatch does.
    for glob in ("*.*", "dir*/img*7.jpg", "*1*2*", "dir[13]/*0?.jpg"):
        got = index.metadata.mask(Filter(path_glob=glob))
        assert got.tolist() == [fnmatch.fnmatchcase(p, glob) for p in paths], glob
        assert got.any(), glob


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
    q = index.vectors.embeddings()[:2]
    where = Filter(path_prefix=("dir4/",))
    a = index.vectors.search_ids(q, 7, where=where)[1]
    b = index.vectors.search_ids(q, 8, where=where)[1]
    assert np.array_equal(a, b[:, :7])


def test_cli_search_filters(built_index: Path) -> None:
    index = ImageIndex.open(built_index)
    paths = index.metadata.paths()
    prefix = paths[0][:1]
    proc = cli_here(["search", str(built_index), "a photo", "--path-prefix", prefix, "-k", "100", "--json"])
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)["results"]
    assert len(results) == sum(p.startswith(prefix) for p in paths)
    assert all(r["path"].startswith(prefix) for r in results)
    wide = cli_here(["search", str(built_index), "a photo", "--min-width", "100000", "--json"])
    assert wide.returncode == 0 and json.loads(wide.stdout)["results"] == []
    for bad, message in ((["--modified-after", "someday"], "ISO"), (["--min-width", "9", "--max-width", "3"], "nothing can match")):
        proc = cli_here(["search", str(built_index), "a photo", *bad])
        assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr


def test_reversed_dates_are_said_as_dates() -> None:
    from retrieval.filters import format_time

    with pytest.raises(InvalidArgumentError, match=r"^taken_after \(2025-01-01\) is after taken_before \(2020-01-01\): nothing can match$"):
        Filter(taken_after=parse_time("2025-01-01"), taken_before=parse_time("2020-01-01"))
    assert format_time(parse_time("2024-05-01T12:30:00+02:00")) == "2024-05-01T10:30:00+00:00"
    assert parse_time(format_time(parse_time("2024-05-01"))) == parse_time("2024-05-01")
