"""Shard sets without Ray: ``clipsearch shard`` (indexer.partition) and the in-process fan-out
and merge (retrieval.partitions) against the unsharded index."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import assert_one_line_error
from vector_indexes import clustered, write_vectors_index

from clipsearch.cli import main
from indexer.partition import add_to_partitions, join_indexes, split_index
from retrieval.errors import (
    IndexFormatError,
    InvalidArgumentError,
    NotAnIndexError,
    ShardUnavailableError,
    TooFewTrainingVectorsError,
)
from retrieval.filters import Filter
from retrieval.index import ImageIndex
from retrieval.partition_live import LivePartitions, local_shards, open_partitions
from retrieval.partition_set import PARTITIONS_FILE, read_partition_set
from retrieval.partitions import PartitionedIndex
from retrieval.request import SearchRequest
from retrieval.tools.verify import verify_index

CUTS: list[dict[str, Any]] = [
    {"k": 10}, {"k": 3, "sort": "taken"}, {"min_score": 0.6}, {"k": 7, "min_score": 0.2, "sort": "taken"}, {"k": 2000},
]


def _same(a: list[Any], b: list[Any]) -> None:
    assert [(h.id, h.score, h.path, h.taken) for h in a] == [(h.id, h.score, h.path, h.taken) for h in b]


@pytest.fixture(scope="module")
def vec_set(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, np.ndarray]:
    root = tmp_path_factory.mktemp("vecset")
    vectors = clustered(900, 32)
    write_vectors_index(root / "all.idx", vectors, commit_every=400)
    split_index(root / "all.idx", 3, root / "set")
    return root / "all.idx", root / "set", vectors


def test_split_is_balanced_and_every_shard_a_normal_index(vec_set: tuple[Path, Path, np.ndarray]) -> None:
    _, set_dir, _ = vec_set
    parts = read_partition_set(set_dir)
    assert [s.count for s in parts.shards] == [300, 300, 300]
    assert [(r.first_global, r.first_local, r.rows) for s in parts.shards for r in s.ranges] == [(0, 0, 300), (300, 0, 300), (600, 0, 300)]
    for s in parts.shards:
        assert verify_index(set_dir / s.path).ok
        assert ImageIndex.open(set_dir / s.path).count == 300


def test_vector_search_equals_the_unsharded_index(vec_set: tuple[Path, Path, np.ndarray]) -> None:
    whole_dir, set_dir, vectors = vec_set
    whole, sharded = ImageIndex.open(whole_dir), open_partitions(set_dir)
    where = Filter(path_glob="dir1/*")
    for q in vectors[:12]:
        for cut in CUTS:
            got = sharded.search(SearchRequest(vector=q, **cut))
            assert got.missing == ()
            _same(got, whole.search(SearchRequest(vector=q, **cut)))
            _same(sharded.search(SearchRequest(vector=q, where=where, **cut)), whole.search(SearchRequest(vector=q, where=where, **cut)))
    # More like an image of the second shard: the same as asking the unsharded index.
    _same(sharded.search(SearchRequest(similar_to=450, k=5)), whole.search(SearchRequest(similar_to=450, k=5)))
    assert sharded.rows([0, 450, 899]) == whole.rows([0, 450, 899])
    np.testing.assert_array_equal(sharded.metadata.sizes_of([3, 899]), whole.metadata.sizes_of([3, 899]))
    with pytest.raises(InvalidArgumentError, match="no image with id 900"):
        sharded.search(SearchRequest(similar_to=900, k=5))
    with pytest.raises(InvalidArgumentError, match="shape"):
        sharded.search(SearchRequest(vector=np.ones(5, np.float32) / np.sqrt(5)))


def test_adding_images_grows_one_shard_and_equals_the_unsharded_index(vec_set: tuple[Path, Path, np.ndarray], tmp_path: Path) -> None:
    _, set_dir, vectors = vec_set
    work = tmp_path / "set"
    shutil.copytree(set_dir, work)
    new = clustered(40, 32, seed=7)
    write_vectors_index(tmp_path / "new.idx", new, commit_every=40)
    before = {s.name: (set_dir / s.path / "manifest.json").read_bytes() for s in read_partition_set(work).shards}
    report = add_to_partitions(work, tmp_path / "new.idx")
    assert report.count == 940 and report.shards == {"shard-0000": 340, "shard-0001": 300, "shard-0002": 300}
    # The other shards are not rewritten.
    for name in ("shard-0001", "shard-0002"):
        assert (work / name / "manifest.json").read_bytes() == before[name]
    write_vectors_index(tmp_path / "whole.idx", np.concatenate([vectors, new]), commit_every=500)
    whole, sharded = ImageIndex.open(tmp_path / "whole.idx"), open_partitions(work)
    for q in [*vectors[:4], *new[:4]]:
        got = sharded.search(SearchRequest(vector=q, k=8))
        assert [(h.id, h.score) for h in got] == [(h.id, h.score) for h in whole.search(SearchRequest(vector=q, k=8))]
    assert any(h.id >= 900 for q in new[:4] for h in sharded.search(SearchRequest(vector=q, k=3)))


def test_indexes_built_apart_joined_equal_one_index_of_all(vec_set: tuple[Path, Path, np.ndarray], tmp_path: Path) -> None:
    whole_dir, _, vectors = vec_set
    # Three machines each index a part of the collection (the paths of its images, its ids from 0).
    cuts = [0, 250, 700, 900]
    built = tmp_path / "built"
    for n, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False)):
        write_vectors_index(built / f"part{n}.idx", vectors[a:b], commit_every=200, first=a)
    stamps = {p: p.stat().st_mtime_ns for p in built.rglob("*")}
    report = join_indexes([built / f"part{n}.idx" for n in range(3)], tmp_path / "set")
    assert report.count == 900 and report.shards == {"shard-0000": 250, "shard-0001": 450, "shard-0002": 200}
    # Only the manifest is written; the indexes stay where they are, untouched.
    assert sorted(p.name for p in (tmp_path / "set").iterdir()) == [PARTITIONS_FILE]
    assert {p: p.stat().st_mtime_ns for p in built.rglob("*")} == stamps
    parts = read_partition_set(tmp_path / "set")
    assert [s.path for s in parts.shards] == [f"../built/part{n}.idx" for n in range(3)]
    assert [(r.first_global, r.first_local, r.rows) for s in parts.shards for r in s.ranges] == [(0, 0, 250), (250, 0, 450), (700, 0, 200)]
    whole, joined = ImageIndex.open(whole_dir), open_partitions(tmp_path / "set")
    where = Filter(path_glob="dir3/*")
    for q in vectors[[0, 260, 701, 899]]:
        for cut in CUTS:
            _same(joined.search(SearchRequest(vector=q, **cut)), whole.search(SearchRequest(vector=q, **cut)))
        _same(joined.search(SearchRequest(vector=q, where=where, k=6)), whole.search(SearchRequest(vector=q, where=where, k=6)))
    assert joined.rows([0, 249, 250, 899]) == whole.rows([0, 249, 250, 899])
    # Images added later go to the smallest shard, where it is.
    write_vectors_index(tmp_path / "new.idx", clustered(5, 32, seed=3), commit_every=5)
    assert add_to_partitions(tmp_path / "set", tmp_path / "new.idx").shards["shard-0002"] == 205
    assert ImageIndex.open(built / "part2.idx").count == 205


def test_a_join_refuses_a_mismatch_naming_the_shard(vec_set: tuple[Path, Path, np.ndarray], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    whole_dir, set_dir, _ = vec_set
    write_vectors_index(tmp_path / "a.idx", clustered(20, 32), commit_every=20)
    write_vectors_index(tmp_path / "dim16.idx", clustered(20, 16), commit_every=20)
    write_vectors_index(tmp_path / "other.idx", clustered(20, 32), commit_every=20, model="other")
    a = str(tmp_path / "a.idx")
    for paths, error, needle in (
        ([a, tmp_path / "dim16.idx"], IndexFormatError, r"shard 'shard-0001' \(.*dim16.idx\) was embedded with synthetic \(dim 16\)"),
        ([a, whole_dir, tmp_path / "other.idx"], IndexFormatError, r"shard 'shard-0002' \(.*other.idx\) was embedded with other"),
        ([a, tmp_path / "nothing"], NotAnIndexError, "nothing is not a clipsearch index"),
        ([a, set_dir], NotAnIndexError, "shard 'shard-0001' .* is a shard set"),
        ([a, tmp_path / "." / "a.idx"], InvalidArgumentError, "given twice"),
        ([], InvalidArgumentError, "give the indexes"),
    ):
        with pytest.raises(error, match=needle):
            join_indexes(paths, tmp_path / "set")
        assert not (tmp_path / "set").exists()
    for argv, needle in (
        (["shard", "--join", a, str(tmp_path / "dim16.idx"), str(tmp_path / "set")], "shard 'shard-0001'"),
        (["shard", "--join", a], "give the indexes and where the set goes"),
        (["shard", "--join", a, str(whole_dir), str(set_dir)], "not an empty directory"),
        (["shard", "--join", "--shards", "2", a, str(tmp_path / "set")], "give --shards N"),
    ):
        assert_one_line_error(main(argv), capsys.readouterr().err, needle)
    assert not (tmp_path / "set").exists()
    assert main(["shard", "--join", a, str(whole_dir), str(tmp_path / "set"), "--json"]) == 0
    joined = json.loads(capsys.readouterr().out)
    assert joined == {"out": str(tmp_path / "set"), "count": 920, "shards": {"shard-0000": 20, "shard-0001": 900}}
    assert open_partitions(tmp_path / "set").search(SearchRequest(vector=clustered(20, 32)[3], k=1))[0].id == 3


def test_a_joined_set_serves_each_index_s_files_from_its_own_folder(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from clipsearch.server import create_app

    # Two machines, two photo folders: each index records its own root.
    vectors = clustered(20, 32)
    for n, (a, b) in enumerate(((0, 12), (12, 20))):
        root = tmp_path / f"photos{n}"
        for i in range(a, b):
            (root / f"dir{i % 5}").mkdir(parents=True, exist_ok=True)
            (root / f"dir{i % 5}" / f"img{i:05d}.jpg").write_bytes(f"image {i}".encode())
        write_vectors_index(tmp_path / f"part{n}.idx", vectors[a:b], commit_every=20, first=a, source_root=str(root))
    join_indexes([tmp_path / "part0.idx", tmp_path / "part1.idx"], tmp_path / "set")
    with TestClient(create_app([tmp_path / "set"], warm=False)) as client:
        for i in (0, 11, 12, 19):
            got = client.get(f"/api/images/{i}")
            assert got.status_code == 200 and got.content == f"image {i}".encode()
        assert client.get("/api/images/20").status_code == 404


def test_text_search_in_every_mode_equals_the_unsharded_index(built_index: Path, tmp_path: Path) -> None:
    split_index(built_index, 2, tmp_path / "set")
    whole = ImageIndex.open(built_index, device="cpu", precision="fp32")
    sharded = open_partitions(tmp_path / "set", device="cpu", precision="fp32")
    for text in ("red", "a photo of a cat", "png"):
        for mode in ("vector", "keyword"):
            for cut in CUTS[:3]:
                _same(sharded.search(SearchRequest(text=text, mode=mode, **cut)), whole.search(SearchRequest(text=text, mode=mode, **cut)))
        # Hybrid: the set's cosine scale is estimated from the shards' samples (the whole
        # collection here, as the unsharded index's): the same order, the fused scores to rounding.
        got, want = sharded.search(SearchRequest(text=text, k=10)), whole.search(SearchRequest(text=text, k=10))
        assert [h.id for h in got] == [h.id for h in want]
        assert [h.matched for h in got] == [h.matched for h in want]
        np.testing.assert_allclose([h.fused or 0 for h in got], [h.fused or 0 for h in want], rtol=1e-6)


def test_the_cli_searches_describes_and_verifies_a_set(built_index: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """search, info and verify take a set where they take an index: the same results (and the
    set says whether any shard is missing), the set's facts, each shard verified."""
    split_index(built_index, 2, tmp_path / "set")
    set_dir = str(tmp_path / "set")

    def run(*argv: str) -> dict[str, Any]:
        assert main(list(argv)) == 0
        return dict(json.loads(capsys.readouterr().out))

    for query in (["red", "-k", "5"], ["a photo of a cat", "--mode", "keyword"], ["png", "--sort", "taken", "-k", "3"]):
        want = run("search", str(built_index), *query, "--json", "--precision", "fp32")
        got = run("search", set_dir, *query, "--json", "--precision", "fp32")
        assert (got.pop("partial"), got.pop("missing_shards")) == (False, [])
        assert got == want
    assert main(["search", set_dir, "red", "-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].split()[0] == "1"
    info = run("info", set_dir, "--json")
    assert info["count"] == len(ImageIndex.open(built_index)) and [s["name"] for s in info["shards"]] == ["shard-0000", "shard-0001"]
    report = run("verify", set_dir, "--json")
    assert report["ok"] is True and sorted(report["shards"]) == ["shard-0000", "shard-0001"]
    assert all(r["ok"] and r["checksums"] for r in report["shards"].values())
    # A listing without a query, a damaged shard, a missing shard: one line each, exit 1.
    assert_one_line_error(main(["search", set_dir, "--path-prefix", "a"]), capsys.readouterr().err, "a shard set is searched with a query")
    damaged = next((tmp_path / "set" / "shard-0001").glob("gen-*/embeddings/*.parquet"))
    damaged.write_bytes(damaged.read_bytes()[:-40])
    assert main(["verify", set_dir]) == 1
    out, err = capsys.readouterr()
    assert "shard-0000: ok" in out and "shard-0001: 1 damaged file(s)" in out and str(damaged.name) in err
    shutil.rmtree(tmp_path / "set" / "shard-0000")
    for argv in (["verify", set_dir], ["info", set_dir], ["search", set_dir, "red"]):
        assert_one_line_error(main(argv), capsys.readouterr().err, "shard 'shard-0000' is missing")


class _Broken:
    """A shard client whose shard never answers in time."""

    def __init__(self, name: str, sleep: float) -> None:
        self.name, self.sleep = name, sleep

    def call(self, method: str, *args: Any) -> Any:
        sleep = self.sleep

        class Late:
            def result(self, timeout: float | None = None) -> Any:
                time.sleep(min(sleep, timeout or sleep))
                raise TimeoutError("late")

        return Late()


def test_a_shard_that_does_not_answer_makes_a_partial_result(vec_set: tuple[Path, Path, np.ndarray]) -> None:
    whole_dir, set_dir, vectors = vec_set
    local = local_shards()

    def connect(root: Path, shard: Any) -> Any:
        return _Broken(shard.name, 10) if shard.name == "shard-0001" else local(root, shard)

    # A deadline the healthy shard (a thread here) meets on a loaded host too; the other sleeps past it.
    sharded = open_partitions(set_dir, connect=connect, deadline_s=2.0)
    started = time.monotonic()
    got = sharded.search(SearchRequest(vector=vectors[0], k=10))
    assert time.monotonic() - started < 2.0 + 3
    assert got.partial and got.missing == ("shard-0001",)
    # What it returns is the unsharded ranking without the missing shard's ids.
    whole = ImageIndex.open(whole_dir).search(SearchRequest(vector=vectors[0], k=900))
    assert [h.id for h in got] == [h.id for h in whole if not 300 <= h.id < 600][:10]
    with pytest.raises(ShardUnavailableError, match="shard-0001"):
        sharded.rows([450])
    dead = open_partitions(set_dir, connect=lambda root, shard: _Broken(shard.name, 10), deadline_s=0.2)
    with pytest.raises(ShardUnavailableError, match="no shard answered"):
        dead.search(SearchRequest(vector=vectors[0], k=3))


def test_live_set_follows_an_added_shard_generation(vec_set: tuple[Path, Path, np.ndarray], tmp_path: Path) -> None:
    _, set_dir, _ = vec_set
    work = tmp_path / "set"
    shutil.copytree(set_dir, work)
    live = LivePartitions(work, lambda d: open_partitions(d))
    first = live.current()
    assert isinstance(first, PartitionedIndex) and live.current() is first and first.count == 900
    added = clustered(5, 32, seed=9)
    write_vectors_index(tmp_path / "new.idx", added, commit_every=5)
    add_to_partitions(work, tmp_path / "new.idx")
    assert live.current().count == 905 and first.count == 900
    # The set read before the images were added, its shard already past it: the answers of the
    # set's generation (the new images, the best hits of these queries, left out), never a mix.
    whole = ImageIndex.open(set_dir.parent / "all.idx")
    for q in added:
        for cut in CUTS[:2]:
            got = first.search(SearchRequest(vector=q, **cut))
            _same(got, whole.search(SearchRequest(vector=q, **cut)))
            assert got.generations["shard-0000"] == str(ImageIndex.open(work / "shard-0000").manifest.generation)
    assert any(h.id >= 900 for h in live.current().search(SearchRequest(vector=added[0], k=3)))


def test_bad_inputs_are_refused_with_what_to_do(vec_set: tuple[Path, Path, np.ndarray], tmp_path: Path, other_model: Path) -> None:
    whole_dir, set_dir, _ = vec_set
    with pytest.raises(InvalidArgumentError, match=">= 1"):
        split_index(whole_dir, 0, tmp_path / "a")
    with pytest.raises(InvalidArgumentError, match="more than the index's 900 images"):
        split_index(whole_dir, 901, tmp_path / "a")
    assert not (tmp_path / "a").exists()
    # Shards too small to train the index type the source records: refused before any is written.
    ivf = tmp_path / "ivf.idx"
    write_vectors_index(ivf, clustered(600, 32), commit_every=600, options={"index_type": "IVF256,Flat"})
    with pytest.raises(TooFewTrainingVectorsError, match="--shards 3 gives shards of 200 images: .*'IVF256,Flat' needs at least 256"):
        split_index(ivf, 3, tmp_path / "a")
    assert not (tmp_path / "a").exists()
    split_index(ivf, 2, tmp_path / "two")
    work = tmp_path / "set"
    shutil.copytree(set_dir, work)
    shutil.rmtree(work / "shard-0002")
    with pytest.raises(NotAnIndexError, match="shard 'shard-0002' is missing"):
        open_partitions(work)
    # A shard of another dimension, and one updated alone (its row count no longer the set's).
    shutil.rmtree(work)
    shutil.copytree(set_dir, work)
    shutil.rmtree(work / "shard-0001")
    write_vectors_index(work / "shard-0001", clustered(300, 16), commit_every=300)
    with pytest.raises(IndexFormatError, match="shard 'shard-0001' was embedded with .* \\(dim 16\\)"):
        open_partitions(work)
    shutil.rmtree(work / "shard-0001")
    write_vectors_index(work / "shard-0001", clustered(301, 32), commit_every=301)
    with pytest.raises(IndexFormatError, match="holds 301 images, the set records 300"):
        open_partitions(work)
    write_vectors_index(tmp_path / "small.idx", clustered(3, 16), commit_every=3)
    with pytest.raises(IndexFormatError, match="dim 16"):
        add_to_partitions(set_dir, tmp_path / "small.idx")
    data = json.loads((set_dir / PARTITIONS_FILE).read_text())
    (work / PARTITIONS_FILE).write_text(json.dumps({**data, "version": 99}))
    with pytest.raises(IndexFormatError, match="upgrade clipsearch"):
        read_partition_set(work)


def test_cli_splits_adds_and_refuses_in_one_line(vec_set: tuple[Path, Path, np.ndarray], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    whole_dir, _, _ = vec_set
    assert main(["shard", str(whole_dir), str(tmp_path / "s"), "--shards", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["count"] == 900 and sorted(out["shards"].values()) == [225, 225, 225, 225]
    write_vectors_index(tmp_path / "new.idx", clustered(10, 32, seed=5), commit_every=10)
    assert main(["shard", str(tmp_path / "s"), "--add", str(tmp_path / "new.idx")]) == 0
    assert "910 images added to 4 shards" in capsys.readouterr().out
    for argv, needle in (
        (["shard", str(whole_dir), str(tmp_path / "t"), "--shards", "0"], "--shards must be"),
        (["shard", str(whole_dir), str(tmp_path / "t"), "--shards", "5000"], "at most 900"),
        (["shard", str(whole_dir), "--shards", "2"], "give where the set goes"),
        (["shard", str(tmp_path / "s")], "give --shards N"),
        (["shard", str(tmp_path / "s"), "--add", str(tmp_path / "nothing")], "nothing"),
        (["shard", str(whole_dir), str(tmp_path / "s"), "--shards", "2"], "not an empty directory"),
    ):
        code = main(argv)
        assert_one_line_error(code, capsys.readouterr().err, needle)
    assert not (tmp_path / "t").exists()


def test_set_hits_are_hits(vec_set: tuple[Path, Path, np.ndarray]) -> None:
    _, set_dir, vectors = vec_set
    got = open_partitions(set_dir).search(SearchRequest(vector=vectors[1], k=2))
    assert all(dataclasses.is_dataclass(h) for h in got) and got[0].id == 1


def test_a_set_is_served_by_the_same_app(vec_set: tuple[Path, Path, np.ndarray]) -> None:
    from starlette.testclient import TestClient

    from clipsearch.server import create_app

    whole_dir, set_dir, vectors = vec_set
    whole = ImageIndex.open(whole_dir)
    with TestClient(create_app([set_dir], warm=False)) as client:
        got = client.post("/api/search", json={"vector": vectors[7].tolist(), "k": 4, "offset": 1}).json()
        want = whole.search(SearchRequest(vector=vectors[7], k=5))[1:]
        assert [(r["id"], r["score"], r["path"], r["width"]) for r in got["results"]] == [
            (h.id, h.score, h.path, int(whole.metadata.sizes_of([h.id])[0][0])) for h in want
        ]
        assert got["partial"] is False and got["missing_shards"] == []
        assert client.get("/api/indexes").json()[0]["count"] == 900
        assert client.post("/api/search", json={"image_id": 900, "k": 1}).status_code == 404
        assert client.post("/api/search", json={"vector": [1.0, 0.0], "k": 1}).status_code == 400
        assert client.get("/").status_code == 200
