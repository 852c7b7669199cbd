"""The starting point of a run: a checkpoint, a resumed checkpoint, or a random small CLIP."""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from retrieval.encoders import HFClipEncoder, read_image_processor_config
from retrieval.errors import FinetuneError, InvalidArgumentError, ModelLoadError

from .finetune_config import FinetuneConfig
from .train_state import MODEL_DIR


def resolve_spec(spec: str) -> Any:
    """``--from-config SPEC`` -> a ``RandomClipSpec``: a preset name or a JSON file of its fields.

    Raises:
        InvalidArgumentError: unknown preset and no such file, unreadable JSON, unknown or
            missing fields, or invalid values.
    """
    from retrieval.tools.random_model import PRESETS, RandomClipSpec

    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if not path.is_file():
        raise InvalidArgumentError(
            f"--from-config {spec!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor a JSON file"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgumentError(f"--from-config {spec}: not a readable JSON file ({exc})") from None
    names = [f.name for f in fields(RandomClipSpec)]
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"--from-config {spec}: expected a JSON object with the fields {', '.join(names)}")
    unknown = sorted(set(data) - set(names))
    missing = [n for n in names if n not in data]
    if unknown or missing:
        parts = [f"unknown: {', '.join(unknown)}"] if unknown else []
        parts += [f"missing: {', '.join(missing)}"] if missing else []
        detail = "; ".join(parts)
        raise InvalidArgumentError(f"--from-config {spec}: {detail} (fields: {', '.join(names)})")
    return RandomClipSpec(**data)


@contextlib.contextmanager
def model_source(config: FinetuneConfig, checkpoint: Path | None) -> Iterator[str]:
    """The directory (or hub id) the starting weights are read from."""
    if checkpoint is not None:
        yield str(checkpoint / MODEL_DIR)
    elif config.from_config is not None:
        from retrieval.tools.random_model import make_random_clip

        spec = resolve_spec(config.from_config)
        with tempfile.TemporaryDirectory(prefix="clipsearch-from-config-") as tmp:
            make_random_clip(tmp, preset=spec, seed=config.seed)
            yield tmp
    else:
        yield str(config.model)


def check_backend(config: FinetuneConfig) -> None:
    """Refuse an open_clip base: only a Hugging Face ``CLIPModel`` can be trained and saved."""
    if config.model is not None and config.model.startswith("open_clip:"):
        raise FinetuneError(
            f"fine-tuning supports Hugging Face CLIP checkpoints (CLIPModel) only, not open_clip models ({config.model}); "
            "pass a Hugging Face checkpoint directory or hub id, or --from-config"
        )


@dataclass(frozen=True)
class LoadedModel:
    """The loaded starting point: weights on the device, tokenizer, preprocessing."""

    name: str
    model: Any
    tokenizer: Any
    preprocess: Any
    preprocessor: bytes
    max_length: int
    device: Any


def load_model(source: str, device: str, name: str) -> LoadedModel:
    """Load ``source`` as an fp32 ``CLIPModel`` on ``device``, with its tokenizer and preprocessing.

    Raises:
        ModelLoadError: it cannot be loaded, or it lacks some of CLIPModel's weights.
    """
    import torch
    from transformers import CLIPModel
    from transformers.utils import logging as hf_logging

    encoder = HFClipEncoder.load(source, device=device)
    if encoder.family.sigmoid:
        # The loop trains CLIP's softmax contrastive loss; SigLIP was trained with a sigmoid
        # loss and a learned bias, which a softmax fine-tune would silently undo.
        raise FinetuneError(
            f"cannot fine-tune {name}: it is a {encoder.family.label} model ({encoder.family.name}), and finetune "
            "trains CLIP's softmax contrastive loss only; SigLIP's sigmoid loss is not implemented. "
            "Fine-tune a CLIP checkpoint, or search with this one as it is"
        )
    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()  # no "Loading weights" bar in the middle of the progress table
    hf_logging.set_verbosity_error()
    try:
        # Annotated as returning the model alone; output_loading_info=True makes it (model, info).
        loaded: Any = CLIPModel.from_pretrained(encoder.directory, output_loading_info=True, dtype=torch.float32)
        model, info = loaded
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"cannot load CLIPModel from {name}: {str(exc).splitlines()[0]}") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    missing = list(info.get("missing_keys") or [])
    if missing:
        # Training would start from random values for these without saying so.
        raise ModelLoadError(f"{name} lacks weights for CLIPModel ({len(missing)} missing, e.g. {missing[0]})")
    # Settings from either layout of the base (the same ones clipsearch and transformers use),
    # saved as a top-level preprocessor_config.json: byte for byte when the base has one.
    processor = encoder.image_processor or read_image_processor_config(Path(encoder.directory), name)
    preprocessor = processor.preprocessor_json()
    return LoadedModel(
        name=name,
        model=model.to(encoder.device),
        tokenizer=encoder.tokenizer,
        preprocess=encoder.preprocess,
        preprocessor=preprocessor,
        max_length=encoder.max_text_length,
        device=encoder.device,
    )


__all__ = ["LoadedModel", "check_backend", "load_model", "model_source", "resolve_spec"]
