"""WebDataset shards in img2dataset's exact layout, for the shard tests and bench_shards.

img2dataset (``output_format="webdataset"``) writes ``{shard:05d}.tar`` files whose samples are
``KEY.jpg``, ``KEY.txt`` (the caption) and ``KEY.json``, KEY being the shard number and the
sample's index within it, zero-padded (``000010002``); the same images also go to a folder
here, so a test compares a folder build with a shard build of the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

from imagegen import photo_like


@dataclass(frozen=True)
class Sample:
    key: str
    jpeg: bytes
    caption: str
    url: str
    width: int
    height: int


def make_samples(n: int, seed: int = 0, size: int | None = None) -> list[Sample]:
    """``n`` JPEG photos with captions and source urls: small (tests), or ``size`` px on the
    longer side (benchmarks)."""
    out = []
    for i in range(n):
        w, h = (40 + (i * 7) % 33, 36 + (i * 5) % 29) if size is None else (size, size * 3 // 4 - i % 7)
        buf = io.BytesIO()
        photo_like(w, h, seed + i).save(buf, "JPEG", quality=90)
        out.append(Sample(f"{i:09d}", buf.getvalue(), f"a photo number {i} of a test scene", f"https://example.com/img/{i}.jpg", w, h))
    return out


def write_shards(root: Path, samples: list[Sample], per_shard: int) -> list[Path]:
    """``samples`` into img2dataset-style shards under ``root`` (webdataset's TarWriter)."""
    import webdataset as wds

    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for shard, start in enumerate(range(0, len(samples), per_shard)):
        path = root / f"{shard:05d}.tar"
        with wds.TarWriter(str(path)) as sink:
            for s in samples[start : start + per_shard]:
                key = f"{shard:05d}{int(s.key) % 10000:04d}"
                meta = {
                    "url": s.url, "caption": s.caption, "key": key, "status": "success", "error_message": None,
                    "width": s.width, "height": s.height, "original_width": s.width * 4, "original_height": s.height * 4,
                    "exif": "{}", "sha256": hashlib.sha256(s.jpeg).hexdigest(),
                }
                sink.write({"__key__": key, "jpg": s.jpeg, "txt": s.caption, "json": json.dumps(meta).encode()})
        paths.append(path)
    return paths


def write_folder(root: Path, samples: list[Sample], per_shard: int) -> Path:
    """The same images as files, named as their shard keys (to compare with a shard build)."""
    root.mkdir(parents=True, exist_ok=True)
    for j, s in enumerate(samples):
        key = f"{j // per_shard:05d}{int(s.key) % 10000:04d}"
        (root / f"{key}.jpg").write_bytes(s.jpeg)
    return root
