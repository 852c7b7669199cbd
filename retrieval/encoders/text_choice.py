"""The exact (fp32) text tower's choice of runtime (:func:`choose_text_runtime`): ONNX Runtime's
export where the row of :data:`retrieval.encoders.chooser.CANDIDATES` passes the chooser's one
check against the numpy tower, else numpy, with the record (:class:`TextRuntime`); and the
one-shot rule (:data:`ONE_SHOT_TEXTS`): a process of few text queries keeps ``auto`` in fp32 and
fp32 on numpy, without importing torch or onnxruntime (:func:`one_shot_reason`,
:func:`text_runtime_refusal`).
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelLoadError
from .base import first_line
from .chooser import LOG, TEXT_RUNTIME_ENV, agreement, candidates, requested_runtime
from .precision import PROBE_TEXTS
from .runtime import ORT_INSTALL, RuntimeUnavailable

# Below this many text queries in a process (a one-shot command), ``auto`` keeps the text tower in
# fp32 and fp32 stays on numpy: int8 needs torch imported and the tower quantised first, ONNX
# Runtime its export loaded and checked, which costs more than either saves on so few texts (the
# break-even is measured in benchmarks/README.md).
ONE_SHOT_TEXTS = 256


def _few(text_queries: int) -> str:
    queries = "1 text query" if text_queries == 1 else f"{text_queries} text queries"
    return f"{queries} in this process (fewer than {ONE_SHOT_TEXTS})"


def one_shot_reason(precision: str, text_queries: int | None) -> str | None:
    """Why ``auto`` stays fp32 in a process that will run only ``text_queries`` texts (None: the
    rule does not apply: another precision, a long-lived process, or enough texts)."""
    if precision != "auto" or text_queries is None or text_queries >= ONE_SHOT_TEXTS:
        return None
    return f"{_few(text_queries)}: int8 would first import torch and quantise the tower, which costs more than it saves on so few"


def text_runtime_refusal(text_queries: int | None, check_package: bool = True, requested: str | None = None) -> str | None:
    """Why the exact (fp32) text tower would stay on numpy rather than ONNX Runtime, judged
    without loading anything (None: ONNX Runtime may run it, export and check allowing);
    ``check_package``: also whether onnxruntime is installed (without importing it).

    Raises:
        InvalidArgumentError: an unknown runtime asked for.
    """
    choice = requested_runtime("text", requested)
    if choice == "numpy":
        return f"{TEXT_RUNTIME_ENV}=numpy"
    if choice == "auto" and text_queries is not None and text_queries < ONE_SHOT_TEXTS:
        return f"{_few(text_queries)}: ONNX Runtime would first load and check its export, which costs more than it saves on so few"
    if check_package and importlib.util.find_spec("onnxruntime") is None:
        return f"onnxruntime is not installed; for the faster exact path: {ORT_INSTALL}"
    return None


@dataclass
class TextRuntime:
    """What runs the fp32 text tower and why.

    Attributes:
        name: ``numpy`` or ``onnxruntime``.
        note: why numpy runs it (None when ONNX Runtime does).
        parity: the check's figures when it ran (texts, cosines, seconds per runtime).
        version: onnxruntime's version when it runs the tower.
        tried: whether ONNX Runtime was tried (False: refused before, by the setting, the
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
    embed: Callable[[Any, Sequence[str]], np.ndarray],
    text_queries: int | None,
    requested: str | None = None,
) -> tuple[Any | None, TextRuntime]:
    """The ONNX Runtime tower to run fp32 text queries on (None: keep ``numpy_tower``), and the record.

    Args:
        name: the model's name (for messages).
        directory: the checkpoint directory (exported from when no export is cached).
        fingerprint: ``() -> str``, the weights' fingerprint (the cache key).
        numpy_tower: the loaded numpy tower (its ``cfg``; the reference).
        embed: ``embed(tower, texts) -> normalised vectors``, the encoder's own loop.
        text_queries: how many texts the process will embed, when it knows.
        requested: the runtime asked for, overriding the user's setting.

    Raises:
        RuntimeUnavailable: with ``onnxruntime`` asked for, ONNX Runtime cannot be used (the
            message says why: the package to install, the failed export or check).
    """
    strict = requested_runtime("text", requested) == "onnxruntime"
    refusal = text_runtime_refusal(text_queries, check_package=False, requested=requested)  # a missing package is warned about below
    if refusal is not None:
        if strict:
            raise RuntimeUnavailable(f"{TEXT_RUNTIME_ENV}=onnxruntime: {refusal}")
        return None, TextRuntime(note=refusal)

    def fall_back(why: str, parity: dict[str, float] | None = None) -> tuple[None, TextRuntime]:
        if strict:
            raise RuntimeUnavailable(f"{TEXT_RUNTIME_ENV}=onnxruntime: {why}")
        LOG.warning("exact text tower of %s runs on numpy: %s", name, why)
        return None, TextRuntime(note=why, parity=parity or {}, tried=True)

    try:
        import onnxruntime
    except ImportError as exc:
        return fall_back(f"{first_line(exc)}; for the faster exact path: {ORT_INSTALL}")
    from .runtime.export import cached_text_export
    from .runtime.ort_text import OrtTextTower

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
        vectors = embed(tower, PROBE_TEXTS)
    except Exception as exc:  # noqa: BLE001  (onnxruntime raises its own untyped errors)
        return fall_back(f"ONNX Runtime failed on the probe texts: {first_line(exc)}")
    t2 = time.perf_counter()
    # Each text runs alone at its own length: the first one alone must give its vector again.
    row = candidates("text", "fp32")[0]
    found = agreement("ONNX Runtime", "vectors", "numpy", reference, vectors, row.min_cosine,
                      lambda: float(np.abs(embed(tower, PROBE_TEXTS[:1]) - vectors[:1]).max()))
    parity = {"texts": len(PROBE_TEXTS), **found.figures, "numpy_seconds": round(t1 - t0, 3), "onnxruntime_seconds": round(t2 - t1, 3)}
    if found.failure is not None:
        return fall_back(found.failure, parity)
    return tower, TextRuntime("onnxruntime", None, parity, onnxruntime.__version__, tried=True)


__all__ = ["ONE_SHOT_TEXTS", "TextRuntime", "choose_text_runtime", "one_shot_reason", "text_runtime_refusal"]
