"""Which text tower a query runs on, decided in one place: the backend's torch tower, or the
numpy tower (:mod:`.numpy_text`) with its fp32 forward pass on numpy or ONNX Runtime.

Each decision is one function that the prediction (:func:`text_path`, no weights read) and
the loading (``QueryEncoders``, ``NumpyTextEncoder.load``) both call: :func:`fast_path_refusal`
and :func:`checked_checkpoint` (torch or numpy), :func:`one_shot_reason`
(``auto`` kept fp32 in a process of few texts, :data:`ONE_SHOT_TEXTS`),
:func:`text_runtime_refusal` and :func:`choose_text_runtime` (ONNX Runtime or numpy, through
the chooser's one check). The numpy tower's modules import this one, so it imports them
inside functions.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ModelLoadError
from . import cpu
from .base import TextPath, first_line
from .chooser import LOG, TEXT_RUNTIME_ENV, agreement, auto_modes, candidates, requested_runtime, runtime_record
from .precision import PROBE_TEXTS
from .runtime import ORT_INSTALL, RuntimeUnavailable

if TYPE_CHECKING:
    from .numpy_text.tower_config import TextTowerConfig
    from .numpy_text.weights import SafetensorsReader

# Text precisions the numpy tower computes; the others (bf16, fp16) run in torch.
TEXT_PRECISIONS: tuple[str, ...] = ("fp32", "int8", "auto")

# Below this many text queries in a process (a one-shot command), ``auto`` keeps the text tower in
# fp32 and fp32 stays on numpy: int8 needs torch imported and the tower quantised first, ONNX
# Runtime its export loaded and checked, which costs more than either saves on so few texts (the
# break-even is measured in benchmarks/README.md).
ONE_SHOT_TEXTS = 256


def _few(text_queries: int | None) -> str | None:
    """How few texts the process runs, where the one-shot rule applies (None: a long-lived process, or enough texts)."""
    if text_queries is None or text_queries >= ONE_SHOT_TEXTS:
        return None
    queries = "1 text query" if text_queries == 1 else f"{text_queries} text queries"
    return f"{queries} in this process (fewer than {ONE_SHOT_TEXTS})"


def one_shot_reason(precision: str, text_queries: int | None) -> str | None:
    """Why ``auto`` stays fp32 in a process that will run only ``text_queries`` texts (None: the rule does not apply)."""
    few = _few(text_queries)
    if precision != "auto" or few is None:
        return None
    return f"{few}: int8 would first import torch and quantise the tower, which costs more than it saves on so few"


def text_runtime_refusal(text_queries: int | None, check_package: bool = True, requested: str | None = None) -> str | None:
    """Why the exact (fp32) text tower would stay on numpy rather than ONNX Runtime, judged
    without loading anything (None: ONNX Runtime may run it, export and check allowing);
    ``check_package``: also whether onnxruntime is installed (without importing it).

    Raises:
        InvalidArgumentError: an unknown runtime asked for.
    """
    choice, few = requested_runtime("text", requested), _few(text_queries)
    if choice == "numpy":
        return f"{TEXT_RUNTIME_ENV}=numpy"
    if choice == "auto" and few is not None:
        return f"{few}: ONNX Runtime would first load and check its export, which costs more than it saves on so few"
    if check_package and importlib.util.find_spec("onnxruntime") is None:
        return f"onnxruntime is not installed; for the faster exact path: {ORT_INSTALL}"
    return None


@dataclass
class TextRuntime:
    """What runs the fp32 text tower (``numpy`` or ``onnxruntime``), why numpy does
    (``note``), and the check's figures; recorded only where ONNX Runtime was ``tried`` (not
    refused before, by the setting, the one-shot rule or the package missing)."""

    name: str = "numpy"
    note: str | None = None
    parity: dict[str, float] = field(default_factory=dict)
    version: str | None = None
    tried: bool = False

    def record(self) -> dict[str, Any]:
        """:func:`~.chooser.runtime_record`'s; empty where ONNX Runtime was not tried (the text path says why)."""
        return runtime_record("", self.name, self.version, self.parity, self.note) if self.tried else {}


