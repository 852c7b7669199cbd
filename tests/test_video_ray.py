"""Videos beyond the local engine over a folder: WebDataset shards whose samples are videos (read
by ranges out of the tar, a damaged member skipped with its reason, served with Range requests),
and ``--engine ray`` (one video per actor task) giving the local build's rows, for a folder and
for shards alike. One embedded Ray serves the module.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("av")

from indexer import build_index  # noqa: E402
from retrieval.index import ImageIndex  # noqa: E402
from tests.photos import photo  # noqa: E402
from tests.videogen import write_video  # noqa: E402

BROKEN_MOV = b"\x00\x00\x00\x18ftypqt  " + b"\x00" * 64
OPTS = {"batch_size": 4, "workers": 0, "device": "cpu", "videos": True, "precision": "fp32"}


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of two photos, two videos (H.264 in MP4, VP9 in WebM) and a damaged QuickTime file."""
    root = tmp_path_factory.mktemp("video_ray") / "media"
    root.mkdir()
    photo("astronaut.png", 64).save(root / "astronaut.jpg")
    photo("coffee.png", 64).save(root / "coffee.jpg")
    write_video(root / "walk.mp4", [("rocket.jpg", 3.0), ("chelsea.png", 3.0)], gop=8)
    write_video(root / "cat.webm", [("chelsea.png", 2.0), ("motorcycle_left.png", 2.0)], "libvpx-vp9", gop=8)
    (root / "broken.mov").write_bytes(BROKEN_MOV)
    return root


@pytest.fixture(scope="module")
def shards(media: Path) -> Path:
    """The same files as one img2dataset-style shard: each its own sample with a caption and a
    ``.json``; the videos' samples hold no image."""
    out = media.parent / "shards"
    out.mkdir()
    with tarfile.open(out / "00000.tar", "w") as tar:
        for i, name in enumerate(["astronaut.jpg", "walk.mp4", "coffee.jpg", "cat.webm", "broken.mov"]):
            key = f"0000{i:04d}"
            ext = name.rsplit(".", 1)[1]
            meta = json.dumps({"url": f"https://example.com/{name}", "key": key}).encode()
            for member, data in ((f"{key}.{ext}", (media / name).read_bytes()), (f"{key}.txt", name.encode()), (f"{key}.json", meta)):
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out


@pytest.fixture(scope="module")
def local_builds(tiny_model: Path, media: Path, shards: Path) -> dict[str, Path]:
    """The local engine's index of the folder and of the shards."""
    out = {}
    for source in (media, shards):
        out[source.name] = source.parent / f"{source.name}-local.idx"
        build_index(source, out[source.name], model=str(tiny_model), **OPTS)
    return out


def _rows(index_dir: Path) -> tuple[list[tuple[str, str | None, float | None]], np.ndarray, list[tuple[str, str]]]:
    index = ImageIndex.open(index_dir)
    rows = [(r["path"], r["media"], r["frame_time"]) for r in index.rows(range(index.count), ("path", "media", "frame_time"))]
    skipped = sorted((s.path, s.reason) for s in index.metadata.skipped())
    return rows, np.asarray(index.vectors.embeddings()), skipped


def _member(path: str) -> str:
    # A shard row's file name as the folder's ("00000.tar#00000001.mp4" -> "walk.mp4" by its caption index).
    return path.split("#", 1)[1] if "#" in path else path


def test_shard_video_members_are_sampled_like_files_and_served_with_ranges(
    tmp_path: Path, tiny_model: Path, media: Path, shards: Path, local_builds: dict[str, Path]
) -> None:
    import shutil

    from fastapi.testclient import TestClient

    from clipsearch.server.app import create_app

    folder = local_builds[media.name]
    out = tmp_path / "shards.idx"
    shutil.copytree(local_builds[shards.name], out)
    rows, vectors, skipped = _rows(out)
    f_rows, f_vectors, f_skipped = _rows(folder)
    # The same frames at the same times with the same vectors as the folder's files.
    names = {"00000000.jpg": "astronaut.jpg", "00000001.mp4": "walk.mp4", "00000002.jpg": "coffee.jpg", "00000003.webm": "cat.webm"}
    by_name = {(names[_member(p)], t): vectors[i] for i, (p, _, t) in enumerate(rows)}
    f_by_name = {(p, t): f_vectors[i] for i, (p, _, t) in enumerate(f_rows)}
    assert sorted(by_name) == sorted(f_by_name) and sum(m == "video" for _, m, _ in rows) >= 4
    assert max(float(np.abs(by_name[k] - f_by_name[k]).max()) for k in by_name) <= 1e-5
    # The damaged member is skipped with the folder file's reason (FFmpeg's message names the member).
    assert [p for p, _ in skipped] == ["00000.tar#00000004.mov"]
    assert skipped[0][1].startswith("damaged or truncated container (") and f_skipped[0][1].startswith("damaged or truncated container (")
    # Unchanged shards: nothing read again. Without --videos the video samples have no image.
    again = build_index(shards, out, model=str(tiny_model), **OPTS)
    assert (again.added, again.updated) == (0, 0)
    images_only = build_index(shards, tmp_path / "images.idx", model=str(tiny_model), **{**OPTS, "videos": False})
    assert images_only.added == 2 and ImageIndex.open(tmp_path / "images.idx").metadata.has_videos is False
    # Served: the member's bytes (whole, a range, HEAD) and the frame as the thumbnail.
    index = ImageIndex.open(out)
    video_id = next(i for i, (p, m, _) in enumerate(rows) if m == "video" and p.endswith(".mp4"))
    data = (media / "walk.mp4").read_bytes()
    app = create_app([out], cache_dir=tmp_path / "thumbs", device="cpu", warm=False)
    with TestClient(app) as client:
        url = f"/api/images/{video_id}?index={out.name}"
        whole = client.get(url)
        assert whole.status_code == 200 and whole.content == data and whole.headers["content-type"] == "video/mp4"
        part = client.get(url, headers={"Range": "bytes=8-99"})
        assert part.status_code == 206 and part.content == data[8:100] and part.headers["content-range"] == f"bytes 8-99/{len(data)}"
        assert client.get(url, headers={"Range": "bytes=-4"}).content == data[-4:]
        assert client.get(url, headers={"Range": f"bytes={len(data)}-"}).status_code == 416
        head = client.head(url)
        assert head.status_code == 200 and int(head.headers["content-length"]) == len(data)
        thumb = client.get(f"/api/thumbnails/{video_id}?index={out.name}&size=64")
        assert thumb.status_code == 200 and thumb.content[:2] == b"\xff\xd8"
    assert index.count == len(rows)


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    from helpers import local_ray

    with local_ray():
        yield


def test_ray_build_with_videos_equals_local_build(tmp_path: Path, tiny_model: Path, media: Path, shards: Path,
                                                  local_builds: dict[str, Path], ray_local: None) -> None:
    """A folder and shards on two actors: the local engine's rows, frames, times, skips and vectors."""
    for source in (media, shards):
        local = local_builds[source.name]
        on_ray = tmp_path / f"{source.name}-ray.idx"
        report = build_index(source, on_ray, model=str(tiny_model), engine="ray", actors=2, cpus_per_actor=1, **OPTS)
        assert report.engine == "ray" and (report.added, report.newly_skipped) == (4, 1)
        rows, vectors, skipped = _rows(on_ray)
        l_rows, l_vectors, l_skipped = _rows(local)
        assert rows == l_rows and skipped == l_skipped and sum(m == "video" for _, m, _ in rows) >= 4
        assert vectors.shape == l_vectors.shape and float(np.abs(vectors - l_vectors).max()) <= 1e-5
