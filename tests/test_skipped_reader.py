"""``retrieval.store.read_skipped``: the one reader of ``skipped.parquet``, for the writer's schema."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from indexer.writer import SkipRecord, write_skipped
from retrieval import store
from retrieval.errors import IndexCorruptError


def test_round_trip_sorted_by_path(tmp_path: Path) -> None:
    recs = [SkipRecord(b"b/\xff.jpg", "truncated file", 5, 7, "h"), SkipRecord(b"a.jpg", "directory not readable: denied")]
    write_skipped(tmp_path / "skipped.parquet", recs)
    assert store.read_skipped(tmp_path / "skipped.parquet") == sorted(recs, key=lambda r: r.path)
    # An opened file (as a reader keeps it) reads the same.
    assert store.read_skipped(store.open_parquet(tmp_path / "skipped.parquet")) == sorted(recs, key=lambda r: r.path)


def test_skip_list_written_before_file_facts(tmp_path: Path) -> None:
    old = pa.table({"path": ["x.jpg"], "path_bytes": [b"x.jpg"], "reason": ["empty file"]})
    pq.write_table(old, tmp_path / "skipped.parquet")
    assert store.read_skipped(tmp_path / "skipped.parquet") == [SkipRecord(b"x.jpg", "empty file")]


def test_missing_or_foreign_file_is_corrupt(tmp_path: Path) -> None:
    with pytest.raises(IndexCorruptError, match="missing"):
        store.read_skipped(tmp_path / "skipped.parquet", "fix it")
    pq.write_table(pa.table({"path": ["x.jpg"]}), tmp_path / "skipped.parquet")
    with pytest.raises(IndexCorruptError, match="not a skip list.*fix it"):
        store.read_skipped(tmp_path / "skipped.parquet", "fix it")
