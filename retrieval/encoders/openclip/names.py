"""open_clip model names: the ``open_clip:...`` syntax, parsed without building anything.

See :mod:`retrieval.encoders.openclip` for the forms. Parsing checks syntax and local paths
only; :func:`_tags_text` and :func:`_check_architecture` ask open_clip's registry (imported
when called) about built-in architectures and their pretrained tags.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import InvalidArgumentError, ModelLoadError

PREFIX = "open_clip:"
HF_HUB = "hf-hub:"
LOCAL_DIR = "local-dir:"

CONFIG_FILE = "open_clip_config.json"

_USAGE = (
    "name an open_clip model as open_clip:ARCH/TAG (e.g. open_clip:ViT-B-32/laion2b_s34b_b79k), "
    "open_clip:ARCH@/path/to/weights.pt, open_clip:hf-hub:ORG/NAME or open_clip:local-dir:/path/to/dir"
)


def is_open_clip_name(model: str) -> bool:
    """True when ``model`` names an open_clip model (``open_clip:...``)."""
    return model.startswith(PREFIX)


@dataclass(frozen=True)
class OpenClipSpec:
    """A parsed ``open_clip:...`` model name.

    Attributes:
        kind: ``"tag"`` (built-in weights), ``"file"`` (local weights file), ``"hub"``
            (Hugging Face repository) or ``"dir"`` (local open_clip directory).
        architecture: built-in architecture name, or None.
        arch_file: absolute path of a model-config JSON file used as the architecture, or None.
        pretrained: open_clip pretrained tag (normalised like open_clip does), or None.
        weights: absolute path of the local weights file (kind ``"file"``), or None.
        hub_id: ``ORG/NAME`` (kind ``"hub"``), or None.
        directory: absolute path of the open_clip directory (kind ``"dir"``), or None.
    """

    kind: str
    architecture: str | None = None
    arch_file: Path | None = None
    pretrained: str | None = None
    weights: Path | None = None
    hub_id: str | None = None
    directory: Path | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("tag", "file", "hub", "dir"):
            raise ValueError(f"unknown open_clip spec kind {self.kind!r}")

    @property
    def arch_label(self) -> str:
        """How the architecture is written in the name (built-in name or config file path)."""
        return self.architecture if self.architecture is not None else str(self.arch_file)

    @property
    def name(self) -> str:
        """Canonical name: absolute paths, normalised tag; loading it gives the same model."""
        if self.kind == "hub":
            return f"{PREFIX}{HF_HUB}{self.hub_id}"
        if self.kind == "dir":
            return f"{PREFIX}{LOCAL_DIR}{self.directory}"
        arch = self.arch_label + (f"/{self.pretrained}" if self.pretrained else "")
        return f"{PREFIX}{arch}@{self.weights}" if self.kind == "file" else f"{PREFIX}{arch}"


def parse_spec(model: str) -> OpenClipSpec:
    """Parse an ``open_clip:...`` name (syntax and local paths only; no model lookup).

    Raises:
        InvalidArgumentError: not an open_clip name, or malformed.
        ModelLoadError: a named local file or directory does not exist.
    """
    if not is_open_clip_name(model):
        raise InvalidArgumentError(f"{model!r} is not an open_clip model name; {_USAGE}")
    rest = model[len(PREFIX) :].strip()
    if not rest:
        raise InvalidArgumentError(f"{model!r} names no model; {_USAGE}")
    if rest.startswith(HF_HUB):
        hub_id = rest[len(HF_HUB) :].strip("/")
        parts = hub_id.split("/")
        if len(parts) != 2 or not all(parts):
            raise InvalidArgumentError(f"{model!r}: expected open_clip:hf-hub:ORG/NAME")
        return OpenClipSpec(kind="hub", hub_id=hub_id)
    if rest.startswith(LOCAL_DIR):
        directory = Path(rest[len(LOCAL_DIR) :]).expanduser()
        if not directory.is_dir():
            raise ModelLoadError(f"open_clip model directory {str(directory)!r} does not exist")
        directory = directory.resolve()
        if not (directory / CONFIG_FILE).is_file():
            raise ModelLoadError(f"{directory} is not an open_clip model directory: it has no {CONFIG_FILE}")
        return OpenClipSpec(kind="dir", directory=directory)
    # A config-file architecture may contain '@' in its path; split after ".json" then.
    cut = rest.find(".json@")
    if cut >= 0:
        arch_part, weights_part = rest[: cut + 5], rest[cut + 6 :]
    elif "@" in rest:
        arch_part, weights_part = rest.split("@", 1)
    else:
        arch_part, weights_part = rest, None
    architecture, pretrained, arch_file = _parse_arch(arch_part, model)
    if weights_part is None:
        if arch_file is not None or architecture is None:  # no architecture name means a config file
            raise InvalidArgumentError(f"{model!r} has an architecture but no weights: use open_clip:{arch_part}@/path/to/weights.pt")
        if pretrained is None:
            raise InvalidArgumentError(
                f"{model!r} names an architecture without weights: use open_clip:{architecture}/TAG with one of "
                f"its pretrained tags ({_tags_text(architecture)}), or open_clip:{architecture}@/path/to/weights.pt"
            )
        return OpenClipSpec(kind="tag", architecture=architecture, pretrained=pretrained)
    if not weights_part.strip():
        raise InvalidArgumentError(f"{model!r}: nothing after '@'; expected a weights file path")
    weights = Path(weights_part).expanduser()
    if not weights.is_file():
        what = "is a directory, not a weights file" if weights.is_dir() else "does not exist"
        raise ModelLoadError(f"open_clip weights file {weights_part!r} {what}")
    return OpenClipSpec(kind="file", architecture=architecture, arch_file=arch_file, pretrained=pretrained, weights=weights.resolve())


def _parse_arch(text: str, model: str) -> tuple[str | None, str | None, Path | None]:
    """``ARCH``, ``ARCH/TAG`` or a config JSON path -> (architecture, tag, config file)."""
    text = text.strip()
    if text.endswith(".json"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise ModelLoadError(f"open_clip architecture config file {text!r} does not exist")
        return None, None, path.resolve()
    arch, _, tag = text.partition("/")
    if not arch or (_ and not tag) or "/" in tag:
        raise InvalidArgumentError(f"{model!r}: expected ARCH or ARCH/TAG before '@' or at the end; {_USAGE}")
    return arch, (_clean_tag(tag) if tag else None), None


def _clean_tag(tag: str) -> str:
    # open_clip looks tags up lower-cased with '-' as '_'; the canonical name does the same.
    return tag.strip().lower().replace("-", "_")


def _tags_text(architecture: str) -> str:
    import open_clip

    tags = open_clip.list_pretrained_tags_by_model(architecture)
    return ", ".join(tags) if tags else "open_clip has none for it"


def _check_architecture(architecture: str) -> dict[str, Any]:
    """The built-in config of ``architecture``; a clear error naming close matches otherwise."""
    import open_clip

    cfg = open_clip.get_model_config(architecture)
    if cfg is None:
        close = difflib.get_close_matches(architecture, open_clip.list_models(), n=5, cutoff=0.6)
        maybe = f" Close matches: {', '.join(close)}." if close else ""
        raise ModelLoadError(
            f"unknown open_clip architecture {architecture!r}.{maybe} List the architectures with "
            "`python -c \"import open_clip; print(open_clip.list_models())\"` and their pretrained weights with "
            "`python -c \"import open_clip; print(open_clip.list_pretrained())\"`"
        )
    return cfg
