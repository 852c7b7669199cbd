"""A small index holding images and videos, written through the indexer's own write path with
chosen vectors (no decoding, no embedding of the files): the query side's tests know which
frames match a query and at which second.

``write_video_index`` puts real files under ``root`` (two tiny videos made by
:mod:`tests.videogen`, a few photos) and rows for them: the videos' frames get the vectors the
test gives per second, the images theirs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexer.commit import GenerationWriter, IndexMeta
from indexer.lock import IndexLock
from indexer.sides.registry import side_writers
from indexer.writer import FileRecord, FrameFacts
from retrieval.images import PhotoMeta
from tests.photos import photo
from tests.videogen import write_video


@dataclass(frozen=True)
class VideoRows:
    """A video file and its sampled frames: ``vectors[i]`` at ``times[i]`` seconds."""

    name: str
    codec: str
    times: Sequence[float]
    vectors: np.ndarray
    duration: float
    taken_us: int | None = None


def unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def write_video_index(out: Path, root: Path, meta: IndexMeta, images: Mapping[str, np.ndarray], videos: Sequence[VideoRows]) -> Path:
    """An index at ``out`` of ``images`` (name -> vector, a photo file each) and ``videos``, their
    files written under ``root``; rows in the order given (images first)."""
    root.mkdir(parents=True, exist_ok=True)
    records: list[FileRecord] = []
    vectors: list[np.ndarray] = []
    for i, (name, vector) in enumerate(images.items()):
        path = root / name
        photo("astronaut.png", max_side=48).save(path)
        st = path.stat()
        records.append(FileRecord(name.encode(), 48, 48, st.st_size, st.st_mtime_ns, f"{i:032x}"))
        vectors.append(vector)
    for j, video in enumerate(videos):
        path = root / video.name
        # A real file for serving (its frames need not match the vectors; the rows are the test's).
        write_video(path, [("astronaut.png", video.duration / 2), ("coffee.png", video.duration / 2)], video.codec, fps=4)
        st = path.stat()
        taken = PhotoMeta(video.taken_us, None, None, None, None) if video.taken_us is not None else PhotoMeta()
        for t, vector in zip(video.times, video.vectors, strict=True):
            frame = FrameFacts(float(t), t == video.times[0], video.duration, video.codec, 0)
            records.append(FileRecord(video.name.encode(), 96, 64, st.st_size, st.st_mtime_ns, f"v{j:031x}", taken, frame=frame))
            vectors.append(vector)
    out.mkdir(parents=True)
    with IndexLock(out):
        writer = GenerationWriter(out, meta, None, side_writers)
        writer.append(records, np.stack(vectors).astype(np.float32))
        writer.finish()
    return out


def car_index(out: Path, tiny_model: Path, query: str, extra: Sequence[VideoRows] = ()) -> Path:
    """The query side's index (``tiny_model``'s vectors): three images, a car photo near
    ``query`` among them, and two videos: ``trip.mp4`` (H.264, 10 s, a frame a second) shows the
    car at 3-5 s and again at 8 s; ``cats.webm`` (VP9) never does; then ``extra`` videos. Their
    files are under ``out``'s sibling ``media``."""
    from retrieval.encoders import load_encoder

    enc = load_encoder(str(tiny_model), device="cpu")
    rng = np.random.default_rng(7)
    q = query_vector(tiny_model, query)

    def away() -> np.ndarray:  # a vector far from the query
        v = rng.standard_normal(enc.dim).astype(np.float32)
        return unit(v - (v @ q) * q)

    trip = np.stack([away() for _ in range(10)])
    trip[[3, 4, 5]] = q
    trip[8] = unit(q + 0.08 * away())
    cats = np.stack([away() for _ in range(6)])
    root = out.parent / "media"
    meta = IndexMeta(model=str(tiny_model), model_fingerprint=enc.fingerprint, backend=enc.backend, dim=enc.dim,
                     preprocess=enc.preprocess.to_dict(), source_root=str(root))
    images = {"car.jpg": unit(q + 0.5 * away()), "dog.jpg": away(), "tree.jpg": away()}
    videos = [
        VideoRows("trip.mp4", "libx264", list(range(10)), trip, 10.0, taken_us=1_600_000_000_000_000),
        VideoRows("cats.webm", "libvpx-vp9", [0, 1.5, 3, 4.5, 6, 7.5], cats, 8.0),
        *extra,
    ]
    return write_video_index(out, root, meta, images, videos)


def query_vector(tiny_model: Path, query: str) -> np.ndarray:
    """``query`` embedded by ``tiny_model``'s text tower, normalised."""
    from retrieval.encoders import load_encoder

    return unit(load_encoder(str(tiny_model), device="cpu").embed_texts([query])[0])


__all__ = ["VideoRows", "car_index", "query_vector", "unit", "write_video_index"]
