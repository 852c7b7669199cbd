"""Text-query latency at 10k / 100k / 1M vectors, split into encode, search and metadata.

Each size gets a real clipsearch index directory without images: synthetic clustered 512-d
vectors (Gaussian clusters around random centres on the sphere, normalised; real CLIP
embeddings are clustered too, unlike uniform noise) written through the indexer's own write
path (``indexer.commit.GenerationWriter``: Parquet parts committed every ``--commit-every``
rows, FAISS, generation and manifest), under the model id and fingerprint of a randomly
initialised ViT-B/32-shaped CLIP checkpoint, so ``ImageIndex.open`` and ``.search`` run exactly
as on an index of photos. Text-tower cost does not depend on the weights' values.

First, text encoding alone (no index): one short query (3-8 words) at a time, in rounds of 25
queries per path (each path back to back, as a serving process runs it; rounds spread machine
noise over the paths alike):

* ``hf``: the plain Hugging Face call, ``CLIPModel.get_text_features(**tokenizer([text]))``
  under ``torch.no_grad()``, fp32 (the baseline);
* ``numpy fp32``: ``NumpyTextEncoder`` (``--precision fp32``: numpy only, no torch);
* ``numpy int8``: ``NumpyTextEncoder`` with ``--text-precision`` (default ``auto``: int8
  products where they pass the quality gate, the gate figures reported).

``text_p50_ms`` / ``text_p99_ms`` are the ``--text-precision`` path's, ``hf_text_p50_ms`` the
baseline's, ``x_hf`` their ratio of p50s.

Then, per index size, per query (after a warm-up) it times, with ``time.perf_counter``:

* encode: ``index.text_encoder.embed_texts([query])`` (tokenise + text tower + normalise,
  on the index's own text path at ``--text-precision``);
* search: the FAISS top-k (``retrieval.faiss_index.search`` on the index's FAISS object,
  including the deterministic tie ordering ``ImageIndex`` applies);
* metadata: turning the k ids into ``Hit(id, path, score)`` from the index's path table
  (read for the k hits only, from the memory-mapped path files);
* end to end: ``index.search(text, k)``, the public call, on the same queries, with the query
  cache off (the timed texts repeat);
* end to end, cached: the same calls once every text's vector is in the query cache (a
  repeated query skips the text tower; reported apart, not a text-tower figure).

Prints one JSON line, then a readable table.

    python benchmarks/bench_query.py [--sizes 10000,100000,1000000] [--queries 200] [--k 10]
        [--text-precision auto] [--text-queries 200]
"""

from __future__ import annotations

import argparse
import gc
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import latency_summary, peak_rss_mb
from _harness import Bench, listed

from clipsearch.cli import int_at_least

# Queries per path per round in the text-only comparison (see time_text_paths).
TEXT_BLOCK = 25
# Rows generated and written per step: bounds the transient memory (randn + Parquet buffers)
# whatever the size; only the FAISS input array grows with the index.
CHUNK_ROWS = 32_768

_SUBJECTS = (
    "a dog", "two cats", "a red car", "an old man", "a little girl", "a bowl of soup", "a sailboat",
    "a mountain", "a crowded street", "a wooden table", "a bicycle", "a plate of pasta", "a horse",
    "a birthday cake", "a lighthouse", "a laptop", "a pair of shoes", "a snowy forest", "a train",
    "a bride and groom",
)
_SCENES = (
    "", "on a beach", "at night", "in the rain", "in a kitchen", "next to a window", "under a bridge",
    "in a city park at sunset, seen from far away", "covered in snow", "on a table with a blue cloth",
)


@dataclass(frozen=True)
class SyntheticSpec:
    """How the synthetic vectors are drawn.

    Attributes:
        clusters: number of Gaussian cluster centres (uniform on the unit sphere).
        noise: standard deviation of the offset from the centre, as a fraction of unit norm
            (0.8 puts a vector at cosine ~0.78 from its centre before normalisation).
        seed: RNG seed; the same seed gives the same vectors.
    """

    clusters: int = 1000
    noise: float = 0.8
    seed: int = 0

    def __post_init__(self) -> None:
        if self.clusters < 1:
            raise ValueError(f"clusters must be >= 1, got {self.clusters}")
        if self.noise < 0:
            raise ValueError(f"noise must be >= 0, got {self.noise}")


