"""Which runtime runs the exact (fp32) text tower: the numpy tower, or ONNX Runtime.

The same fp32 ``CLIPTextModelWithProjection``, two runtimes. For a ViT-B/32 text tower the
numpy tower spends most of a query streaming its float32 weights through OpenBLAS's packing
sgemm; ONNX Runtime's MLAS reads them about twice as fast, and a query takes about half the
time (``benchmarks/README.md``). So in a **long-lived** process (``text_queries``
unknown or at least :data:`~retrieval.encoders.numpy_text.path.ONE_SHOT_TEXTS`: the rule that
lets int8 be chosen) the fp32 tower runs on ONNX Runtime where:

- ``CLIPSEARCH_TEXT_RUNTIME`` (:data:`~retrieval.encoders.runtime.TEXT_RUNTIME_ENV`) is not ``numpy``;
- onnxruntime imports;
- the tower's export is in the cache (:func:`~.export.cached_text_export`, keyed by the
  weights' fingerprint), or can be made (torch and transformers installed);
- its vectors of :data:`~retrieval.encoders.precision.PROBE_TEXTS` match the numpy tower's,
  cosine >= :data:`~retrieval.encoders.runtime.PARITY_MIN_COSINE` each.

Otherwise the numpy tower runs it, and the reason is kept (a one-line warning where a package is
missing or the export or the check failed). A one-shot command (``clipsearch search``) stays on
numpy and imports neither onnxruntime nor torch: loading a session and checking it costs more
than it saves on a few queries. ``CLIPSEARCH_TEXT_RUNTIME=onnxruntime`` asks for ONNX Runtime even
there, and makes any failure an error (:class:`~retrieval.encoders.runtime.RuntimeUnavailable`).

Vectors stay independent of the batch: each text is one run of one row at its own length
(:class:`~.ort_text.OrtTextTower`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ModelLoadError
from ..base import first_line
from ..numpy_text.path import runtime_refusal
from ..precision import PROBE_TEXTS
from . import ORT_INSTALL, PARITY_MIN_COSINE, TEXT_RUNTIME_ENV, RuntimeUnavailable, text_runtime_choice

LOG = logging.getLogger(__package__)

Embed = Callable[[Any, Sequence[str]], np.ndarray]


@dataclass
class TextRuntime:
    """What runs the fp32 text tower and why.

    Attributes:
        name: ``numpy`` or ``onnxruntime``.
        note: why numpy runs it (None when ONNX Runtime does).
        parity: the check's figures when it ran (texts, cosines, seconds per runtime).
        version: onnxruntime's version when it runs the tower.
        tried: whether ONNX Runtime was tried (False: refused before, by the environment, the
            one-shot rule or the package not being installed).
    """

    name: str = "numpy"
    note: str | None = None
    parity: dict[str, float] = field(default_factory=dict)
    version: str | None = None
    tried: bool = False

    def record(self) -> dict[str, Any]:
        """JSON-able: ``runtime`` and, where there are, ``runtime_note``, ``runtime_parity``,
        ``runtime_version``; empty where ONNX Runtime was not tried (the text path says why)."""
        if not self.tried:
            return {}
        data: dict[str, Any] = {"runtime": self.name}
        if self.note:
            data["runtime_note"] = self.note
        if self.parity:
            data["runtime_parity"] = dict(self.parity)
        if self.version:
            data["runtime_version"] = self.version
        return data


def choose_text_runtime(
    name: str,
    directory: Path,
    fingerprint: Callable[[], str],
    numpy_tower: Any,
    embed: Embed,
    text_queries: int | None,
) -> tuple[Any | None, TextRuntime]:
    """The ONNX Runtime tower to run fp32 text queries on (None: keep ``numpy_tower``), and the record.

    Args:
        name: the model's name (for messages).
        directory: the checkpoint directory (exported from when no export is cached).
        fingerprint: ``() -> str``, the weights' fingerprint (the cache key).
        numpy_tower: the loaded numpy tower (its ``cfg``; the parity reference).
        embed: ``embed(tower, texts) -> normalised vectors``, the encoder's own loop.
        text_queries: how many texts the process will embed, when it knows.

    Raises:
        RuntimeUnavailable: with ``CLIPSEARCH_TEXT_RUNTIME=onnxruntime``, ONNX Runtime cannot be
            used (the message says why: the package to install, the failed export or check).
    """
    strict = text_runtime_choice() == "onnxruntime"
    refusal = runtime_refusal(text_queries, check_package=False)  # a missing package is warned about below
    if refusal is not None:
        if strict:
            raise RuntimeUnavailable(f"{TEXT_RUNTIME_ENV}=onnxruntime: {refusal}")
        return None, TextRuntime(note=refusal)

    def fall_back(why: str) -> tuple[None, TextRuntime]:
        if strict:
            raise RuntimeUnavailable(f"{TEXT_RUNTIME_ENV}=onnxruntime: {why}")
        LOG.warning("exact text tower of %s runs on numpy: %s", name, why)
        return None, TextRuntime(note=why, tried=True)

    try:
        import onnxruntime
    except ImportError as exc:
        return fall_back(f"{first_line(exc)}; for the faster exact path: {ORT_INSTALL}")
    from .export import cached_text_export
    from .ort_text import OrtTextTower

    cfg = numpy_tower.cfg
    try:
        path = cached_text_export(directory, fingerprint(), cfg.max_positions, name, cfg.eos_token_id)
    except ModelLoadError as exc:
        return fall_back(str(exc))
    try:
        tower = OrtTextTower(path, cfg)
    except ModelLoadError as exc:
        # A damaged cache entry: removed, so that the next load exports it again.
        path.unlink(missing_ok=True)
        return fall_back(f"{exc} (removed; the next load exports it again)")
    t0 = time.perf_counter()
    reference = embed(numpy_tower, PROBE_TEXTS)
    t1 = time.perf_counter()
    try:
        candidate = embed(tower, PROBE_TEXTS)
    except Exception as exc:  # noqa: BLE001  (onnxruntime raises its own untyped errors)
        return fall_back(f"ONNX Runtime failed on the probe texts: {first_line(exc)}")
    t2 = time.perf_counter()
    cos = np.sum(reference.astype(np.float64) * candidate.astype(np.float64), axis=1)
    parity = {
        "texts": len(PROBE_TEXTS), "mean_cosine": round(float(cos.mean()), 7), "min_cosine": round(float(cos.min()), 7),
        "numpy_seconds": round(t1 - t0, 3), "onnxruntime_seconds": round(t2 - t1, 3),
    }
    if not float(cos.min()) >= PARITY_MIN_COSINE:  # also catches NaN
        _, record = fall_back(
            f"ONNX Runtime's vectors differ from numpy's (min cosine {cos.min():.7f} < {PARITY_MIN_COSINE})"
        )
        record.parity = parity
        return None, record
    return tower, TextRuntime("onnxruntime", None, parity, onnxruntime.__version__, tried=True)


__all__ = ["TextRuntime", "choose_text_runtime"]
