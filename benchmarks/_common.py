"""Helpers shared by the benchmark scripts: machine facts, peak memory, percentiles.

Benchmarks are scripts (``python benchmarks/NAME.py``), so this module is imported as
``_common`` from the scripts' own directory; it imports torch/faiss only when called.
"""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_READ_BLOCK = 8 << 20


def machine_facts() -> dict[str, object]:
    """CPU model, core count and library versions, for the record next to every figure."""
    import faiss
    import torch
    import transformers

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from retrieval.encoders import cpu as cpu_caps

    return {
        "cpu": cpu,
        # What clipsearch acts on (detected, capped by CLIPSEARCH_CPU_CAP / ONEDNN_MAX_CPU_ISA):
        # a figure from a capped run says so.
        "cpu_level": cpu_caps.describe(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "transformers": transformers.__version__,
        "faiss": faiss.__version__,
        "faiss_threads": faiss.omp_get_max_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        # torch and faiss-cpu each bring their own OpenMP runtime; how idle threads wait
        # changes small-query latency a lot on few cores, so the setting is part of the record.
        "omp_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ},
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (ru_maxrss is KiB on Linux)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # macOS reports bytes, Linux kibibytes.
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50 / p99 / mean / max of a list of durations, in milliseconds (3 decimals)."""
    import numpy as np

    ms = np.asarray(seconds, dtype=np.float64) * 1000.0
    if ms.size == 0:
        return {"p50": float("nan"), "p99": float("nan"), "mean": float("nan"), "max": float("nan")}
    return {
        "p50": round(float(np.percentile(ms, 50)), 3),
        "p99": round(float(np.percentile(ms, 99)), 3),
        "mean": round(float(ms.mean()), 3),
        "max": round(float(ms.max()), 3),
    }


def read_through(path: Path, length: int) -> float:
    """Read the first ``length`` bytes of ``path`` (into the page cache); seconds taken."""
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        left = length
        while left > 0:
            got = f.read(min(_READ_BLOCK, left))
            if not got:
                break
            left -= len(got)
    return time.perf_counter() - t0


class StackSampler:
    """Where a process's Python threads spend their time: every ``interval`` seconds a daemon
    thread records each other thread's stack (``sys._current_frames``), as a poor man's py-spy
    that needs no ptrace. Time inside C (a kernel launch, nvJPEG, a lock) counts against the
    Python line that called it, which is what tells a feeding-bound process where it waits.

    Use as a context manager; :meth:`write` saves collapsed stacks (``thread;outer;...;inner
    count``, the input of flame-graph tools), most frequent first.
    """

    def __init__(self, interval: float = 0.01, depth: int = 32) -> None:
        import collections
        import threading

        if interval <= 0 or depth < 1:
            raise ValueError("interval must be > 0 and depth >= 1")
        self.interval = interval
        self.depth = depth
        self.samples = 0
        self.counts: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)

    def __enter__(self) -> StackSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import threading

        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                stack: list[str] = []
                f = frame
                while f is not None and len(stack) < self.depth:
                    stack.append(f"{Path(f.f_code.co_filename).name}:{f.f_code.co_name}:{f.f_lineno}")
                    f = f.f_back
                self.counts[";".join([names.get(ident, str(ident)), *reversed(stack)])] += 1
            self.samples += 1

    def write(self, path: Path) -> Path:
        """Collapsed stacks to ``path`` (parents made), most frequent first; returns ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"{stack} {count}" for stack, count in self.counts.most_common()]
        path.write_text("\n".join(lines) + ("\n" if lines else ""))
        return path


@contextlib.contextmanager
def scheduling_kept() -> Iterator[None]:
    """Put back this thread's scheduling policy after encoding: SVT-AV1 run as root leaves the
    calling thread SCHED_FIFO at priority 99, which every later child process would inherit."""
    if not hasattr(os, "sched_getscheduler"):
        yield
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        yield
    finally:
        if (os.sched_getscheduler(0), os.sched_getparam(0)) != (policy, param):
            os.sched_setscheduler(0, policy, param)
