"""Which path a text query takes: the numpy tower of this package, or the backend's torch one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...errors import ModelLoadError
from .. import cpu
from ..chooser import TEXT_RUNTIME_ENV, requested_runtime
from ..precision import auto_modes
from ..text_choice import one_shot_reason, text_runtime_refusal
from .clip_tokenizer import TokenizerSettings
from .tower_config import UnsupportedTextTower, read_checkpoint_config
from .weights import SafetensorsReader

# Text precisions this path computes; the others (bf16, fp16) run in torch.
TEXT_PRECISIONS: tuple[str, ...] = ("fp32", "int8", "auto")


def local_checkpoint(model: str) -> tuple[str, Path]:
    """``(name, directory)`` of a Hugging Face checkpoint without any network access.

    Raises:
        UnsupportedTextTower: a hub id that is not in the local cache.
        ModelLoadError: a path that is not a checkpoint directory.
    """
    from ..hf.checkpoint import cached_checkpoint

    found = cached_checkpoint(model)
    if found is None:
        raise UnsupportedTextTower(f"{model} is not in the local Hugging Face cache")
    return found


@dataclass(frozen=True)
class TextPath:
    """Which text tower a text query would run on, and why.

    Attributes:
        path: ``numpy`` (this package, no torch), ``onnxruntime`` (this package's tokenizer and
            loop, the fp32 tower's forward pass on ONNX Runtime, :func:`..text_choice.choose_text_runtime`) or
            ``torch`` (the backend's own encoder).
        reason: why, in a few words.
    """

    path: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


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
    """Which path :class:`~retrieval.index.ImageIndex` would take for a text query (cheap: no weights read).

    Args:
        model: the query model (the index's, unless ``--model`` names another).
        backend: the index's backend (``hf``, ``open_clip``).
        precision: the text precision asked for.
        device: the device asked for.
        text_queries: how many text queries the process will run, when it knows (see
            :func:`~..text_choice.one_shot_reason`); None for a long-lived process.
        runtime: the text runtime asked for (:func:`~..chooser.requested_runtime`); None: the user's setting.
    """
    refusal = fast_path_refusal(backend, model, precision, device, runtime)
    if refusal is not None:
        return TextPath("torch", refusal)
    try:
        _, directory = local_checkpoint(model)
        cfg = read_checkpoint_config(directory)
        TokenizerSettings.read(directory)
        if not (directory / "tokenizer.json").is_file():
            raise UnsupportedTextTower("no tokenizer.json")
        SafetensorsReader.for_checkpoint(directory)
    except (UnsupportedTextTower, ModelLoadError) as exc:
        return TextPath("torch", str(exc))
    tower = f"CLIP text tower ({cfg.num_layers} layers, {cfg.hidden_act})"
    ort = "fp32 on ONNX Runtime (its export of these weights, cached; numpy where it cannot run or differs from numpy's vectors)"
    one_shot = one_shot_reason(precision, text_queries)
    fp32_on = text_runtime_refusal(text_queries, requested=runtime)
    if precision == "int8":
        return TextPath("numpy", f"{tower} in numpy, int8 products (torch's kernels)")
    if precision == "auto" and one_shot is None and auto_modes("cpu", ("int8",)):
        also = "ONNX Runtime" if fp32_on is None else "numpy"
        return TextPath("numpy", f"{tower} in numpy, int8 products where they pass the quality gate, else fp32 on {also}")
    why = ""
    if one_shot is not None:
        why = f": auto runs fp32 here, {one_shot}"
    elif precision == "auto":
        why = f": auto has no reduced mode here (no fast int8 on this CPU, level {cpu.cpu_level()})"
    if fp32_on is None:
        return TextPath("onnxruntime", f"{tower}, {ort}{why}")
    if one_shot is not None:
        return TextPath("numpy", f"{tower} in numpy, fp32, no torch{why}")
    return TextPath("numpy", f"{tower} in numpy, fp32, no torch{why} (not ONNX Runtime: {fp32_on})")
