"""Readers open a FAISS file by the plan the index recorded (retrieval.faiss_mapping): the memory
budget given when building (``max_memory``) is the one kept when searching."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from vector_indexes import clustered, copy_of, write_vectors_index

from indexer.reindex import reindex
from retrieval import ImageIndex
from retrieval.faiss_mapping import MMAP_MIN_BYTES, plan_mapping
from retrieval.layout import read_manifest
from retrieval.live import LiveIndex

ROWS, DIM = 40_000, 128
# Under this budget ``auto`` cannot keep full or 8-bit vectors resident (20 MB, 5 MB): it plans
# 4-bit codes (about 3.3 MB) re-ranked against 10 MB of float16 vectors left on disk, mapped.
BUDGET = 3_500_000
# What opening one more index adds to anonymous memory besides its FAISS index: Parquet footers,
# the skip list, Python objects (measured: about 0.1 MB for this index).
OPEN_OVERHEAD = 4 << 20

_MEASURE = """
import json, sys
import numpy as np
from retrieval import ImageIndex

def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024

mmap = json.loads(sys.argv[2])
# One open first: the libraries' one-time allocations (pyarrow's pool, FAISS, OpenMP) are not
# this open's.
first = ImageIndex.open(sys.argv[1], mmap=True)
queries = np.random.default_rng(0).standard_normal((20, first.dim)).astype(np.float32)
queries /= np.linalg.norm(queries, axis=1, keepdims=True)
first.search_ids(queries, 10)
before = anon()
index = ImageIndex.open(sys.argv[1], mmap=mmap)
opened = anon()
index.vectors.search_ids(queries, 10)
queried = anon()
info = index.info()  # after the measures: it looks up the query model (imports huggingface_hub)
print(json.dumps({"open": opened - before, "queried": queried - before,
                  "faiss_mmap": info["faiss_mmap"], "reason": info["faiss_mmap_reason"]}))
"""


@pytest.fixture(scope="module")
def small_budget(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("budget") / "vec.idx"
    options = {"index_type": "auto", "max_memory": BUDGET, "target_recall": 0.8}
    write_vectors_index(out, clustered(ROWS, DIM, seed=3), commit_every=ROWS, options=options)
    return out


def _anon_growth(index_dir: Path, mmap: bool | None) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(index_dir), json.dumps(mmap)], capture_output=True, text=True, check=True, timeout=300
    )
    return json.loads(out.stdout)


def test_a_reranked_index_opens_within_its_budget(small_budget: Path) -> None:
    manifest = read_manifest(small_budget)
    assert manifest.index_type.endswith(",Refine(SQfp16)") and manifest.index_options["max_memory"] == BUDGET
    mapped = manifest.index_tuning["mapped_bytes"]
    assert mapped == ROWS * DIM * 2
    by_plan = _anon_growth(small_budget, None)
    assert by_plan["faiss_mmap"] is True and "re-ranking vectors" in by_plan["reason"]
    # Anonymous memory: the budget plus a fixed overhead, at open and after queries.
    assert by_plan["open"] <= BUDGET + OPEN_OVERHEAD, by_plan
    assert by_plan["queried"] <= BUDGET + OPEN_OVERHEAD, by_plan
    # The measure tells: read into RAM (the override), the same index takes its whole file.
    read = _anon_growth(small_budget, False)
    assert read["faiss_mmap"] is False and read["reason"] == "mmap=False asked for"
    assert read["open"] >= mapped > BUDGET + OPEN_OVERHEAD, read


def test_overrides_give_the_same_answers(small_budget: Path) -> None:
    queries = clustered(20, DIM, seed=9)
    answers = []
    for mmap in (None, True, False):
        index = ImageIndex.open(small_budget, mmap=mmap)
        assert index.info()["faiss_mmap"] is (mmap is not False)
        answers.append(index.vectors.search_ids(queries, 10))
    for scores, ids in answers[1:]:
        assert np.array_equal(ids, answers[0][1]) and np.array_equal(scores, answers[0][0])


def test_live_index_and_reindex_follow_each_generation_plan(small_budget: Path, tmp_path: Path) -> None:
    idx = copy_of(small_budget, tmp_path)
    live = LiveIndex(idx)
    forced = LiveIndex(idx, mmap=False)
    assert live.current().info()["faiss_mmap"] is True and forced.current().info()["faiss_mmap"] is False
    # A larger budget keeps full vectors resident: the next generation is read.
    report = reindex(idx, index_type="flat", max_memory="1GB")
    assert report.faiss_mmap is False and "fits the recorded max_memory" in report.faiss_mmap_reason
    info = live.current().info()
    assert info["faiss_mmap"] is False and info["index_type"] == "Flat"
    assert info["faiss_mmap_reason"] == report.faiss_mmap_reason
    assert forced.current().info()["faiss_mmap_reason"] == "mmap=False asked for"
    # Back under the small budget: mapped again, in the live reader and in the report.
    report = reindex(idx, index_type="auto", max_memory=BUDGET)
    assert report.faiss_mmap is True and live.current().info()["faiss_mmap"] is True
    assert forced.current().info()["faiss_mmap"] is False


def test_the_rules(small_budget: Path) -> None:
    manifest = read_manifest(small_budget)
    size = 13 << 20
    assert plan_mapping(manifest, size).mmap is True  # the plan maps its re-ranking vectors
    assert plan_mapping(manifest, size, asked=False) == plan_mapping(manifest, 1, asked=False)
    plain = dataclasses.replace(manifest, index_tuning={}, index_options={"index_type": "auto", "max_memory": 10 << 20})
    over = plan_mapping(plain, (10 << 20) + 1)
    assert over.mmap is True and "larger than the recorded max_memory (10.0 MB)" in over.reason
    assert plan_mapping(plain, 10 << 20).mmap is False  # the plan keeps it in RAM
    unplanned = dataclasses.replace(plain, index_options={})
    assert plan_mapping(unplanned, MMAP_MIN_BYTES).mmap is True and plan_mapping(unplanned, MMAP_MIN_BYTES - 1).mmap is False
    # A file lacking rows (a build committed part-way) is read, whatever was asked: the rest is
    # added to it in memory.
    partial = dataclasses.replace(manifest, faiss=dataclasses.replace(manifest.faiss, rows=manifest.count - 1))  # type: ignore[type-var]
    assert plan_mapping(partial, size).mmap is False and plan_mapping(partial, size, asked=True).mmap is False
    assert plan_mapping(dataclasses.replace(manifest, faiss=None, checksums={}), 0).mmap is False


def test_a_mapped_flat_index_adds_no_anonymous_memory(tmp_path: Path) -> None:
    # `serve --workers N` opens every index mapped: a flat index's vectors are then one copy in
    # the page cache, shared by the workers, not one copy in each.
    out = tmp_path / "flat.idx"
    write_vectors_index(out, clustered(ROWS, DIM, seed=4), commit_every=ROWS, options={"index_type": "flat"})
    assert read_manifest(out).index_type == "Flat"
    mapped, read = _anon_growth(out, True), _anon_growth(out, False)
    assert mapped["faiss_mmap"] is True and read["faiss_mmap"] is False
    vectors = ROWS * DIM * 4
    assert mapped["open"] < OPEN_OVERHEAD and mapped["queried"] < OPEN_OVERHEAD
    assert read["open"] > vectors * 0.9
    index, again = ImageIndex.open(out, mmap=True), ImageIndex.open(out, mmap=False)
    queries = clustered(20, DIM, seed=5)
    assert np.array_equal(index.vectors.search_ids(queries, 10)[1], again.vectors.search_ids(queries, 10)[1])
