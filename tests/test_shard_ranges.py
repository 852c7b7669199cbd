"""A video of a WebDataset shard served by ranged reads: the same answers as its folder copy's
(ranges, HEAD, 416), its member read whole and hash-checked once, then only the ranges asked
(bytes counted on the shard's file objects), a damaged member refused, a shard rewritten after
its check read and checked again; the same over S3's wire protocol (the ETag's change).
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import moto_s3

pytest.importorskip("av")

from indexer.commit import GenerationWriter, IndexMeta  # noqa: E402
from indexer.lock import IndexLock  # noqa: E402
from indexer.sides.registry import side_writers  # noqa: E402
from indexer.writer import FileRecord, FrameFacts  # noqa: E402
from retrieval import shard_ranges  # noqa: E402
from retrieval.errors import InvalidArgumentError, ShardSourceError  # noqa: E402
from retrieval.shard_ranges import ShardMember, VerifiedMembers  # noqa: E402
from retrieval.shards import SampleMeta  # noqa: E402
from tests.videogen import write_video  # noqa: E402


@dataclass
class Served:
    folder: Path  # the index of the folder's walk.mp4
    shards: Path  # the index of the same bytes as members of 00000.tar, and a damaged copy in 00001.tar
    shard_dir: Path
    data: bytes


def _blake(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _write_tar(path: Path, members: list[tuple[str, bytes]]) -> dict[str, int]:
    """A tar of ``members``; where each one's bytes start."""
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with tarfile.open(path) as tar:
        return {m.name: m.offset_data for m in tar.getmembers()}


def _write_index(out: Path, meta: IndexMeta, records: list[FileRecord], dim: int) -> Path:
    out.mkdir(parents=True)
    vectors = np.random.default_rng(0).standard_normal((len(records), dim)).astype(np.float32)
    with IndexLock(out):
        writer = GenerationWriter(out, meta, None, side_writers)
        writer.append(records, vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
        writer.finish()
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Served:
    from retrieval.encoders import load_encoder

    base = tmp_path_factory.mktemp("shard_ranges")
    media = base / "media"
    media.mkdir()
    write_video(media / "walk.mp4", [("astronaut.png", 1.0), ("coffee.png", 1.0)], fps=4)
    data = (media / "walk.mp4").read_bytes()
    shard_dir = base / "shards"
    shard_dir.mkdir()
    good = _write_tar(shard_dir / "00000.tar", [("00000000.txt", b"walk"), ("00000001.mp4", data)])
    damaged = data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]
    bad = _write_tar(shard_dir / "00001.tar", [("00010000.mp4", damaged)])
    enc = load_encoder(str(tiny_model), device="cpu")

    def meta(root: Path) -> IndexMeta:
        return IndexMeta(model=str(tiny_model), model_fingerprint=enc.fingerprint, backend=enc.backend, dim=enc.dim,
                         preprocess=enc.preprocess.to_dict(), source_root=str(root))

    frame = FrameFacts(0.0, True, 2.0, "h264")
    st = (media / "walk.mp4").stat()
    folder = _write_index(base / "folder.idx", meta(media), [FileRecord(b"walk.mp4", 96, 64, st.st_size, st.st_mtime_ns, _blake(data),
                                                                        frame=frame)], enc.dim)
    records = [
        FileRecord(f"{shard}#{name}".encode(), 96, 64, len(data), 0, _blake(data), sample=SampleMeta(shard, name[:-4], offsets[name]),
                   frame=frame)
        for shard, name, offsets in (("00000.tar", "00000001.mp4", good), ("00001.tar", "00010000.mp4", bad))
    ]
    return Served(folder, _write_index(base / "shards.idx", meta(shard_dir), records, enc.dim), shard_dir, data)


class CountingFS:
    """An fsspec filesystem whose reads of file contents are counted (``cat_file`` and the
    ``read`` of the files it opens)."""

    def __init__(self, fs: Any) -> None:
        self._fs = fs
        self.read = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        data: bytes = self._fs.cat_file(path, start=start, end=end)
        self.read += len(data)
        return data

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        counter = self
        handle = self._fs.open(path, mode, **kwargs)

        class Counted:
            def __enter__(self) -> Counted:
                return self

            def __exit__(self, *exc: object) -> None:
                handle.close()

            def seek(self, pos: int) -> int:
                return int(handle.seek(pos))

            def read(self, n: int = -1) -> bytes:
                data: bytes = handle.read(n)
                counter.read += len(data)
                return data

        return Counted()


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> CountingFS:
    """Every shard read of :mod:`retrieval.shard_ranges` counted, on a local filesystem."""
    from retrieval.shards import filesystem

    fs, _ = filesystem("/")
    wrapped = CountingFS(fs)
    monkeypatch.setattr(shard_ranges, "filesystem", lambda url, options=None: (wrapped, filesystem(url, options)[1]))
    return wrapped


