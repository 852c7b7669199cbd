"""Search by person at scale: what ``--person`` and ``--only`` cost a query, and a listing without one.

A real clipsearch index of ``--photos`` rows is written through the indexer's own
``GenerationWriter`` (synthetic clustered ``--dim``-d vectors, as ``bench_keywords.py`` makes
them; photos dated over ten years) with a faces side as ``index --faces`` commits it: each photo
holds a Poisson number of faces (mean ``--faces-per-photo``, at most 8), each the face of one of
``--people`` people drawn with Zipf-like popularity (the first person is in many photos, the last
in a handful), or of nobody (``--nobody-share``). Three people are named, so names and numbers
are both looked up.

Then, with the same query vectors for every row (the text tower is left out: it costs the same
with and without a filter), ``ImageIndex.search(SearchRequest(vector=..., k=10, where=...))`` is
timed with no filter (the baseline), a metadata filter (``path_prefix``, for comparison), one
popular person, one rare person, two people, and two people with ``only``; and the listing of a
popular person's photos without a query (newest first, ``k=50``). The rows take turns on each
query, so a loaded machine slows them alike; each row's p50 is also given as a ratio to the
baseline's. Also timed: the first search after an edit of ``people.json`` (the people are read
again) against the next one.

    python benchmarks/bench_person_filter.py [--photos 100000] [--queries 200]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from _common import ROOT, latency_summary  # noqa: E402
from _harness import Bench, note  # noqa: E402

sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

NAMES = ("Alice", "Bob", "Carol")


def _faces(rng: np.random.Generator, photos: int, people: int, per_photo: float, nobody: float) -> tuple[np.ndarray, np.ndarray]:
    """Each face's photo id and person (-1: nobody), photo ids ascending."""
    counts = np.minimum(rng.poisson(per_photo, photos), 8)
    image = np.repeat(np.arange(photos, dtype=np.int64), counts)
    popularity = 1.0 / np.arange(1, people + 1)
    person = rng.choice(people, size=image.size, p=popularity / popularity.sum()).astype(np.int64)
    person[rng.random(image.size) < nobody] = -1
    return image, person


