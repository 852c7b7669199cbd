"""Videos in search results: a video is one hit at its best moment, with all its moments, in the
Python API, the CLI (``clip.mp4 00:03-00:06``, ``--media``, ``--json``) and over HTTP (the
moment's fields, the file with Range and HEAD, the frame as the thumbnail)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("av")

from retrieval.errors import InvalidArgumentError  # noqa: E402
from retrieval.filters import Filter  # noqa: E402
from retrieval.index import ImageIndex  # noqa: E402
from retrieval.request import SearchRequest  # noqa: E402
from tests import videoindex  # noqa: E402
from tests.conftest import cli_here  # noqa: E402

QUERY = "a red car on a bridge"


@pytest.fixture(scope="module")
def query_vector(tiny_model: Path) -> np.ndarray:
    return videoindex.query_vector(tiny_model, QUERY)


@pytest.fixture(scope="module")
def video_index(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """tests.videoindex.car_index: trip.mp4 shows the car at 3-5 s and at 8 s, cats.webm never."""
    return videoindex.car_index(tmp_path_factory.mktemp("vidx") / "media.idx", tiny_model, QUERY)


def test_a_video_is_one_hit_at_its_best_moment(video_index: Path, query_vector: np.ndarray) -> None:
    index = ImageIndex.open(video_index)
    hits = index.search(SearchRequest(vector=query_vector, k=10))
    # Every file once: 3 images and 2 videos (not 16 frame rows).
    assert sorted(h.path for h in hits) == ["car.jpg", "cats.webm", "dog.jpg", "tree.jpg", "trip.mp4"]
    top = hits[0]
    assert top.path == "trip.mp4" and top.media == "video"
    # The car shows at 3, 4 and 5 s: one moment up to the next sampled frame; and again at 8 s.
    assert (top.start, top.end) == (3.0, 6.0) and top.frame_time in (3.0, 4.0, 5.0)
    assert top.score == pytest.approx(1.0, abs=1e-4)
    assert top.moments is not None and [(m.start, m.end) for m in top.moments] == [(3.0, 6.0), (8.0, 9.0)]
    assert top.moments[1].score < top.moments[0].score
    # The best frame's row: its id is a trip.mp4 row at the frame's time.
    row = index.rows([top.id], columns=("path", "frame_time", "media"))[0]
    assert row == {"path": "trip.mp4", "frame_time": top.frame_time, "media": "video"}
    assert hits[1].path == "car.jpg" and hits[1].media is None and hits[1].start is None
    out = top.to_dict()
    assert out["media"] == "video" and out["start"] == 3.0 and out["end"] == 6.0
    second = top.moments[1]
    assert out["moments"][1] == {"start": 8.0, "end": 9.0, "time": 8.0, "score": pytest.approx(second.score), "id": second.id}


def test_media_filter_k_min_score_and_sort(video_index: Path, query_vector: np.ndarray) -> None:
    index = ImageIndex.open(video_index)
    videos = index.search(SearchRequest(vector=query_vector, k=10, where=Filter(media="video")))
    assert [h.path for h in videos] == ["trip.mp4", "cats.webm"]
    images = index.search(SearchRequest(vector=query_vector, k=10, where=Filter(media="image")))
    assert sorted(h.path for h in images) == ["car.jpg", "dog.jpg", "tree.jpg"] and all(h.media is None for h in images)
    assert len(index.search(SearchRequest(vector=query_vector, k=10, where=Filter(media="all")))) == 5
    # Ready vectors too: a video once per list.
    (listed,) = index.search_vectors(query_vector[None], k=3)
    assert [h.path for h in listed] == ["trip.mp4", "car.jpg", listed[2].path] and listed[0].start == 3.0
    # k counts files, not frames.
    assert [h.path for h in index.search(SearchRequest(vector=query_vector, k=2))] == ["trip.mp4", "car.jpg"]
    # min_score: the moments are the frames above it (8 s scores below 0.999).
    sure = index.search(SearchRequest(vector=query_vector, min_score=0.999))
    assert [h.path for h in sure] == ["trip.mp4"]
    assert sure[0].moments is not None and [(m.start, m.end) for m in sure[0].moments] == [(3.0, 6.0)]
    # Newest first: the dated video before the undated files.
    taken = index.search(SearchRequest(vector=query_vector, k=3, sort="taken"))
    assert taken[0].path == "trip.mp4" and taken[0].start == 3.0
    # More like a frame: the frame's video itself first.
    like = index.search(SearchRequest(similar_to=videos[0].id, k=2))
    assert like[0].path == "trip.mp4" and like[0].frame_time in (3.0, 4.0, 5.0)
    # No query, a filter: what it keeps, newest first, a video once (its first frame), no score.
    listed = index.search(SearchRequest(where=Filter(media="video")))
    assert [(h.path, h.media, h.score, h.frame_time) for h in listed] == [
        ("trip.mp4", "video", None, 0.0), ("cats.webm", "video", None, 0.0)]
    assert len(index.search(SearchRequest(where=Filter(min_width=1), k=50))) == 5
    with pytest.raises(InvalidArgumentError, match="media must be one of"):
        Filter(media="audio")


def test_cli_prints_the_moment_and_json(video_index: Path) -> None:
    res = cli_here(["search", video_index, QUERY, "-k", "2", "--mode", "vector"])
    assert res.returncode == 0, res.stderr
    first = res.stdout.splitlines()[0]
    assert first.split()[2:4] == ["trip.mp4", "00:03-00:06"], res.stdout
    assert "(best 00:0" in first
    res = cli_here(["search", video_index, QUERY, "--media", "image", "--json"])
    assert res.returncode == 0, res.stderr
    results: list[dict[str, Any]] = json.loads(res.stdout)["results"]
    assert results and all(r["path"].endswith(".jpg") and "media" not in r for r in results)
    res = cli_here(["search", video_index, QUERY, "--media", "video", "--json"])
    results = json.loads(res.stdout)["results"]
    assert [r["path"] for r in results] == ["trip.mp4", "cats.webm"]
    assert results[0]["start"] == 3.0 and results[0]["end"] == 6.0 and len(results[0]["moments"]) == 2
    bad = cli_here(["search", video_index, QUERY, "--media", "audio"])
    assert bad.returncode != 0 and "audio" in bad.stderr and "Traceback" not in bad.stderr


def test_http_moments_range_head_and_frame_thumbnail(video_index: Path, query_vector: np.ndarray, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from clipsearch.server.app import create_app

    app = create_app([video_index], cache_dir=tmp_path / "thumbs", device="cpu", warm=False)
    with TestClient(app) as client:
        res = client.post("/api/search", json={"vector": query_vector.tolist(), "k": 3, "filters": {"media": "video"}})
        assert res.status_code == 200, res.text
        results = res.json()["results"]
        assert [r["path"] for r in results] == ["trip.mp4", "cats.webm"]
        top = results[0]
        assert top["media"] == "video" and (top["start"], top["end"]) == (3.0, 6.0) and len(top["moments"]) == 2
        assert top["video_url"] == f"/api/images/{top['id']}?index=media.idx#t=3,6"
        images = client.post("/api/search", json={"vector": query_vector.tolist(), "k": 5, "filters": {"media": "image"}}).json()
        assert all(r["media"] is None and r["video_url"] is None for r in images["results"])
        # The video file: whole, a byte range, and HEAD.
        url = f"/api/images/{top['id']}?index=media.idx"
        whole = client.get(url)
        size = (Path(ImageIndex.open(video_index).manifest.source_root) / "trip.mp4").stat().st_size
        assert whole.status_code == 200 and whole.headers["content-type"] == "video/mp4" and len(whole.content) == size
        assert whole.headers["accept-ranges"] == "bytes"
        part = client.get(url, headers={"Range": "bytes=4-11"})
        assert part.status_code == 206 and part.content == whole.content[4:12]
        assert part.headers["content-range"] == f"bytes 4-11/{size}"
        head = client.head(url)
        assert head.status_code == 200 and head.content == b"" and int(head.headers["content-length"]) == size
        assert client.get(url, headers={"Range": f"bytes={size + 10}-"}).status_code == 416
        # The thumbnail of a video hit is its frame (a JPEG), not a decode failure.
        thumb = client.get(f"/api/thumbnails/{top['id']}?index=media.idx&size=64")
        assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg" and thumb.content[:2] == b"\xff\xd8"
        bad = client.post("/api/search", json={"vector": query_vector.tolist(), "filters": {"media": "audio"}})
        assert bad.status_code in (400, 422) and "media" in bad.text


def test_duplicates_list_a_video_once_and_never_beside_itself(video_index: Path, tmp_path: Path) -> None:
    from retrieval.duplicates import find_duplicates

    index = ImageIndex.open(video_index)
    # trip.mp4's frames at 3, 4 and 5 s are the same vector: alike, but frames of one file.
    assert find_duplicates(index, threshold=0.99).groups == ()
    # Its frames and the car photo, at a low threshold: one group, each file once.
    groups = find_duplicates(index, threshold=0.85).groups
    assert [sorted([g.keep.path, *(d.path for d in g.duplicates)]) for g in groups] == [["car.jpg", "trip.mp4"]]