def _client(served: Served, tmp_path: Path) -> Any:
    from fastapi.testclient import TestClient

    from clipsearch.server.app import create_app

    return TestClient(create_app([served.folder, served.shards], cache_dir=tmp_path / "thumbs", device="cpu", warm=False))


def test_shard_video_ranges_answer_as_the_folder_copy_and_read_only_the_range(served: Served, counting: CountingFS,
                                                                             tmp_path: Path) -> None:
    size = len(served.data)
    folder_url, shard_url = "/api/images/0?index=folder.idx", "/api/images/0?index=shards.idx"
    with _client(served, tmp_path) as client:
        # The first range of the member reads it whole (its hash checked), then its range.
        first = client.get(shard_url, headers={"Range": "bytes=10-109"})
        assert first.status_code == 206 and first.content == served.data[10:110]
        assert counting.read == size + 100
        # Then only the range asked is read, whichever it is.
        for header in ("bytes=4-11", "bytes=-7", f"bytes={size - 30}-", "bytes=0-", f"bytes=5-{size + 100}"):
            before = counting.read
            mine, theirs = client.get(shard_url, headers={"Range": header}), client.get(folder_url, headers={"Range": header})
            assert (mine.status_code, mine.content, mine.headers["content-range"]) == (
                theirs.status_code, theirs.content, theirs.headers["content-range"]), header
            assert mine.headers["content-type"] == theirs.headers["content-type"] == "video/mp4"
            assert mine.headers["accept-ranges"] == "bytes"
            assert counting.read - before == len(mine.content)
        # The whole file (no Range), HEAD (nothing read), and 416 (nothing read).
        before = counting.read
        whole = client.get(shard_url)
        assert whole.status_code == 200 and whole.content == served.data and counting.read - before == size
        before = counting.read
        head = client.head(shard_url)
        assert head.status_code == 200 and head.content == b"" and int(head.headers["content-length"]) == size
        assert head.headers["content-type"] == "video/mp4"
        part_head = client.head(shard_url, headers={"Range": "bytes=4-11"})
        assert part_head.status_code == 206 and part_head.headers["content-range"] == f"bytes 4-11/{size}"
        assert int(part_head.headers["content-length"]) == 8
        unsatisfiable = client.get(shard_url, headers={"Range": f"bytes={size}-"})
        assert unsatisfiable.status_code == 416 and unsatisfiable.headers["content-range"] == f"bytes */{size}"
        assert client.get(folder_url, headers={"Range": f"bytes={size}-"}).status_code == 416
        assert counting.read == before
        # The ETag is the recorded content hash: a revalidation is a 304.
        etag = whole.headers["etag"]
        assert etag == f'"{_blake(served.data)}"'
        assert client.get(shard_url, headers={"If-None-Match": etag}).status_code == 304


