"""What a fine-tuning run leaves on disk: the resumable checkpoint and the final model.

Layout of the output directory ``OUT``::

    OUT/
      config.json, model.safetensors,        the final model: a standard Hugging Face CLIP
      tokenizer.json, tokenizer_config.json,  checkpoint (CLIPModel.save_pretrained + tokenizer
      preprocessor_config.json               + a top-level preprocessor_config.json)
      finetune.json                          how it was made: options, data, metrics, times
      checkpoint/                            while training (kept with --keep-checkpoint):
        model/                               the current weights, a loadable HF checkpoint (fp32)
        trainer_state.pt                     optimizer, scheduler, step, position in the epoch,
                                             RNG states, loss and metric history
        run.json                             the training options it was made with

Both are written so that a crash never leaves a half-written one in place:

- the checkpoint is written to ``OUT/.checkpoint.tmp/``, then swapped in by two renames (the
  previous one is ``OUT/.checkpoint.old/`` in between, and :func:`find_checkpoint` falls back
  to it);
- the final model is written to ``OUT/.export.tmp/`` and its files are moved into ``OUT``
  with ``config.json`` removed first and moved last: whatever the moment of a crash, ``OUT``
  either has no ``config.json`` (not a checkpoint: loading it fails with a clear message) or
  has all the new files.

The image processor settings are written as a top-level ``preprocessor_config.json``, the
layout of the Hub's CLIP checkpoints, which every transformers version reads: copied byte for
byte when the base checkpoint has that file, otherwise the settings transformers 5's
``CLIPProcessor.save_pretrained`` nested in the base's ``processor_config.json`` (see
:func:`retrieval.encoders.hf.read_image_processor_config`). They are never re-saved through
``CLIPProcessor.save_pretrained``, which would write only the nested layout.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from retrieval.errors import FinetuneError
from retrieval.faults import crash_point
from retrieval.layout import fsync_tree

CHECKPOINT_DIR = "checkpoint"
MODEL_DIR = "model"
STATE_FILE = "trainer_state.pt"
RUN_FILE = "run.json"
RECORD_FILE = "finetune.json"
PREPROCESSOR_FILE = "preprocessor_config.json"
STATE_FORMAT = 1

_TMP_CHECKPOINT = ".checkpoint.tmp"
_OLD_CHECKPOINT = ".checkpoint.old"
_TMP_EXPORT = ".export.tmp"

SAVE_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")


def prepare_output_dir(out: Path, resume: bool) -> Path | None:
    """Check that ``out`` can receive a new run, or holds one to resume.

    Returns:
        The checkpoint directory to resume from (``resume``), else None.

    Raises:
        FinetuneError: a new run into a non-empty directory, or nothing to resume.
    """
    if out.exists() and not out.is_dir():
        raise FinetuneError(f"--out {out} exists and is not a directory")
    if resume:
        found = find_checkpoint(out)
        if found is None:
            finished = " (it holds a finished model; a finished run removes its checkpoint unless --keep-checkpoint)"
            raise FinetuneError(
                f"nothing to resume: {out / CHECKPOINT_DIR} does not exist"
                + (finished if (out / "config.json").is_file() else "")
            )
        return found
    # A run killed during its first checkpoint leaves only that unfinished one: nothing to
    # resume, and nothing a new run must not overwrite (save_checkpoint replaces it).
    if out.is_dir() and any(p.name != _TMP_CHECKPOINT for p in out.iterdir()):
        raise FinetuneError(f"--out {out} exists and is not empty; pass --resume to continue its run, or choose a new directory")
    return None


def find_checkpoint(out: Path) -> Path | None:
    """The complete checkpoint in ``out``, if any (the previous one when a swap was interrupted)."""
    for name in (CHECKPOINT_DIR, _OLD_CHECKPOINT):
        candidate = out / name
        if (candidate / STATE_FILE).is_file() and (candidate / MODEL_DIR / "config.json").is_file():
            return candidate
    return None


def _write_hf(directory: Path, model: Any, tokenizer: Any, preprocessor: bytes) -> None:
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a one-file model needs no "Writing shards" bar
    try:
        model.save_pretrained(directory, safe_serialization=True)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(directory)
    (directory / PREPROCESSOR_FILE).write_bytes(preprocessor)


def save_checkpoint(out: Path, model: Any, tokenizer: Any, preprocessor: bytes, state: Mapping[str, Any], run: Mapping[str, Any]) -> Path:
    """Write the resumable training state to ``out/checkpoint/``, replacing the previous one.

    Args:
        out: the run's output directory (created if missing).
        model: the ``CLIPModel`` being trained (saved in its current dtype).
        tokenizer, preprocessor: the base checkpoint's tokenizer and the bytes of the
            ``preprocessor_config.json`` to write (``ImageProcessorConfig.preprocessor_json``).
        state: tensors and plain values (``torch.save``-able with ``weights_only`` loading).
        run: the training options, written as JSON.

    Returns:
        The checkpoint directory.
    """
    import torch

    out.mkdir(parents=True, exist_ok=True)
    tmp, old, final = out / _TMP_CHECKPOINT, out / _OLD_CHECKPOINT, out / CHECKPOINT_DIR
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / MODEL_DIR).mkdir(parents=True)
    _write_hf(tmp / MODEL_DIR, model, tokenizer, preprocessor)
    torch.save({"format": STATE_FORMAT, **state}, tmp / STATE_FILE)
    (tmp / RUN_FILE).write_text(json.dumps(dict(run), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    fsync_tree(tmp / MODEL_DIR)
    fsync_tree(tmp)
    crash_point("checkpoint-staged")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        crash_point("checkpoint-swap")
    os.rename(tmp, final)
    fsync_tree(out)
    shutil.rmtree(old, ignore_errors=True)
    crash_point("checkpoint-saved")
    return final


def load_state(checkpoint: Path) -> dict[str, Any]:
    """Read ``trainer_state.pt`` and ``run.json`` of a checkpoint.

    Returns:
        The state, with the run options under ``"run"``.

    Raises:
        FinetuneError: unreadable, or written by an incompatible version.
    """
    import torch

    try:
        state = torch.load(checkpoint / STATE_FILE, map_location="cpu", weights_only=True)
        run = json.loads((checkpoint / RUN_FILE).read_text(encoding="utf-8"))
    except Exception as exc:  # noqa: BLE001 - pickle, OS and JSON errors alike mean "cannot resume"
        raise FinetuneError(f"cannot read the checkpoint in {checkpoint}: {str(exc).splitlines()[0]}") from exc
    if state.get("format") != STATE_FORMAT:
        raise FinetuneError(f"{checkpoint} was written by another version of clipsearch finetune (format {state.get('format')!r})")
    state["run"] = run
    return state


def remove_checkpoint(out: Path) -> None:
    """Delete the training checkpoint (after the final model is in place)."""
    for name in (CHECKPOINT_DIR, _OLD_CHECKPOINT, _TMP_CHECKPOINT):
        shutil.rmtree(out / name, ignore_errors=True)


def export_model(out: Path, model: Any, tokenizer: Any, preprocessor: bytes, dtype: str, record: Mapping[str, Any]) -> None:
    """Write the final Hugging Face checkpoint into ``out`` (see the module docstring).

    Args:
        out: the output directory.
        model: the trained ``CLIPModel`` (left unchanged; a copy is cast to ``dtype``).
        tokenizer, preprocessor: saved beside the weights.
        dtype: ``float32``, ``float16`` or ``bfloat16`` for the saved weights.
        record: written as ``finetune.json``.
    """
    import torch

    out.mkdir(parents=True, exist_ok=True)
    tmp = out / _TMP_EXPORT
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    saved = model if dtype == "float32" else copy.deepcopy(model).to(getattr(torch, dtype))
    _write_hf(tmp, saved, tokenizer, preprocessor)
    (tmp / RECORD_FILE).write_text(json.dumps(dict(record), indent=2) + "\n", encoding="utf-8")
    fsync_tree(tmp)
    config = out / "config.json"
    config.unlink(missing_ok=True)
    names = sorted(p.name for p in tmp.iterdir())
    for name in names:
        if name != "config.json":
            os.replace(tmp / name, out / name)
    fsync_tree(out)
    crash_point("export")
    os.replace(tmp / "config.json", config)
    fsync_tree(out)
    tmp.rmdir()
    crash_point("exported")
