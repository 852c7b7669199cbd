"""Ray's write rows/s, driver-written against actor-written (``bench_shards.py --ray-write-rows``).

Writing alone is measured: the actors embed nothing. :class:`VectorActor` is the build's own
:class:`~indexer.ray_actor.EmbedActor` with its model call replaced by a lookup of precomputed
512-d unit vectors (by file number, so every path gives the same index), and its file reads by
made-up facts; everything after that is the build's: the actor's answer (its rows, or its own
Parquet part in the index's staging folder), ``RayRun`` on the driver, ``write_batches``, chunk
commits every ``commit_every`` rows. ``stream rows/s`` is rows over that phase; ``driver CPU
us/row`` is the driver process's CPU time per row over it, which sets the ceiling at many GPUs
(one driver core: 1e6 / us-per-row rows/s whatever the actors do); ``finish s`` is the final
commit (a flat FAISS file, and the merge of the chunk parts, which the driver rewrites).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from indexer.dataset import Item
from indexer.embed import EmbeddedBatch
from indexer.ray_actor import ActorSpec, EmbedActor
from indexer.ray_parts import part_rows

DIM = 512
# Distinct vectors the actors cycle through (file i gets row i % POOL).
POOL = 4096


def _unit_vectors() -> np.ndarray:
    rng = np.random.default_rng(0)
    m = rng.standard_normal((POOL, DIM)).astype(np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


class VectorActor(EmbedActor):
    """An :class:`EmbedActor` whose model call is a lookup of precomputed vectors."""

    def __init__(self, spec: ActorSpec) -> None:  # no model, no decoding
        self.spec = spec
        self.enc = SimpleNamespace(dim=DIM)  # type: ignore[assignment]  # only .dim is read
        self.writes = spec.stage is not None and spec.stage.reachable()
        self._vectors = _unit_vectors()

    def _embed(self, files: list[Any]) -> EmbeddedBatch:
        numbers = [int(f.rel[3:11]) for f in files]  # b"img%08d.jpg"
        items = [Item(j, None, 640, 480, None, 0.0, 100_000 + i, i, f"{i:032x}") for j, i in enumerate(numbers)]
        return EmbeddedBatch(items, self._vectors[np.asarray(numbers) % POOL], 0.0, 0.0)


def measure(rows: int, actors: int, mode: str, base: Path, batch_size: int, commit_every: int) -> dict[str, Any]:
    """One write-only Ray run of ``rows`` rows into a fresh index under ``base`` (``batch_size``:
    the model batch, which is the Ray batch where the driver writes)."""
    from indexer import ray_engine
    from indexer.build_config import BuildConfig
    from indexer.commit import GenerationWriter, IndexMeta
    from indexer.discover import ImageFile
    from indexer.lock import IndexLock
    from indexer.plan import UpdatePlan
    from indexer.sides.registry import side_writers
    from retrieval import ImageIndex

    out = base / f"{mode}-{actors}-{batch_size}.idx"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cfg = BuildConfig(engine="ray", actors=actors, cpus_per_actor=1, batch_size=batch_size, commit_every=commit_every,
                      ray_write=mode)
    meta = IndexMeta("bench", "sha256:" + "0" * 64, "hf", DIM, {}, str(base), index_options={"index_type": "Flat"})
    plan = UpdatePlan(np.empty(0, np.int64), to_embed=[ImageFile(b"img%08d.jpg" % i, 100_000 + i, i) for i in range(rows)])
    spec = ActorSpec(model="bench", device="cpu", precision="fp32", image_size=None, int8_activation_bits=None,
                     root=os.fsencode(base), max_pixels=1, draft=True, threads=1)
    saved = ray_engine.EmbedActor
    ray_engine.EmbedActor = VectorActor  # type: ignore[misc]  # the write path, without a model
    try:
        with ray_engine.ray_run(cfg) as run, IndexLock(out):
            writer = GenerationWriter(out, meta, None, side_writers)
            t0, c0 = time.perf_counter(), time.process_time()
            stats = run.embed_spec(spec, plan, writer)
            stream, cpu = time.perf_counter() - t0, time.process_time() - c0
            parts = len(writer.parts) + (1 if writer.tail_pending else 0)
            t1 = time.perf_counter()
            writer.finish()
            finish = time.perf_counter() - t1
    finally:
        ray_engine.EmbedActor = saved  # type: ignore[misc]
    index = ImageIndex.open(out)
    digest = hashlib.sha256(index.embeddings().tobytes() + "\n".join(index.paths()).encode()).hexdigest()
    return {
        "mode": mode, "actors": actors, "rows": rows, "written_by": stats.written_by, "commits": writer.commits,
        "ray_batch": batch_size if mode == "driver" else part_rows(batch_size, rows, actors, commit_every),
        "parts_before_finish": parts, "stream_seconds": round(stream, 3), "stream_rows_per_s": round(rows / stream),
        "driver_cpu_us_per_row": round(cpu / rows * 1e6, 2), "finish_seconds": round(finish, 3),
        "format_version": index.manifest.format_version, "_digest": digest,
    }


def run_all(rows: int, rounds: int, batch_size: int, commit_every: int, base: Path,
            actor_counts: tuple[int, ...] = (1, 2)) -> list[dict[str, Any]]:
    """Per actor count (``actor_counts``): the driver writing (Ray batches of ``batch_size``, as a build sends them,
    and of an actor's part, which isolates the writing) and the actors writing; best of
    ``rounds`` by stream time. Checks that every run made the same index."""
    import logging

    import ray

    # Local workers inherit this environment: they import this module (VectorActor) from here.
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join([here, *sys.path[1:3], os.environ.get("PYTHONPATH", "")])
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    results: list[dict[str, Any]] = []
    try:
        for actors in actor_counts:
            for mode, size in (("driver", batch_size), ("driver", part_rows(batch_size, rows, actors, commit_every)),
                               ("actors", batch_size)):
                best = min((measure(rows, actors, mode, base, size, commit_every) for _ in range(rounds)),
                           key=lambda r: r["stream_seconds"])
                results.append(best)
    finally:
        ray.shutdown()
    digests = {r.pop("_digest") for r in results}
    if len(digests) != 1:
        raise AssertionError("the driver-written and actor-written indexes differ")
    for r in results:
        # Against the driver writing with the same Ray batches: what writing in the actors changes.
        same = [d for d in results if d["actors"] == r["actors"] and d["mode"] == "driver" and d["ray_batch"] == r["ray_batch"]]
        r["vs_driver_same_batches"] = round(r["stream_rows_per_s"] / same[-1]["stream_rows_per_s"], 2)
        r["driver_cpu_vs_driver_same_batches"] = round(r["driver_cpu_us_per_row"] / same[-1]["driver_cpu_us_per_row"], 3)
    return results


def table(results: list[dict[str, Any]], rows: int) -> list[str]:
    """The readable table of :func:`run_all`'s rows (for ``Bench.report``)."""
    lines = [f"Ray write path, {rows} rows of {DIM}-d float32 (precomputed: nothing embedded), best of rounds by stream time",
             "(vs driver: against the driver writing with the same Ray batches)",
             f"{'actors':>6} {'written by':<10} {'ray batch':>9} {'stream rows/s':>13} {'vs driver':>9} {'driver CPU us/row':>17} "
             f"{'finish s':>8} {'commits':>7} {'parts':>5} {'format':>6}"]
    for r in results:
        lines.append(f"{r['actors']:>6} {r['written_by']:<10} {r['ray_batch']:>9} {r['stream_rows_per_s']:>13,} "
                     f"{r['vs_driver_same_batches']:>8.2f}x "
                     f"{r['driver_cpu_us_per_row']:>17.2f} {r['finish_seconds']:>8.2f} {r['commits']:>7} {r['parts_before_finish']:>5} "
                     f"{r['format_version']:>6}")
    return lines

__all__ = ["VectorActor", "measure", "run_all", "table"]