def test_a_long_range_is_answered_in_pieces(served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from clipsearch.server import ranges

    monkeypatch.setattr(ranges, "RANGE_LIMIT", 1000)
    with _client(served, tmp_path) as client:
        part = client.get("/api/images/0?index=shards.idx", headers={"Range": "bytes=100-"})
        assert part.status_code == 206 and part.content == served.data[100:1100]
        assert part.headers["content-range"] == f"bytes 100-1099/{len(served.data)}"


def test_a_damaged_member_is_refused_and_a_rewritten_shard_checked_again(served: Served, counting: CountingFS,
                                                                       tmp_path: Path) -> None:
    size = len(served.data)
    with _client(served, tmp_path) as client:
        for method in ("GET", "HEAD"):
            for headers in ({}, {"Range": "bytes=0-9"}):
                res = client.request(method, "/api/images/1?index=shards.idx", headers=headers)
                assert res.status_code == 404 and (method == "HEAD" or "changed since it was indexed" in res.json()["error"])
        url = "/api/images/0?index=shards.idx"
        assert client.get(url, headers={"Range": "bytes=0-9"}).status_code == 206
        # The member's byte 200 changes in place after its check: the shard's version changed, so it is read whole again.
        shard = served.shard_dir / "00000.tar"
        with tarfile.open(shard) as tar:
            at = tar.getmember("00000001.mp4").offset_data + 200
        st = shard.stat()
        original = served.data[200]
        try:
            with open(shard, "r+b") as f:
                f.seek(at)
                f.write(bytes([original ^ 0xFF]))
            # A later mtime, as a clock that moves between the two writes gives.
            os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
            before = counting.read
            res = client.get(url, headers={"Range": "bytes=0-9"})
            assert res.status_code == 404 and "changed since it was indexed" in res.json()["error"]
            assert counting.read - before >= size
        finally:
            with open(shard, "r+b") as f:
                f.seek(at)
                f.write(bytes([original]))
        # Mended: checked again, then served.
        assert client.get(url, headers={"Range": "bytes=0-9"}).content == served.data[:10]


def test_verified_members_remember_a_bounded_number(served: Served, counting: CountingFS, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError):
        VerifiedMembers(0)
    with tarfile.open(served.shard_dir / "00000.tar") as tar:
        offsets = {m.name: (m.offset_data, m.size) for m in tar.getmembers()}
    size = len(served.data)
    walk = ShardMember(str(served.shard_dir), "00000.tar", "00000001.mp4", offsets["00000001.mp4"][0], size, _blake(served.data))
    text = ShardMember(str(served.shard_dir), "00000.tar", "00000000.txt", offsets["00000000.txt"][0], 4, _blake(b"walk"))
    members = VerifiedMembers(capacity=1)
    assert members.check(walk) == served.data[: shard_ranges.HEAD]
    assert members.read(walk, 3, 5) == served.data[3:6] and counting.read == size + 3
    assert members.read(text, 0, 3) == b"walk"  # checked: the walk's check is forgotten
    before = counting.read
    assert members.read(walk, 3, 5) == served.data[3:6] and counting.read - before == size
    with pytest.raises(InvalidArgumentError):
        members.read(walk, 5, size)
    with pytest.raises(ShardSourceError, match="changed since it was indexed"):
        VerifiedMembers().read(ShardMember(str(served.shard_dir), "00000.tar", "x", offsets["00000001.mp4"][0], size, "0" * 32), 0, 1)
    with pytest.raises(ShardSourceError, match="no such file"):
        VerifiedMembers().check(ShardMember(str(served.shard_dir), "gone.tar", "x", 0, 1, "0" * 32))


def test_a_shard_set_serves_its_videos_by_ranges(served: Served, counting: CountingFS, tmp_path: Path) -> None:
    """Split into a set of two (a shard each): the member's place comes from its shard, the reads are the server's."""
    from fastapi.testclient import TestClient

    from clipsearch.server.app import create_app
    from indexer.partition import split_index

    split_index(served.shards, 2, tmp_path / "set")
    with TestClient(create_app([tmp_path / "set"], cache_dir=tmp_path / "thumbs", device="cpu", warm=False)) as client:
        assert client.get("/api/images/0?index=set", headers={"Range": "bytes=0-9"}).content == served.data[:10]
        before = counting.read
        part = client.get("/api/images/0?index=set", headers={"Range": "bytes=20-39"})
        assert part.status_code == 206 and part.content == served.data[20:40] and counting.read - before == 20
        assert client.get("/api/images/1?index=set", headers={"Range": "bytes=0-9"}).status_code == 404


@pytest.fixture(scope="module")
def s3_shard(served: Served) -> Iterator[tuple[Any, str]]:
    """The shard 00000.tar on moto's S3 (its wire protocol, on loopback): a boto3 client and its URL root."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    with moto_s3() as (s3, _):
        s3.create_bucket(Bucket="videos")
        s3.upload_file(str(served.shard_dir / "00000.tar"), "videos", "data/00000.tar")
        yield s3, "s3://videos/data"


def test_on_s3_a_replaced_shard_is_checked_again(served: Served, s3_shard: tuple[Any, str]) -> None:
    s3, root = s3_shard
    tar_bytes = (served.shard_dir / "00000.tar").read_bytes()
    with tarfile.open(served.shard_dir / "00000.tar") as tar:
        offset = tar.getmember("00000001.mp4").offset_data
    walk = ShardMember(root, "00000.tar", "00000001.mp4", offset, len(served.data), _blake(served.data))
    members = VerifiedMembers()
    assert members.read(walk, 0, 99) == served.data[:100]
    assert members.read(walk, 50, 59) == served.data[50:60]
    # The same key, other bytes in the member: a new ETag, so the member is checked again and refused.
    damaged = tar_bytes[: offset + 20] + bytes([tar_bytes[offset + 20] ^ 0xFF]) + tar_bytes[offset + 21:]
    s3.put_object(Bucket="videos", Key="data/00000.tar", Body=damaged)
    with pytest.raises(ShardSourceError, match="changed since it was indexed"):
        members.read(walk, 50, 59)
    s3.put_object(Bucket="videos", Key="data/00000.tar", Body=tar_bytes)
    assert members.read(walk, 50, 59) == served.data[50:60]
