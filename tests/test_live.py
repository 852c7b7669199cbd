"""A long-lived reader following updates: ``ImageIndex.reopen``, ``LiveIndex``, and the
per-id helpers a server needs (``files.path``, ``vectors``, a search ``similar_to`` an id), used
from several threads at once."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from imagegen import photo_like

from indexer import build_index
from retrieval.errors import IndexCorruptError, InvalidArgumentError, NotAnIndexError
from retrieval.filters import Filter
from retrieval.index import ImageIndex
from retrieval.live import LiveIndex
from retrieval.request import SearchRequest


def _photos(root: Path, names: list[str], seed: int = 0) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        photo_like(70 + i, 60, seed=seed + i).save(root / name, quality=90)
    return root


@pytest.fixture()
def live_dirs(tmp_path: Path, tiny_model: Path) -> tuple[Path, Path, Path]:
    photos = _photos(tmp_path / "photos", ["a.jpg", "b.jpg", "sub/c.jpg"])
    idx = tmp_path / "photos.idx"
    build_index(photos, idx, model=str(tiny_model), workers=0, device="cpu")
    return photos, idx, tiny_model


def test_reopen_is_self_until_a_writer_publishes_then_shares_the_loaded_models(live_dirs: tuple[Path, Path, Path]) -> None:
    photos, idx, model = live_dirs
    index = ImageIndex.open(idx, device="cpu")
    before = index.search("a photo", k=10)
    assert index.reopen() is index
    text_encoder, encoder = index.encoders.text_encoder, index.encoders.encoder

    _photos(photos, ["new.jpg"], seed=50)
    build_index(photos, idx, model=str(model), workers=0, device="cpu")
    fresh = index.reopen()
    assert fresh is not index and fresh.manifest.generation != index.manifest.generation
    assert fresh.count == index.count + 1
    # The old object still answers from its own generation, the new one sees the new image.
    assert index.search("a photo", k=10) == before
    assert "new.jpg" in {h.path for h in fresh.search("a photo", k=10)}
    assert fresh.encoders.text_encoder is text_encoder and fresh.encoders.encoder is encoder
    # The same text gives the same scores for the images both generations hold.
    old_scores = {h.path: h.score for h in before}
    for hit in fresh.search("a photo", k=10):
        if hit.path in old_scores:
            assert hit.score == pytest.approx(old_scores[hit.path], abs=1e-6)


def test_reopen_after_a_rebuild_with_other_weights_loads_the_new_model(live_dirs: tuple[Path, Path, Path], other_model: Path) -> None:
    photos, idx, _ = live_dirs
    index = ImageIndex.open(idx, device="cpu")
    index.search("x", k=1)
    build_index(photos, idx, model=str(other_model), workers=0, device="cpu", rebuild=True)
    fresh = index.reopen()
    assert fresh.encoders.text_encoder is not index.encoders.text_encoder
    reference = ImageIndex.open(idx, device="cpu").search("x", k=3)
    assert fresh.search("x", k=3) == reference


def test_live_index_follows_generations_and_fails_at_once_on_a_bad_directory(live_dirs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    photos, idx, model = live_dirs
    live = LiveIndex(idx, device="cpu")
    assert live.name == "photos.idx"
    first = live.current()
    assert live.current() is first
    _photos(photos, ["late.jpg"], seed=70)
    build_index(photos, idx, model=str(model), workers=0, device="cpu")
    second = live.current()
    assert second is not first and second.count == first.count + 1 and live.current() is second
    with pytest.raises(NotAnIndexError):
        LiveIndex(tmp_path / "nothing-here")


def test_source_file_names_the_recorded_file_and_refuses_bad_ids(live_dirs: tuple[Path, Path, Path]) -> None:
    photos, idx, _ = live_dirs
    index = ImageIndex.open(idx)
    files = {index.files.path(i) for i in range(index.count)}
    assert files == {photos.resolve() / "a.jpg", photos.resolve() / "b.jpg", photos.resolve() / "sub" / "c.jpg"}
    for bad in (-1, index.count, 10**12, "0", 1.0, True, None):
        with pytest.raises(InvalidArgumentError, match="no image with id"):
            index.files.path(bad)  # type: ignore[arg-type]


def test_source_file_refuses_a_recorded_path_that_leaves_the_folder(
    live_dirs: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, idx, _ = live_dirs
    index = ImageIndex.open(idx)
    for evil in (b"../secret.jpg", b"/etc/passwd", b"a/../../x.jpg", b"./a.jpg"):
        monkeypatch.setattr(index.metadata, "rows", lambda ids, columns, evil=evil: [{"path_bytes": evil}])
        with pytest.raises(IndexCorruptError, match="not a file inside the indexed folder"):
            index.files.path(0)


def test_search_similar_uses_the_stored_embedding(built_index: Path) -> None:
    index = ImageIndex.open(built_index)
    ids = [3, 0, 5]
    vectors = index.vectors.vectors_of(ids)
    assert vectors.shape == (3, index.dim) and vectors.dtype == np.float32
    assert np.array_equal(vectors, index.vectors.embeddings()[ids])
    hits = index.search(SearchRequest(similar_to=3, k=5))
    assert hits[0].id == 3 and hits[0].score == pytest.approx(1.0, abs=1e-5)
    assert hits == index.search_vectors(vectors[:1], k=5)[0]
    where = Filter(path_glob="*.png")
    assert all(h.path.endswith(".png") for h in index.search(SearchRequest(similar_to=3, k=5, where=where)))
    for bad in (-1, index.count, "3"):
        with pytest.raises(InvalidArgumentError):
            index.search(SearchRequest(similar_to=bad, k=5))  # type: ignore[arg-type]
    assert index.vectors.vectors_of([]).shape == (0, index.dim)


def test_one_index_serves_many_threads(built_index: Path) -> None:
    index = ImageIndex.open(built_index, device="cpu")
    queries = ["a red square", "a photo", "something blue", "a dog"] * 3
    where = Filter(path_glob="*.jpg")
    expected = {q: ImageIndex.open(built_index, device="cpu").search(q, k=4, where=where) for q in set(queries)}
    results: dict[int, object] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(queries))

    def work(i: int, q: str) -> None:
        try:
            barrier.wait()
            results[i] = (index.search(q, k=4, where=where), index.rows([0, 1], columns=("width",)),
                          index.search(SearchRequest(similar_to=i % 3, k=2)))
        except BaseException as exc:  # noqa: BLE001 - collected and re-raised by the test
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i, q)) for i, q in enumerate(queries)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, q in enumerate(queries):
        hits, _, similar = results[i]  # type: ignore[misc]
        assert hits == expected[q]
        assert similar[0].id == i % 3


def test_sizes_of_equals_the_recorded_rows(built_index: Path) -> None:
    index = ImageIndex.open(built_index)
    ids = [5, 0, index.count - 1, 5]
    rows = index.rows(ids, columns=("width", "height"))
    sizes = index.metadata.sizes_of(ids)
    assert sizes.dtype == np.int32 and sizes.tolist() == [[r["width"], r["height"]] for r in rows]
    assert index.metadata.sizes_of([]).shape == (0, 2)
    for bad in ([-1], [index.count]):
        with pytest.raises(InvalidArgumentError):
            index.metadata.sizes_of(bad)
