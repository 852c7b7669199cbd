"""The keyword side at scale: query latency per mode, build cost and bytes per image.

A real clipsearch index of ``--images`` rows is written through the indexer's own
``GenerationWriter`` (synthetic clustered ``--dim``-d vectors, as ``bench_query.py`` makes them;
file names like ``2019/album_harbour/IMG_01234.jpg``; on ``--ocr-share`` of the images
OCR-like text: 1-12 words of a 20,000-word vocabulary, some upper-case, a third glued together
without spaces as PP-OCR returns them), so its keyword side is the one ``clipsearch index``
publishes. Then, with the same query vectors (the text tower is the same for every mode and is
left out), ``ImageIndex.search_embedded(text, vector, 10, mode=...)`` is timed for ``vector``,
``keyword`` and ``hybrid`` on queries whose word is in the collection (``hit``) and on queries
whose words match nothing (``miss``: hybrid must then cost what vector costs).

Also measured: the keyword file's bytes per image, the time one generation's keyword side takes
to build from the rows (``rebuild_s``), to extend by 1% new rows (``extend_s``), and what
``vector`` p50 costs beside ``hybrid`` p50 (``hybrid_minus_vector_ms``: the goal is <= 3 ms).

Prints one JSON line (machine facts and the rows), then a readable table.

    python benchmarks/bench_keywords.py [--images 100000] [--queries 200]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from _common import ROOT, latency_summary  # noqa: E402
from _harness import Bench  # noqa: E402

sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

MODES = ("vector", "keyword", "hybrid")


def _vocabulary(rng: np.random.Generator, n: int) -> list[str]:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return ["".join(rng.choice(letters, int(rng.integers(4, 10)))) for _ in range(n)]


def _ocr_text(rng: np.random.Generator, vocab: list[str], used: set[str]) -> str:
    words = [vocab[int(i)] for i in rng.integers(0, len(vocab), int(rng.integers(1, 13)))]
    used.update(words)
    words = [w.upper() if rng.random() < 0.3 else w for w in words]
    # PP-OCR drops the spaces between words on a third of the lines.
    return ("" if rng.random() < 0.33 else " ").join(words)


def write_index(out: Path, images: int, dim: int, ocr_share: float, seed: int) -> tuple[list[str], np.ndarray]:
    """An index of ``images`` rows with file names and OCR-like text; returns the words its
    texts use and the cluster centres its vectors were drawn around."""
    from indexer.commit import GenerationWriter, IndexMeta
    from indexer.sides.registry import side_writers
    from indexer.writer import FileRecord
    from retrieval.images import PhotoMeta

    rng = np.random.default_rng(seed)
    vocab = _vocabulary(rng, 20_000)
    centres = rng.standard_normal((256, dim)).astype(np.float32)
    meta = IndexMeta(model="synthetic", model_fingerprint="sha256:" + "0" * 64, backend="hf", dim=dim, preprocess={},
                     source_root=str(out.parent), index_options={"index_type": "flat"})
    writer = GenerationWriter(out, meta, None, side_writers)
    used: set[str] = set()
    out.mkdir(parents=True, exist_ok=True)
    batch = 20_000
    for start in range(0, images, batch):
        n = min(batch, images - start)
        vecs = centres[rng.integers(0, len(centres), n)] + 0.6 * rng.standard_normal((n, dim)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        records = []
        for i in range(start, start + n):
            album = vocab[int(rng.integers(0, 2000))]
            text = _ocr_text(rng, vocab, used) if rng.random() < ocr_share else None
            rel = f"{2000 + i % 27}/album_{album}/IMG_{i:06d}.jpg".encode()
            records.append(FileRecord(rel, 640, 480, 1000, 1, f"{i:032x}", PhotoMeta(ocr_text=text)))
        writer.append(records, vecs)
    writer.finish()
    return sorted(used), centres


def measure(out: Path, vocab: list[str], centres: np.ndarray, queries: int, seed: int) -> dict[str, Any]:
    from retrieval import ImageIndex

    idx = ImageIndex.open(out)
    rng = np.random.default_rng(seed + 1)
    vecs = centres[rng.integers(0, len(centres), queries)] + 0.6 * rng.standard_normal((queries, centres.shape[1])).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    texts = {
        "hit": [f"the sign {vocab[int(i)]}" for i in rng.integers(0, len(vocab), queries)],
        # Nine random letters: in no file name and (almost surely) in no OCR text.
        "miss": ["".join(rng.choice(list("bcdfghjklmnpqrstvwxz"), 9)) for _ in range(queries)],
    }
    rows = []
    for kind, qs in texts.items():
        for q, v in zip(qs[:10], vecs[:10], strict=True):  # warm-up
            for mode in MODES:
                idx.search_embedded([q], v[None], 10, mode=mode)
        # The modes take turns on each query, so that a loaded machine slows them alike.
        seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
        for j, (q, v) in enumerate(zip(qs, vecs, strict=True)):
            for mode in MODES[j % 3:] + MODES[: j % 3]:
                t0 = time.perf_counter()
                idx.search_embedded([q], v[None], 10, mode=mode)
                seconds[mode].append(time.perf_counter() - t0)
        found = sum(bool(idx.search_embedded([q], v[None], 10, mode="keyword")[0]) for q, v in zip(qs[:50], vecs[:50], strict=True))
        for mode in MODES:
            rows.append({"queries": kind, "mode": mode, **{f"{k}_ms": v for k, v in latency_summary(seconds[mode]).items()},
                         "keyword_found_share": round(found / min(50, len(qs)), 2)})
    return {"rows": rows, "index_type": idx.manifest.index_type, "keywords": idx.info()["keywords"]}


def build_costs(out: Path) -> dict[str, float]:
    """Seconds to build the keyword side of the whole index from its rows, and to extend it by 1%."""
    from indexer.keywords import PreviousKeywords, write_side
    from retrieval.layout import read_manifest

    m = read_manifest(out)
    assert m.keywords is not None
    parts = [out / p.path for p in m.parts]
    scratch = Path(tempfile.mkdtemp(dir=out))
    try:
        t0 = time.perf_counter()
        write_side(scratch, "x", m.count, parts, None, False)
        rebuild = time.perf_counter() - t0
        (scratch / "keywords.sqlite").unlink()
        # The last 1% of rows as "new": the previous file holds the rest.
        keep = m.count - max(1, m.count // 100)
        first = scratch / "first"
        first.mkdir()
        import pyarrow.parquet as pq

        table = pq.read_table(parts[-1]) if len(parts) == 1 else None
        if table is None:
            return {"rebuild_s": round(rebuild, 2)}
        head = table.slice(0, keep - (m.count - table.num_rows))
        tail = table.slice(head.num_rows)
        ref = write_side(first, "first", keep, [*parts[:-1], head], None, False)
        t0 = time.perf_counter()
        write_side(scratch, "x", m.count, [*parts[:-1], head, tail], PreviousKeywords(ref, first / "keywords.sqlite", keep), False)
        extend = time.perf_counter() - t0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"rebuild_s": round(rebuild, 2), "extend_1pct_s": round(extend, 2)}


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_keywords", __doc__, "seed", "work_dir")
    p = bench.parser
    p.add_argument("--images", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--ocr-share", type=float, default=0.3, help="share of images with OCR-like text (default 0.3)")
    p.add_argument("--queries", type=int, default=200)
    args = bench.parse(argv)
    with bench.scratch() as work:
        out = work / "kw.idx"
        t0 = time.perf_counter()
        vocab, centres = write_index(out, args.images, args.dim, args.ocr_share, args.seed)
        written = time.perf_counter() - t0
        result = measure(out, vocab, centres, args.queries, args.seed)
        costs = build_costs(out)
    p50 = {(r["queries"], r["mode"]): r["p50_ms"] for r in result["rows"]}
    summary = {
        "images": args.images, "dim": args.dim, "ocr_share": args.ocr_share, "index_type": result["index_type"],
        "keyword_bytes_per_image": round(result["keywords"]["bytes"] / args.images, 1),
        "with_text": result["keywords"]["with_text"], "write_index_s": round(written, 1), **costs,
        "hybrid_minus_vector_ms": {k: round(p50[(k, "hybrid")] - p50[(k, "vector")], 3) for k in ("hit", "miss")},
    }
    table = [f"{args.images} images, {args.dim}-d {result['index_type']}, OCR-like text on {args.ocr_share:.0%}; "
             f"keyword side {summary['keyword_bytes_per_image']} bytes/image, rebuild {costs.get('rebuild_s')} s, "
             f"extend by 1% {costs.get('extend_1pct_s')} s",
             f"{'queries':<7} {'mode':<8} {'p50 ms':>8} {'p99 ms':>8}"]
    table += [f"{r['queries']:<7} {r['mode']:<8} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f}" for r in result["rows"]]
    gap = summary["hybrid_minus_vector_ms"]
    table.append(f"hybrid - vector p50: hit {gap['hit']} ms, miss {gap['miss']} ms")
    bench.report({"bench": "keywords", "summary": summary, "rows": result["rows"]}, table)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