def write_index(out: Path, photos: int, dim: int, people: int, per_photo: float, nobody: float, seed: int) -> dict[str, Any]:
    """The index with its faces side; returns how many faces and people it holds."""
    import pyarrow as pa

    from indexer.commit import GenerationWriter, IndexMeta
    from indexer.faces.side import NAME as FACES
    from indexer.faces.side import FaceTables, FaceWriter
    from indexer.faces.stage import face_options
    from indexer.sides.registry import side_writers
    from indexer.writer import FileRecord
    from retrieval.images import PhotoMeta
    from retrieval.layout import FACE_DESCRIPTOR_DIM, FACES_READ_SCHEMA, FACES_SCHEMA

    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((256, dim)).astype(np.float32)
    options = face_options()
    meta = IndexMeta(model="synthetic", model_fingerprint="sha256:" + "0" * 64, backend="hf", dim=dim, preprocess={},
                     source_root=str(out.parent), index_options={"index_type": "flat"}, sides={"faces": options})
    out.mkdir(parents=True)
    writer = GenerationWriter(out, meta, None, side_writers)
    paths: list[bytes] = []
    hashes: list[str] = []
    start_s = 1_300_000_000  # 2011: ten years of photos, one every ~53 minutes
    batch = 20_000
    for start in range(0, photos, batch):
        n = min(batch, photos - start)
        vecs = centres[rng.integers(0, len(centres), n)] + 0.6 * rng.standard_normal((n, dim)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        records = []
        for i in range(start, start + n):
            path, digest = f"{2011 + i * 10 // photos}/IMG_{i:06d}.jpg".encode(), f"{i:032x}"
            paths.append(path)
            hashes.append(digest)
            records.append(FileRecord(path, 640, 480, 1000, 1, digest, PhotoMeta(taken_us=(start_s + i * 3_150) * 1_000_000)))
        writer.append(records, vecs)
    writer.commit(complete=False)
    image, person = _faces(rng, photos, people, per_photo, nobody)
    faces_n = image.size
    box = rng.uniform(0, 200, (faces_n, 2)).astype(np.float32)
    landmarks = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(faces_n * 10, np.float32)), 10)
    descriptors = rng.standard_normal((faces_n, FACE_DESCRIPTOR_DIM)).astype(np.float32)
    face_no = np.zeros(faces_n, np.int16)
    if faces_n:
        first = np.r_[True, image[1:] != image[:-1]]
        run_start = np.maximum.accumulate(np.where(first, np.arange(faces_n), 0))
        face_no = (np.arange(faces_n) - run_start).astype(np.int16)
    path_col = pa.array([paths[i] for i in image.tolist()], pa.binary())
    hash_col = pa.array([hashes[i] for i in image.tolist()], pa.string())
    faces = pa.Table.from_arrays(
        [pa.array(image), path_col, hash_col, pa.array(face_no), pa.array(box[:, 0]), pa.array(box[:, 1]),
         pa.array(box[:, 0] + 60), pa.array(box[:, 1] + 60), pa.array(np.ones(faces_n, np.float32)), landmarks,
         pa.FixedSizeListArray.from_arrays(pa.array(descriptors.ravel()), FACE_DESCRIPTOR_DIM), pa.array(person)],
        schema=FACES_SCHEMA,
    )
    counts = np.bincount(image, minlength=photos).astype(np.int16)
    read = pa.Table.from_arrays(
        [pa.array(np.arange(photos, dtype=np.int64)), pa.array(paths, pa.binary()), pa.array(hashes, pa.string()),
         pa.array(counts), pa.nulls(photos, pa.string())],
        schema=FACES_READ_SCHEMA,
    )
    writer.side(FACES, FaceWriter).set_tables(writer, FaceTables(faces, read, options))
    writer.finish()
    present = np.unique(person[person >= 0])
    photos_of = {int(p): int(np.unique(image[person == p]).size) for p in present.tolist()}
    # The three named: the most popular, one a tenth of the way down, and the rarest found.
    chosen = [int(present[0]), int(present[len(present) // 10]), min(photos_of, key=lambda p: (photos_of[p], -p))]
    return {"faces": int(faces_n), "people": int(present.size), "chosen": chosen,
            "photos_of_named": {name: photos_of[p] for name, p in zip(NAMES, chosen, strict=True)}}


def _name_people(out: Path, numbers: list[int]) -> dict[str, str]:
    """Gives :data:`NAMES` to the people ``numbers``; returns name -> #number."""
    from retrieval.faces import People, editing

    chosen = dict(zip(NAMES, numbers, strict=True))
    found = People.open(out)
    with editing(out) as box:
        for name, number in chosen.items():
            box[0] = box[0].named(found.find(f"#{number}"), name)
    return {name: f"#{number}" for name, number in chosen.items()}


def measure(out: Path, dim: int, queries: int, seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from retrieval import ImageIndex
    from retrieval.faces import editing
    from retrieval.filters import Filter
    from retrieval.request import SearchRequest

    index = ImageIndex.open(out)
    rng = np.random.default_rng(seed + 1)
    vecs = rng.standard_normal((queries, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    filters: dict[str, Filter | None] = {
        "no filter": None,
        "path_prefix (metadata)": Filter(path_prefix=("2015/",)),
        "person, popular": Filter(person=(NAMES[0],)),
        "person, rare": Filter(person=(NAMES[2],)),
        "two people": Filter(person=(NAMES[0], NAMES[1])),
        "two people, only": Filter(person=(NAMES[0], NAMES[1]), only_people=True),
    }
    browse = SearchRequest(where=Filter(person=(NAMES[0],)), k=50)

    def run(label: str, vec: np.ndarray) -> list[Any]:
        if label == "listing (no query)":
            return index.search(browse)
        return index.search(SearchRequest(vector=vec, k=10, where=filters[label]))

    labels = [*filters, "listing (no query)"]
    for vec in vecs[:10]:  # warm-up: the people read once, the FAISS file paged in
        for label in labels:
            run(label, vec)
    seconds: dict[str, list[float]] = {label: [] for label in labels}
    results: dict[str, int] = {}
    for j, vec in enumerate(vecs):
        turn = labels[j % len(labels):] + labels[: j % len(labels)]
        for label in turn:
            t0 = time.perf_counter()
            hits = run(label, vec)
            seconds[label].append(time.perf_counter() - t0)
            results[label] = len(hits)
    base = latency_summary(seconds["no filter"])["p50"]
    rows = []
    for label in labels:
        summary = latency_summary(seconds[label])
        rows.append({"search": label, **{f"{k}_ms": v for k, v in summary.items()}, "hits": results[label],
                     "x_no_filter_p50": round(summary["p50"] / base, 2) if base else None})
    # The first search after an edit reads the faces side and people.json again; the next does not.
    after_edit, next_one = [], []
    person = Filter(person=(NAMES[0],))
    bob = index.people.people().find(NAMES[1])
    for i in range(5):
        with editing(out) as box:
            box[0] = box[0].named(bob, f"{NAMES[1]} {i}")
        t0 = time.perf_counter()
        index.search(SearchRequest(vector=vecs[i % len(vecs)], k=10, where=person))
        after_edit.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        index.search(SearchRequest(vector=vecs[i % len(vecs)], k=10, where=person))
        next_one.append(time.perf_counter() - t0)
    edit = {"first_after_edit_p50_ms": latency_summary(after_edit)["p50"], "next_p50_ms": latency_summary(next_one)["p50"]}
    return rows, edit


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_person_filter", __doc__, "seed", "work_dir")
    p = bench.parser
    p.add_argument("--photos", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--people", type=int, default=300, help="people in the collection (default 300)")
    p.add_argument("--faces-per-photo", type=float, default=1.2, help="mean faces per photo (default 1.2)")
    p.add_argument("--nobody-share", type=float, default=0.3, help="share of faces that are nobody's (default 0.3)")
    p.add_argument("--queries", type=int, default=200)
    args = bench.parse(argv)
    if args.photos < 10 or args.people < 3 or not 0 <= args.nobody_share < 1 or args.faces_per_photo <= 0 or args.queries < 1:
        return bench.fail("need --photos >= 10, --people >= 3, 0 <= --nobody-share < 1, --faces-per-photo > 0, --queries >= 1", 2)
    with bench.scratch() as work:
        out = work / "people.idx"
        note(f"writing {args.photos} photos with faces")
        t0 = time.perf_counter()
        sizes = write_index(out, args.photos, args.dim, args.people, args.faces_per_photo, args.nobody_share, args.seed)
        written = time.perf_counter() - t0
        named = _name_people(out, sizes.pop("chosen"))
        note("searching")
        rows, edit = measure(out, args.dim, args.queries, args.seed)
    summary = {"photos": args.photos, "dim": args.dim, "write_index_s": round(written, 1), "named": named, **sizes, **edit}
    table = [
        f"{args.photos} photos, {args.dim}-d flat, {sizes['faces']} faces of {sizes['people']} people "
        f"(photos of {', '.join(f'{n}: {c}' for n, c in sizes['photos_of_named'].items())}); "
        f"{args.queries} vector queries, k=10",
        f"{'search':<24} {'p50 ms':>8} {'p99 ms':>8} {'x none':>7} {'hits':>5}",
    ]
    table += [f"{r['search']:<24} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} {r['x_no_filter_p50']:>7} {r['hits']:>5}" for r in rows]
    table.append(f"first search after an edit of people.json: {edit['first_after_edit_p50_ms']} ms p50, "
                 f"the next {edit['next_p50_ms']} ms")
    bench.report({"bench": "person_filter", "summary": summary, "rows": rows}, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
