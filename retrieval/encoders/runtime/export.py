"""The towers as ONNX files, exported once per weights and input size, kept in a cache.

An export is derived data, keyed by the weights' fingerprint, the input size and the export's
versions, written to a temporary name and renamed, so concurrent builds never read half a file
and a stale export is never used. Not in the index directory: an index is a checksummed,
versioned contract that readers never write to, and one export serves every index of a model.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from ...errors import ModelLoadError
from ..base import quiet_transformers, user_cache

ONNX_CACHE_ENV = "CLIPSEARCH_ONNX_CACHE"
# Bumped when the exported graph changes (inputs, outputs, opset, wrapper).
EXPORT_VERSION = 1
OPSET = 17


def cache_dir() -> Path:
    """Where exported towers are kept (created on first export): ``$CLIPSEARCH_ONNX_CACHE``, else ``onnx/`` in the user cache."""
    explicit = os.environ.get(ONNX_CACHE_ENV, "").strip()
    return Path(explicit).expanduser() if explicit else user_cache() / "onnx"


def torch_version() -> str:
    """``torch.__version__`` (with its local part, ``+cu130``), read without importing torch
    where it is not imported yet: a process that finds an export needs no torch."""
    import sys

    if "torch" in sys.modules:
        return str(sys.modules["torch"].__version__)
    import importlib.util
    import re

    spec = importlib.util.find_spec("torch")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        try:
            text = (Path(folder) / "version.py").read_text(encoding="utf-8")
        except OSError:
            continue
        match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
        if match:
            return match.group(1)
    import torch

    return str(torch.__version__)


def export_key(fingerprint: str, image_size: int, tower: str = "vision") -> str:
    """A file name for one export: weights, input size, torch version, export version."""
    raw = f"v{EXPORT_VERSION}|{tower}|{fingerprint}|{image_size}|torch={torch_version()}|opset={OPSET}"
    return f"{tower}-{image_size}-{hashlib.sha256(raw.encode()).hexdigest()[:20]}.onnx"


def _failed_operator(exc: BaseException) -> str:
    """The operator an export error names, when it names one (else its first line)."""
    import re

    text = str(exc)
    match = re.search(r"(aten::\w+|prim::\w+|Exporting the operator '?[\w:.]+'?)", text)
    if match:
        return match.group(1).replace("Exporting the operator ", "").strip("'")
    lines = text.strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def export_vision(
    tower: Any, output: str, image_size: int, dest: Path, model_name: str, interpolate: bool = False
) -> Path:
    """Export ``tower`` (a transformers vision tower with projection, on the CPU, float32) to
    ``dest``, atomically; ``output`` is the attribute of its output that holds the embeddings,
    ``interpolate`` whether ``image_size`` is another size than the checkpoint's own.

    Raises:
        ModelLoadError: the export failed; the message names the model and the operator.
    """
    import torch

    class ImageFeatures(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tower = tower

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return getattr(self.tower(pixel_values=pixel_values, interpolate_pos_encoding=interpolate), output)

    example = torch.zeros(2, 3, image_size, image_size, dtype=torch.float32)
    return _export_atomically(
        ImageFeatures().eval(), (example,), dest, f"the image tower of {model_name}", input_names=["pixel_values"],
        output_names=["image_embeds"], dynamic_axes={"pixel_values": {0: "batch"}, "image_embeds": {0: "batch"}},
    )


def _export_atomically(module: Any, args: tuple[Any, ...], dest: Path, what: str, **options: Any) -> Path:
    """``torch.onnx.export`` of ``module`` to ``dest`` through a temporary name in the same folder,
    so that a reader never finds half a file; ``options`` are the graph's names and dynamic axes.

    Raises:
        ModelLoadError: the export failed (``what`` and the operator named).
    """
    import warnings

    import torch

    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".export-", suffix=".onnx", dir=dest.parent)
    os.close(fd)
    try:
        with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, args, tmp, opset_version=OPSET, dynamo=False, **options)
        os.replace(tmp, dest)
    except Exception as exc:  # noqa: BLE001  (any exporter failure becomes one typed error)
        Path(tmp).unlink(missing_ok=True)
        raise ModelLoadError(f"cannot export {what} to ONNX: unsupported operator or construct {_failed_operator(exc)}") from exc
    return dest


def cached_vision_export(
    tower_loader: Any, output: str, fingerprint: str, image_size: int, model_name: str, interpolate: bool = False
) -> Path:
    """The cached export for these weights and size, made now (``tower_loader()`` gives the
    torch tower) if missing.

    Raises:
        ModelLoadError: the export failed (model and operator named).
    """
    dest = cache_dir() / export_key(fingerprint, image_size)
    if dest.is_file() and dest.stat().st_size > 0:
        return dest
    return export_vision(tower_loader(), output, image_size, dest, model_name, interpolate)


# -- the text tower ------------------------------------------------------------------------------

# Bumped when the exported text graph changes.
TEXT_EXPORT_VERSION = 1


def text_export_key(fingerprint: str, max_positions: int) -> str:
    """A file name for one text-tower export: weights, context length, export version.

    Unlike the image key, not torch's version: the key must be computable without importing
    torch (a process that finds the export needs neither torch nor transformers), and every load
    checks the export's vectors against the numpy tower's anyway (:func:`..text_choice.choose_text_runtime`).
    """
    raw = f"v{TEXT_EXPORT_VERSION}|text|{fingerprint}|{max_positions}|opset={OPSET}"
    return f"text-{max_positions}-{hashlib.sha256(raw.encode()).hexdigest()[:20]}.onnx"


def export_text(directory: Path, dest: Path, model_name: str, eos_token_id: int) -> Path:
    """Export ``CLIPTextModelWithProjection`` of the checkpoint in ``directory`` to ``dest``,
    atomically: inputs ``input_ids`` and ``attention_mask`` (int64, batch and length dynamic),
    output ``text_embeds`` (projected, not normalised).

    Raises:
        ModelLoadError: torch or transformers is missing, or the export failed (the message
            names the model and the operator).
    """
    try:
        import torch
        from transformers import CLIPTextModelWithProjection
    except ImportError as exc:
        raise ModelLoadError(f"exporting the text tower to ONNX needs torch and transformers ({exc})") from exc

    # Quiet: a CLIPModel checkpoint's image weights are "unused" here, and the loading bar would
    # land on a server's stderr in the middle of a query.
    try:
        with quiet_transformers():
            tower = CLIPTextModelWithProjection.from_pretrained(directory, dtype=torch.float32).eval()
    except Exception as exc:  # noqa: BLE001  (transformers raises many types)
        raise ModelLoadError(f"cannot load the text tower of {model_name} with transformers: {exc}") from exc

    class TextFeatures(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tower = tower

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.tower(input_ids=input_ids, attention_mask=attention_mask).text_embeds

    # Two rows of different lengths (one padded) so that nothing shape- or mask-dependent is
    # traced as a constant; the pooled token is found from the ids at run time.
    ids = torch.tensor([[1, 3, 4, eos_token_id], [1, 3, eos_token_id, eos_token_id]], dtype=torch.int64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.int64)
    return _export_atomically(
        TextFeatures().eval(), (ids, mask), dest, f"the text tower of {model_name}",
        input_names=["input_ids", "attention_mask"], output_names=["text_embeds"],
        dynamic_axes={"input_ids": {0: "batch", 1: "length"}, "attention_mask": {0: "batch", 1: "length"},
                      "text_embeds": {0: "batch"}},
    )


def cached_text_export(directory: Path, fingerprint: str, max_positions: int, model_name: str, eos_token_id: int) -> Path:
    """The cached text-tower export for these weights, made now (torch and transformers
    imported) if missing.

    Raises:
        ModelLoadError: no export is cached and one cannot be made (torch or transformers
            missing, or the export failed: model and operator named).
    """
    dest = cache_dir() / text_export_key(fingerprint, max_positions)
    if dest.is_file() and dest.stat().st_size > 0:
        return dest
    return export_text(directory, dest, model_name, eos_token_id)


__all__ = [
    "EXPORT_VERSION",
    "ONNX_CACHE_ENV",
    "OPSET",
    "TEXT_EXPORT_VERSION",
    "cache_dir",
    "cached_text_export",
    "cached_vision_export",
    "export_key",
    "export_text",
    "export_vision",
    "text_export_key",
    "torch_version",
]