def query_texts(n: int) -> list[str]:
    """``n`` distinct-ish query texts of varied length (deterministic)."""
    out = []
    for i in range(n):
        subject = _SUBJECTS[i % len(_SUBJECTS)]
        scene = _SCENES[(i // len(_SUBJECTS)) % len(_SCENES)]
        text = f"a photo of {subject} {scene}".strip()
        if i >= len(_SUBJECTS) * len(_SCENES):
            text += f", picture {i}"
        out.append(text)
    return out


def short_query_texts(n: int) -> list[str]:
    """``n`` queries of 3-8 words (the short queries a search box gets), cycling if needed."""
    texts = [t for t in query_texts(len(_SUBJECTS) * len(_SCENES)) if 3 <= len(t.split()) <= 8]
    return [texts[i % len(texts)] for i in range(n)]


def time_text_paths(model_dir: Path, precision: str, queries: int, warmup: int) -> dict[str, Any]:
    """p50/p99 of encoding one short query on each text path (see the module docstring)."""
    import torch
    from transformers import AutoTokenizer, CLIPModel

    from retrieval.encoders.base import quiet_transformers
    from retrieval.encoders.numpy_text import NumpyTextEncoder

    with quiet_transformers():
        model = CLIPModel.from_pretrained(model_dir).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def hf(texts: list[str]) -> Any:
        with torch.no_grad():
            return model.get_text_features(**tokenizer(texts, padding=True, return_tensors="pt"))

    t0 = time.perf_counter()
    reduced = NumpyTextEncoder.load(str(model_dir), precision=precision)
    load_s = time.perf_counter() - t0
    paths = {"hf": hf, "numpy fp32": NumpyTextEncoder.load(str(model_dir)).embed_texts, f"numpy {precision}": reduced.embed_texts}
    texts = short_query_texts(warmup + queries)
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    for fn in paths.values():
        for text in texts[:warmup]:
            fn([text])
    # Blocks of TEXT_BLOCK queries per path in turn: each path runs back to back as in a process
    # that serves queries (its weights warm in the caches, not evicted by another path's after
    # every query), while rounds spread machine noise over all paths alike.
    timed = texts[warmup:]
    for start in range(0, len(timed), TEXT_BLOCK):
        for name, fn in paths.items():
            for text in timed[start : start + TEXT_BLOCK]:
                t0 = time.perf_counter()
                fn([text])
                seconds[name].append(time.perf_counter() - t0)
    lat = {name: latency_summary(s) for name, s in seconds.items()}
    ours = lat[f"numpy {precision}"]
    return {
        "queries": queries,
        "words": "3-8",
        "latency_ms": lat,
        "text_precision": reduced.precision_info(),
        "load_seconds": round(load_s, 3),
        "text_p50_ms": ours["p50"],
        "text_p99_ms": ours["p99"],
        "hf_text_p50_ms": lat["hf"]["p50"],
        "hf_text_p99_ms": lat["hf"]["p99"],
        "x_hf": round(lat["hf"]["p50"] / ours["p50"], 2),
    }


def synthetic_chunks(n: int, dim: int, spec: SyntheticSpec, rows_per_chunk: int = 0) -> Iterator[Any]:
    """Yield ``(rows, dim)`` float32 L2-normalised chunks (``rows_per_chunk``, default
    :data:`CHUNK_ROWS`), ``n`` rows in all."""
    import numpy as np

    rng = np.random.default_rng(spec.seed)
    centres = rng.standard_normal((spec.clusters, dim), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    # Noise per coordinate scaled by 1/sqrt(dim) so that its norm is ~spec.noise.
    scale = np.float32(spec.noise / np.sqrt(dim))
    done = 0
    step = rows_per_chunk or CHUNK_ROWS
    while done < n:
        rows = min(step, n - done)
        labels = rng.integers(0, spec.clusters, size=rows)
        chunk = rng.standard_normal((rows, dim), dtype=np.float32)
        chunk *= scale
        chunk += centres[labels]
        chunk /= np.linalg.norm(chunk, axis=1, keepdims=True)
        yield chunk
        done += rows


def synthetic_queries(q: int, dim: int, spec: SyntheticSpec) -> Any:
    """``q`` vectors from the same clusters as :func:`synthetic_chunks` (same centres, other
    draws): in-distribution queries that are not in the index."""
    import numpy as np

    centres = np.random.default_rng(spec.seed).standard_normal((spec.clusters, dim), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    rng = np.random.default_rng(spec.seed + 10_000)
    x = rng.standard_normal((q, dim), dtype=np.float32) * np.float32(spec.noise / np.sqrt(dim))
    x += centres[rng.integers(0, spec.clusters, size=q)]
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def build_synthetic_index(
    out: Path, encoder: Any, n: int, spec: SyntheticSpec, commit_every: int, index_type: str = "flat", chunks: Any = None
) -> dict[str, float | int]:
    """Write a complete clipsearch index of ``n`` synthetic vectors to ``out`` (a new directory).

    The rows go through the indexer's own write path (``GenerationWriter`` under the index
    lock: Parquet parts, a generation published every ``commit_every`` rows, then the FAISS
    index and the final manifest), so the directory is laid out exactly as ``build_index``
    leaves a collection of ``n`` photos; only decoding and embedding are replaced.

    ``chunks`` replaces the drawn vectors with the caller's (an iterable of ``(rows, dim)``
    float32 arrays, ``n`` rows in all), e.g. with planted near-duplicates.

    Returns:
        Timings in seconds: ``generate`` (drawing vectors), ``write`` (rows and intermediate
        commits), ``finish`` (FAISS over all rows and the final commit) and ``total``.
    """
    import numpy as np

    from indexer.commit import GenerationWriter, IndexMeta
    from indexer.lock import IndexLock
    from indexer.sides.registry import side_writers
    from indexer.writer import FileRecord

    start = time.perf_counter()
    out.mkdir(parents=True)
    meta = IndexMeta(
        model=encoder.name,
        model_fingerprint=encoder.fingerprint,
        backend=encoder.backend,
        dim=encoder.dim,
        preprocess={**encoder.preprocess.to_dict(), "jpeg_draft": True},
        source_root="synthetic",
        index_options={"index_type": index_type},
    )
    width = max(6, len(str(n - 1)))
    facts_rng = np.random.default_rng(spec.seed + 1)
    gen_s = write_s = 0.0
    row = since_commit = 0
    with IndexLock(out):
        writer = GenerationWriter(out, meta, None, side_writers)
        t0 = time.perf_counter()
        if chunks is None:
            chunks = synthetic_chunks(n, encoder.dim, spec, rows_per_chunk=min(CHUNK_ROWS, commit_every))
        for chunk in chunks:
            t1 = time.perf_counter()
            gen_s += t1 - t0
            rows = len(chunk)
            # File facts as a photo collection has them: random (incompressible) content hashes
            # and varied sizes, so that bytes per vector on disk are realistic.
            digests = facts_rng.bytes(16 * rows)
            sizes = facts_rng.integers(50_000, 400_000, size=rows)
            records = [
                FileRecord(
                    path=f"synthetic/{i:0{width}d}.jpg".encode(),
                    width=640,
                    height=480,
                    size=int(sizes[j]),
                    mtime_ns=1_700_000_000_000_000_000 + i,
                    content_hash=digests[16 * j : 16 * j + 16].hex(),
                )
                for j, i in enumerate(range(row, row + rows))
            ]
            writer.append(records, chunk)
            row += rows
            since_commit += rows
            if since_commit >= commit_every:
                writer.commit(complete=False)
                since_commit = 0
            t0 = time.perf_counter()
            write_s += t0 - t1
        t1 = time.perf_counter()
        writer.finish()
        finish_s = time.perf_counter() - t1
        commits = writer.commits
    return {
        "generate": round(gen_s, 3),
        "write": round(write_s, 3),
        "finish": round(finish_s, 3),
        "total": round(time.perf_counter() - start, 3),
        "commits": commits,
    }


def _disk_bytes(index_dir: Path) -> dict[str, int]:
    """Bytes of the current generation's files: Parquet parts, FAISS file, everything."""
    from retrieval.layout import read_manifest

    manifest = read_manifest(index_dir)
    parts = sum((index_dir / p.path).stat().st_size for p in manifest.parts)
    faiss = (index_dir / manifest.faiss.path).stat().st_size if manifest.faiss is not None else 0
    total = sum(p.stat().st_size for p in index_dir.rglob("*") if p.is_file())
    return {"embeddings": parts, "faiss": faiss, "total": total, "parts": len(manifest.parts)}


def measure_size(
    work: Path,
    encoder: Any,
    n: int,
    texts: list[str],
    warmup: int,
    k: int,
    spec: SyntheticSpec,
    commit_every: int,
    text_precision: str = "fp32",
) -> dict[str, Any]:
    """Build an index of ``n`` vectors, time queries against it, delete it; return the figures.

    ``encoder`` names the model the index is written under; queries run on the index's own
    text path at ``text_precision`` (as ``ImageIndex.open(dir, precision=...)`` gives it).
    """
    from retrieval import ImageIndex
    from retrieval.index import Hit

    out = work / f"synthetic-{n}.idx"
    build = build_synthetic_index(out, encoder, n, spec, commit_every)
    disk = _disk_bytes(out)
    t0 = time.perf_counter()
    # No query cache: the timed texts repeat, and a cache hit skips the text tower (timed apart below).
    index = ImageIndex.open(out, device=str(encoder.device), precision=text_precision, query_cache=0)
    open_s = time.perf_counter() - t0
    text_encoder = index.text_encoder
    # The stages are timed through ImageIndex's own per-stage calls: the FAISS search
    # (search_ids) and the hits' paths (paths_of, memory-mapped path files) that index.search uses.

    for text in texts[:warmup]:
        index.search(text, k)
    enc_t: list[float] = []
    search_t: list[float] = []
    meta_t: list[float] = []
    for text in texts[warmup:]:
        t0 = time.perf_counter()
        vec = text_encoder.embed_texts([text])
        t1 = time.perf_counter()
        scores, ids = index.search_ids(vec, k)
        t2 = time.perf_counter()
        ok = ids[0] >= 0
        found = ids[0][ok]
        hits = [Hit(int(i), p, float(s)) for s, i, p in zip(scores[0][ok], found, index.paths_of(found), strict=True)]
        t3 = time.perf_counter()
        if len(hits) != min(k, n):
            raise RuntimeError(f"expected {min(k, n)} hits, got {len(hits)}")
        enc_t.append(t1 - t0)
        search_t.append(t2 - t1)
        meta_t.append(t3 - t2)
    e2e_t: list[float] = []
    for text in texts[warmup:]:
        t0 = time.perf_counter()
        index.search(text, k)
        e2e_t.append(time.perf_counter() - t0)
    # The same queries once their vectors are in the query cache (a repeated query), reported apart.
    cached = ImageIndex.open(out, device=str(encoder.device), precision=text_precision, query_cache=len(texts))
    for text in texts:
        cached.search(text, k)
    cached_t: list[float] = []
    for text in texts[warmup:]:
        t0 = time.perf_counter()
        cached.search(text, k)
        cached_t.append(time.perf_counter() - t0)
    del cached
    result = {
        "n": n,
        "build_seconds": build,
        "open_seconds": round(open_s, 3),
        "disk_bytes": disk,
        "bytes_per_vector": {
            "total": round(disk["total"] / n, 1),
            "embeddings_parquet": round(disk["embeddings"] / n, 1),
            "faiss": round(disk["faiss"] / n, 1),
        },
        "latency_ms": {
            "encode": latency_summary(enc_t),
            "search": latency_summary(search_t),
            "metadata": latency_summary(meta_t),
            "end_to_end": latency_summary(e2e_t),
            "end_to_end_cached": latency_summary(cached_t),
        },
        "text_path": index.text_path().to_dict(),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
    del index, text_encoder
    gc.collect()
    shutil.rmtree(out, ignore_errors=True)
    return result


_positive = int_at_least(1)


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_query", __doc__, "seed", "work_dir")
    parser = bench.parser
    parser.add_argument("--sizes", type=listed(int), default=[10_000, 100_000, 1_000_000],
                        help="index sizes (default: 10000,100000,1000000)")
    parser.add_argument("--queries", type=_positive, default=200, help="timed queries per size (default: 200)")
    parser.add_argument("--warmup", type=int_at_least(0), default=20, help="untimed queries first (default: 20)")
    parser.add_argument("--k", type=_positive, default=10, help="results per query (default: 10)")
    parser.add_argument("--preset", default="vit-b-32", choices=["vit-b-32", "tiny"], help="random model shape (default: vit-b-32)")
    parser.add_argument("--clusters", type=_positive, default=1000, help="Gaussian cluster centres (default: 1000)")
    parser.add_argument("--noise", type=float, default=0.8, help="cluster spread, as a norm (default: 0.8)")
    parser.add_argument("--commit-every", type=_positive, default=None,
                        help="rows per committed Parquet part, as build_index's commit_every (default: the indexer's default)")
    parser.add_argument("--device", default="cpu", help="query encoder device (default: cpu)")
    parser.add_argument("--text-precision", default="auto", choices=["fp32", "int8", "auto"],
                        help="text tower precision of the timed paths and the indexes' queries (default: auto)")
    parser.add_argument("--text-queries", type=int, default=200,
                        help="timed queries of the text-only comparison; 0 skips it (default: 200)")
    parser.add_argument("--torch-threads", type=_positive, default=None, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--faiss-threads", type=_positive, default=None, help="FAISS OpenMP threads (default: FAISS's choice)")
    args = bench.parse(argv)
    spec = SyntheticSpec(clusters=args.clusters, noise=args.noise, seed=args.seed)
    if args.commit_every is None:
        from indexer.build import BuildConfig

        args.commit_every = BuildConfig().commit_every

    # Imported here so that the first build's FAISS time excludes the import.
    import faiss
    import torch

    from retrieval.encoders import load_encoder
    from retrieval.tools.random_model import make_random_clip

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    if args.faiss_threads:
        faiss.omp_set_num_threads(args.faiss_threads)

    texts = short_query_texts(args.warmup + args.queries)
    with bench.scratch() as work:
        t0 = time.perf_counter()
        model_dir = make_random_clip(work / "model", preset=args.preset, seed=0)
        model_s = time.perf_counter() - t0
        encoder = load_encoder(str(model_dir), device=args.device)
        t0 = time.perf_counter()
        encoder.embed_texts(["warm up the text tower"])  # loads the tower: not a query cost
        load_s = time.perf_counter() - t0
        text = time_text_paths(model_dir, args.text_precision, args.text_queries, args.warmup) if args.text_queries > 0 else None
        results = [
            measure_size(work, encoder, n, texts, args.warmup, args.k, spec, args.commit_every, args.text_precision)
            for n in args.sizes
        ]
    bench.report({
        "bench": "query", "preset": args.preset, "dim": encoder.dim, "k": args.k, "queries": args.queries,
        "warmup": args.warmup, "device": str(encoder.device),
        "synthetic": {"clusters": spec.clusters, "noise": spec.noise, "seed": spec.seed},
        "commit_every": args.commit_every, "model_create_seconds": round(model_s, 3), "text_tower_load_seconds": round(load_s, 3),
        "text_precision": args.text_precision, "text": text,
        **({k: text[k] for k in ("text_p50_ms", "text_p99_ms", "hf_text_p50_ms", "hf_text_p99_ms")} if text else {}),
        "sizes": results, "peak_rss_mb": round(peak_rss_mb(), 1),
    }, table(args, text, results, str(encoder.device)))
    return 0


def table(args: argparse.Namespace, text: dict[str, Any] | None, results: list[dict[str, Any]], device: str) -> list[str]:
    lines = []
    if text:
        gate = text["text_precision"].get("gate") or [{}]
        lines.append(f"{'text path (one query of 3-8 words)':<36} {'p50 ms':>8} {'p99 ms':>8} {'x hf':>6}")
        lines += [f"{name:<36} {lat['p50']:>8.2f} {lat['p99']:>8.2f} {text['latency_ms']['hf']['p50'] / lat['p50']:>6.2f}"
                  for name, lat in text["latency_ms"].items()]
        lines += [f"numpy {args.text_precision}: mode {text['text_precision']['mode']}"
                  + (f", gate mean cosine {gate[0]['mean_cosine']}" if gate[0] else "")
                  + f"; {text['queries']} queries after {args.warmup} warm-up, rounds of {TEXT_BLOCK} per path", ""]
    head = (
        f"{'vectors':>10} {'encode p50/p99':>16} {'search p50/p99':>16} {'meta p50/p99':>14} {'e2e p50/p99':>16} {'cached':>8}"
        f" {'build s':>8} {'B/vec':>7} {'RSS MB':>7}"
    )
    lines += [head, "-" * len(head)]

    def pair(lat: dict, stage: str, digits: int = 1) -> str:
        return f"{lat[stage]['p50']:.{digits}f}/{lat[stage]['p99']:.{digits}f}"

    for r in results:
        lat = r["latency_ms"]
        lines.append(
            f"{r['n']:>10,} {pair(lat, 'encode'):>16} {pair(lat, 'search', 2):>16} {pair(lat, 'metadata', 3):>14} "
            f"{pair(lat, 'end_to_end'):>16} {lat['end_to_end_cached']['p50']:>8.2f} "
            f"{r['build_seconds']['total']:>8.1f} {r['bytes_per_vector']['total']:>7.0f} {r['peak_rss_mb']:>7.0f}"
        )
    lines.append(f"latencies in ms over {args.queries} queries after {args.warmup} warm-up, k={args.k}, {args.preset} text tower "
                 f"({args.text_precision}; cached: e2e p50 of repeated queries) on {device}")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
