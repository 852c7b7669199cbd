"""The query vector cache (retrieval.query_cache) and its use by ImageIndex."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from retrieval import ImageIndex
from retrieval.errors import InvalidArgumentError
from retrieval.query_cache import QueryVectorCache
from retrieval.request import SearchRequest


class CountingEmbed:
    """A deterministic fake text tower that records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.lock = threading.Lock()

    def __call__(self, texts: list[str]) -> np.ndarray:
        with self.lock:
            self.calls.append(list(texts))
        out = np.array([[len(t), sum(map(ord, t)) % 97, 1.0] for t in texts], dtype=np.float32).reshape(len(texts), 3)
        return out / np.linalg.norm(out, axis=1, keepdims=True) if len(texts) else out

    @property
    def embedded(self) -> list[str]:
        return [t for call in self.calls for t in call]


def test_hits_misses_and_least_recently_used_eviction() -> None:
    embed = CountingEmbed()
    cache = QueryVectorCache(capacity=2)
    first = cache.embed(["a dog", "a cat", "a dog"], embed)
    assert embed.calls == [["a dog", "a cat"]]  # a repeated text in one call is embedded once
    assert np.array_equal(first, CountingEmbed()(["a dog", "a cat", "a dog"]))
    assert cache.info() == {"capacity": 2, "size": 2, "hits": 0, "misses": 3}
    cache.embed(["a dog"], embed)  # a hit: "a dog" becomes the most recent, "a cat" the oldest
    cache.embed(["a car"], embed)  # evicts "a cat"
    cache.embed(["a dog", "a cat"], embed)
    assert embed.embedded[2:] == ["a car", "a cat"]
    assert cache.info() == {"capacity": 2, "size": 2, "hits": 2, "misses": 5}
    cached = cache.embed(["a cat"], embed)
    cached[0, 0] = 42.0  # callers get copies: the cache cannot be changed through them
    assert cache.embed(["a cat"], embed)[0, 0] != 42.0


def test_capacity_zero_is_off_and_bad_capacities_are_refused() -> None:
    embed = CountingEmbed()
    off = QueryVectorCache(0)
    off.embed(["x"], embed)
    off.embed(["x"], embed)
    assert embed.calls == [["x"], ["x"]] and off.info()["size"] == 0
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises(InvalidArgumentError, match="query cache capacity"):
            QueryVectorCache(bad)  # type: ignore[arg-type]


def test_concurrent_callers_get_the_right_vectors() -> None:
    embed = CountingEmbed()
    cache = QueryVectorCache(capacity=8)
    texts = [f"text {i}" for i in range(12)]
    want = {t: CountingEmbed()([t])[0] for t in texts}
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(200):
            batch = [texts[i] for i in rng.integers(0, len(texts), size=3)]
            got = cache.embed(batch, embed)
            if not all(np.array_equal(g, want[t]) for g, t in zip(got, batch, strict=True)):
                errors.append(str(batch))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    info = cache.info()
    assert errors == [] and info["size"] <= 8 and info["hits"] + info["misses"] == 4 * 200 * 3


def test_index_searches_reuse_vectors_of_repeated_texts(built_index: Path, tmp_path: Path) -> None:
    index = ImageIndex.open(built_index, device="cpu")
    embed = CountingEmbed()
    real = index.encoders.text_encoder.embed_texts
    index.encoders.text_encoder.embed_texts = lambda texts: (embed(list(texts)), real(texts))[1]  # type: ignore[method-assign]
    first = index.search("a red square", k=5)
    again = index.search("a red square", k=5)
    assert first == again and embed.embedded == ["a red square"]
    for text in ("a red square", "a blue circle", "a blue circle"):
        index.search(text, k=3)
    index.search(SearchRequest(add=["a blue circle", "a red square"], k=3))
    assert embed.embedded == ["a red square", "a blue circle"]
    assert index.encoders.cache_info() == {"capacity": 1024, "size": 2, "hits": 5, "misses": 2}
    assert np.array_equal(index.encoders.embed_texts(["a red square"]), real(["a red square"]))

    off = ImageIndex.open(built_index, device="cpu", query_cache=0)
    assert off.search("a red square", k=5) == first and off.encoders.cache_info()["size"] == 0
    with pytest.raises(InvalidArgumentError, match="query cache capacity"):
        ImageIndex.open(built_index, query_cache=-1)

    # A new generation embedded by the same weights shares the cache along with the encoder.
    copy = tmp_path / "copy.idx"
    shutil.copytree(built_index, copy)
    live = ImageIndex.open(copy, device="cpu", query_cache=16)
    live.search("a red square", k=5)
    from indexer.reindex import reindex

    reindex(copy, index_type="flat")
    fresh = live.reopen()
    assert fresh is not live and fresh.encoders.cache_info() == {"capacity": 16, "size": 1, "hits": 0, "misses": 1}
    fresh.search("a red square", k=5)
    assert fresh.encoders.cache_info()["hits"] == 1


def test_live_index_and_serve_take_the_cache_size(built_index: Path) -> None:
    from clipsearch.cli import build_parser
    from retrieval.live import LiveIndex

    assert LiveIndex(built_index, device="cpu", query_cache=3).current().encoders.cache_info()["capacity"] == 3
    assert LiveIndex(built_index, device="cpu").current().encoders.cache_info()["capacity"] == 1024
    args = build_parser().parse_args(["serve", str(built_index), "--query-cache", "0"])
    assert args.query_cache == 0
    assert build_parser().parse_args(["serve", str(built_index)]).query_cache == 1024