def choose_text_runtime(
    name: str,
    directory: Path,
    fingerprint: Callable[[], str],
    numpy_tower: Any,
    embed: Callable[[Any, Sequence[str]], np.ndarray],
    text_queries: int | None,
    requested: str | None = None,
) -> tuple[Any | None, TextRuntime]:
    """The ONNX Runtime tower to run fp32 text queries on (None: keep ``numpy_tower``, the
    reference), and the record. ``embed(tower, texts)`` is the encoder's own loop; the export
    is made from ``directory`` where none is cached under ``fingerprint()``.

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


def local_checkpoint(model: str) -> tuple[str, Path]:
    """``(name, directory)`` of a Hugging Face checkpoint without any network access.

    Raises:
        UnsupportedTextTower: a hub id that is not in the local cache.
        ModelLoadError: a path that is not a checkpoint directory.
    """
    from .hf.checkpoint import cached_checkpoint
    from .numpy_text.tower_config import UnsupportedTextTower

    found = cached_checkpoint(model)
    if found is None:
        raise UnsupportedTextTower(f"{model} is not in the local Hugging Face cache")
    return found


def checked_checkpoint(model: str) -> tuple[str, Path, TextTowerConfig, SafetensorsReader]:
    """``(name, directory, config, weights)`` of a checkpoint whose text tower the numpy tower
    computes, judged from its config, tokenizer settings and weight headers (no weights read):
    what :func:`text_path` predicts from and :meth:`~.numpy_text.NumpyTextEncoder.load` loads.

    Raises:
        UnsupportedTextTower: a hub id not in the local cache, or a text tower this does not compute.
        ModelLoadError: a local directory that is not a checkpoint.
    """
    from .numpy_text.clip_tokenizer import TokenizerSettings
    from .numpy_text.tower_config import UnsupportedTextTower, read_checkpoint_config
    from .numpy_text.weights import SafetensorsReader

    name, directory = local_checkpoint(model)
    cfg = read_checkpoint_config(directory)
    TokenizerSettings.read(directory)
    if not (directory / "tokenizer.json").is_file():
        raise UnsupportedTextTower("no tokenizer.json")
    return name, directory, cfg, SafetensorsReader.for_checkpoint(directory)


def fast_path_refusal(backend: str, model: str, precision: str, device: str, runtime: str | None = None) -> str | None:
    """Why a query with these settings cannot take the numpy path (None: it may, checkpoint allowing).

    ``torch`` asked for (``runtime``, else ``CLIPSEARCH_TEXT_RUNTIME``) sends every text query to torch.

    Raises:
        InvalidArgumentError: an unknown runtime asked for.
    """
    if requested_runtime("text", runtime) == "torch":
        return f"{TEXT_RUNTIME_ENV}=torch"
    if backend != "hf" or model.startswith("open_clip:"):
        return f"{backend} models use their own text tower"
    if precision not in TEXT_PRECISIONS:
        return f"text precision {precision} runs in torch"
    if device not in ("auto", "cpu"):
        return f"--device {device} runs in torch"
    return None


def text_path(
    model: str, backend: str = "hf", precision: str = "fp32", device: str = "auto", text_queries: int | None = None,
    runtime: str | None = None,
) -> TextPath:
    """Which path :class:`~retrieval.index.ImageIndex` would take for a text query with
    these settings, and why (cheap: no weights read). ``text_queries``: how many texts the
    process will run, None for a long-lived one; ``runtime``: the text runtime asked for (None:
    the user's setting)."""
    from .numpy_text.tower_config import UnsupportedTextTower

    refusal = fast_path_refusal(backend, model, precision, device, runtime)
    if refusal is not None:
        return TextPath("torch", refusal)
    try:
        cfg = checked_checkpoint(model)[2]
    except (UnsupportedTextTower, ModelLoadError) as exc:
        return TextPath("torch", str(exc))
    tower = f"CLIP text tower ({cfg.num_layers} layers, {cfg.hidden_act})"
    ort = "fp32 on ONNX Runtime (its export of these weights, cached; numpy where it cannot run or differs from numpy's vectors)"
    one_shot = one_shot_reason(precision, text_queries)
    fp32_on = text_runtime_refusal(text_queries, requested=runtime)
    if precision == "int8":
        return TextPath("numpy", f"{tower} in numpy, int8 products (torch's kernels)")
    if precision == "auto" and one_shot is None and auto_modes("text", "cpu", "numpy"):
        also = "ONNX Runtime" if fp32_on is None else "numpy"
        return TextPath("numpy", f"{tower} in numpy, int8 products where they pass the quality gate, else fp32 on {also}")
    why = ""
    if one_shot is not None:
        why = f": auto runs fp32 here, {one_shot}"
    elif precision == "auto":
        why = f": auto has no reduced mode here (no fast int8 on this CPU, level {cpu.cpu_level()})"
    if fp32_on is None:
        return TextPath("onnxruntime", f"{tower}, {ort}{why}")
    not_ort = "" if one_shot is not None else f" (not ONNX Runtime: {fp32_on})"  # the one-shot rule said why
    return TextPath("numpy", f"{tower} in numpy, fp32, no torch{why}{not_ort}")


__all__ = [
    "ONE_SHOT_TEXTS",
    "TEXT_PRECISIONS",
    "TextPath",
    "TextRuntime",
    "checked_checkpoint",
    "choose_text_runtime",
    "fast_path_refusal",
    "local_checkpoint",
    "one_shot_reason",
    "text_path",
    "text_runtime_refusal",
]
