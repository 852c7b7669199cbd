"""Near-duplicate search at scale: time, memory and recall of planted duplicate pairs.

For each size, a real clipsearch index of synthetic clustered 512-d vectors (``bench_query.py``'s
generator, written through the indexer's own write path) in which a fraction of the rows are
planted near-copies of other rows: ``copy = normalise(original + noise)``, the noise's norm drawn
uniformly in [0.05, 0.30], so the pairs' cosines spread from ~0.999 down to ~0.958, all above
the default threshold 0.95 (clustered background pairs sit near cosine 0.6). Every index type is
then built with ``reindex`` and ``retrieval.duplicates.find_duplicates`` runs in a fresh
process (its peak RSS is its own):

* seconds and peak RSS of the duplicate search;
* recall of the planted pairs (both images in one group) and images grouped that were not
  planted (false groups).

Flat search is exact and O(n^2): it is skipped above --flat-max.

    python benchmarks/bench_duplicates.py [--sizes 100000,1000000] [--types flat,ivf-sq8]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from _common import ROOT, peak_rss_mb  # noqa: E402
from _harness import Bench, note  # noqa: E402
from bench_query import CHUNK_ROWS, SyntheticSpec, build_synthetic_index, synthetic_chunks  # noqa: E402
from bench_search import reindex_subprocess  # noqa: E402

_FIND = """
import json, sys, time
import numpy as np
from retrieval.duplicates import find_duplicates
from retrieval.index import ImageIndex
status = lambda key: [int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith(key)][0]
base = status("VmRSS:")
t0 = time.perf_counter()
index = ImageIndex.open(sys.argv[1])
report = find_duplicates(index, float(sys.argv[2]))
seconds = time.perf_counter() - t0
planted = np.load(sys.argv[3])
group_of = {}
for g, group in enumerate(report.groups):
    for image in (group.keep, *group.duplicates):
        group_of[image.id] = g
found = sum(1 for a, b in planted.tolist() if a in group_of and group_of.get(a) == group_of.get(b))
members = set(planted.reshape(-1).tolist())
print(json.dumps({"seconds": round(seconds, 2), "peak_rss_mb": round(status("VmHWM:"), 1), "base_rss_mb": round(base, 1),
                  "groups": len(report.groups), "images_in_groups": report.images_in_groups, "pairs": report.pairs,
                  "exact": report.exact, "planted_pairs": len(planted), "planted_found": found,
                  "recall": round(found / max(1, len(planted)), 4),
                  "unplanted_in_groups": sum(1 for i in group_of if i not in members)}))
"""


def planted_chunks(n: int, dim: int, spec: SyntheticSpec, fraction: float, pairs_out: list[tuple[int, int]]) -> Any:
    """:func:`synthetic_chunks` with, in each chunk, ``fraction`` of the rows replaced by a
    near-copy of another row of the chunk; the ``(original, copy)`` ids go to ``pairs_out``."""
    import numpy as np

    rng = np.random.default_rng(spec.seed + 77)
    first = 0
    for chunk in synthetic_chunks(n, dim, spec, rows_per_chunk=CHUNK_ROWS):
        m = int(len(chunk) * fraction)
        if m:
            rows = rng.permutation(len(chunk))[: 2 * m]
            originals, copies = rows[:m], rows[m:]
            noise = rng.standard_normal((m, dim)).astype(np.float32)
            noise *= (rng.uniform(0.05, 0.30, size=m) / np.linalg.norm(noise, axis=1)).astype(np.float32)[:, None]
            copy = chunk[originals] + noise
            chunk[copies] = copy / np.linalg.norm(copy, axis=1, keepdims=True)
            pairs_out.extend(zip((first + originals).tolist(), (first + copies).tolist(), strict=True))
        first += len(chunk)
        yield chunk


def find_subprocess(index_dir: Path, threshold: float, planted: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _FIND, str(index_dir), str(threshold), str(planted)],
                         capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"duplicate search failed on {index_dir}: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_duplicates", __doc__, "seed", "work_dir")
    parser = bench.parser
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--types", default="flat,ivf-sq8", help="index types to search with (reindex --index-type)")
    parser.add_argument("--flat-max", type=int, default=200_000, help="skip flat above this size (exact search is O(n^2))")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--fraction", type=float, default=0.01, help="fraction of rows that are planted copies")
    parser.add_argument("--threshold", type=float, default=0.95)
    parser.add_argument("--max-memory", default="4GB")
    parser.add_argument("--target-recall", type=float, default=0.95)
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--noise", type=float, default=0.8)
    args = bench.parse(argv)
    import numpy as np

    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    spec = SyntheticSpec(clusters=args.clusters, noise=args.noise, seed=args.seed)

    results = []
    with bench.scratch() as work:
        encoder = _VectorsOnly(args.dim)
        for n in sizes:
            out = work / f"dup-{n}.idx"
            pairs: list[tuple[int, int]] = []
            t0 = time.perf_counter()
            placeholder = "flat" if n <= args.flat_max else "IVF256,PQ8"
            build_synthetic_index(out, encoder, n, spec, max(n, 1), index_type=placeholder,
                                  chunks=planted_chunks(n, args.dim, spec, args.fraction, pairs))
            write_s = time.perf_counter() - t0
            planted = work / f"planted-{n}.npy"
            np.save(planted, np.asarray(pairs, dtype=np.int64).reshape(-1, 2))
            rows = []
            for index_type in types:
                if index_type == "flat" and n > args.flat_max:
                    continue
                built = reindex_subprocess(out, index_type, args.max_memory, args.target_recall)
                found = find_subprocess(out, args.threshold, planted)
                rows.append({"type": index_type, "factory": built["index_type"], "search_params": built["search_params"],
                             "reindex_seconds": built["seconds"], **found})
                note(f"{n:,} {index_type}: {json.dumps(rows[-1])}")
            results.append({"n": n, "write_seconds": round(write_s, 1), "types": rows})
            shutil.rmtree(out, ignore_errors=True)

    head = (f"{'vectors':>10} {'type':<8} {'factory':<22} {'params':<12} {'find s':>8} {'peak MB':>8} {'groups':>7} "
            f"{'planted recall':>14} {'false':>6}")
    table = [head, "-" * len(head)]
    for r in results:
        for t in r["types"]:
            params = ",".join(f"{k}={v}" for k, v in t["search_params"].items()) or "-"
            table.append(f"{r['n']:>10,} {t['type']:<8} {t['factory']:<22} {params:<12} {t['seconds']:>8.1f} {t['peak_rss_mb']:>8.0f} "
                         f"{t['groups']:>7} {t['recall']:>14.4f} {t['unplanted_in_groups']:>6}")
    table.append(f"threshold {args.threshold}; {args.fraction:.0%} of rows planted as copies")
    bench.report({
        "bench": "duplicates",
        "dim": args.dim,
        "threshold": args.threshold,
        "planted_fraction": args.fraction,
        "synthetic": {"clusters": spec.clusters, "noise": spec.noise, "seed": spec.seed},
        "sizes": results,
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }, table)
    return 0

class _VectorsOnly:
    """The model facts an index records, for vectors that no model made (the search never encodes)."""

    name = "synthetic"
    backend = "hf"
    fingerprint = "sha256:" + "0" * 64

    def __init__(self, dim: int) -> None:
        from retrieval.images import PreprocessConfig

        self.dim = dim
        self.preprocess = PreprocessConfig()


if __name__ == "__main__":
    raise SystemExit(main())
