"""A Hugging Face CLIP checkpoint's image processor settings, read from either file layout."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import ModelLoadError

# The two places a checkpoint keeps its CLIPImageProcessor settings. The Hub's CLIP checkpoints
# (and CLIPImageProcessor.save_pretrained) write them as the whole of preprocessor_config.json;
# transformers 5's CLIPProcessor.save_pretrained writes no such file but nests them under
# "image_processor" in processor_config.json (beside "processor_class").
PREPROCESSOR_FILE = "preprocessor_config.json"
PROCESSOR_FILE = "processor_config.json"
_NESTED_KEY = "image_processor"


@dataclass(frozen=True)
class ImageProcessorConfig:
    """A checkpoint's ``CLIPImageProcessor`` settings and where they were read from.

    Attributes:
        settings: the ``CLIPImageProcessor`` keys (``size``, ``crop_size``, ``resample``, ...).
        source: the file they came from, :data:`PREPROCESSOR_FILE` or :data:`PROCESSOR_FILE`.
        raw: that file's bytes.
    """

    settings: Mapping[str, Any]
    source: str
    raw: bytes

    def preprocessor_json(self) -> bytes:
        """The settings as a top-level ``preprocessor_config.json`` (the Hub layout).

        The file's own bytes when they came from one; otherwise the nested settings written
        the way ``CLIPImageProcessor.save_pretrained`` writes them (sorted keys, indent 2).
        """
        if self.source == PREPROCESSOR_FILE:
            return self.raw
        return (json.dumps(dict(self.settings), indent=2, sort_keys=True) + "\n").encode("utf-8")


def read_image_processor_config(directory: Path, name: str | None = None) -> ImageProcessorConfig:
    """Read a checkpoint's image preprocessing settings from either layout, as transformers does.

    Same precedence as ``CLIPImageProcessor.from_pretrained`` in transformers 5: an
    ``image_processor`` entry in ``processor_config.json`` wins; otherwise the whole of
    ``preprocessor_config.json``. So the settings are the ones the reference processor uses,
    also for a checkpoint that has both files.

    Args:
        directory: the checkpoint directory.
        name: the model's name for messages (default: the directory).

    Returns:
        The settings with their source file and its bytes.

    Raises:
        ModelLoadError: neither layout is present, or the file is not a JSON object.
    """
    label = name or str(directory)

    def load(filename: str) -> tuple[Any, bytes]:
        raw = (directory / filename).read_bytes()
        try:
            return json.loads(raw.decode("utf-8")), raw
        except (UnicodeDecodeError, ValueError) as exc:
            raise ModelLoadError(f"{label}: unreadable {filename}: {exc}") from exc

    try:
        if (directory / PROCESSOR_FILE).is_file():
            data, raw = load(PROCESSOR_FILE)
            nested = data.get(_NESTED_KEY) if isinstance(data, dict) else None
            if nested is not None:
                if not isinstance(nested, dict):
                    raise ModelLoadError(f"{label}: {PROCESSOR_FILE}: {_NESTED_KEY!r} is not a JSON object")
                return ImageProcessorConfig(nested, PROCESSOR_FILE, raw)
        if (directory / PREPROCESSOR_FILE).is_file():
            data, raw = load(PREPROCESSOR_FILE)
            if not isinstance(data, dict):
                raise ModelLoadError(f"{label}: {PREPROCESSOR_FILE} is not a JSON object")
            return ImageProcessorConfig(data, PREPROCESSOR_FILE, raw)
    except OSError as exc:
        raise ModelLoadError(f"{label}: cannot read its image processor settings: {exc}") from exc
    raise ModelLoadError(
        f"{label} has no {PREPROCESSOR_FILE} (nor image processor settings in {PROCESSOR_FILE}); "
        "cannot know its image preprocessing"
    )
