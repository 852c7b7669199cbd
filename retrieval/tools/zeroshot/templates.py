"""Prompt templates and label lists for zero-shot classification.

``OPENAI_TEMPLATES`` are the 80 prompts OpenAI ensembled for ImageNet and ``SIMPLE_TEMPLATES``
the 7 short ones, as open_clip ships them (``open_clip.zero_shot_metadata``; a test checks
they are equal), written with ``{}`` where the label goes.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import InvalidArgumentError

DEFAULT_TEMPLATE = "a photo of a {}."

OPENAI_TEMPLATES: tuple[str, ...] = (
    "a bad photo of a {}.",
    "a photo of many {}.",
    "a sculpture of a {}.",
    "a photo of the hard to see {}.",
    "a low resolution photo of the {}.",
    "a rendering of a {}.",
    "graffiti of a {}.",
    "a bad photo of the {}.",
    "a cropped photo of the {}.",
    "a tattoo of a {}.",
    "the embroidered {}.",
    "a photo of a hard to see {}.",
    "a bright photo of a {}.",
    "a photo of a clean {}.",
    "a photo of a dirty {}.",
    "a dark photo of the {}.",
    "a drawing of a {}.",
    "a photo of my {}.",
    "the plastic {}.",
    "a photo of the cool {}.",
    "a close-up photo of a {}.",
    "a black and white photo of the {}.",
    "a painting of the {}.",
    "a painting of a {}.",
    "a pixelated photo of the {}.",
    "a sculpture of the {}.",
    "a bright photo of the {}.",
    "a cropped photo of a {}.",
    "a plastic {}.",
    "a photo of the dirty {}.",
    "a jpeg corrupted photo of a {}.",
    "a blurry photo of the {}.",
    "a photo of the {}.",
    "a good photo of the {}.",
    "a rendering of the {}.",
    "a {} in a video game.",
    "a photo of one {}.",
    "a doodle of a {}.",
    "a close-up photo of the {}.",
    "a photo of a {}.",
    "the origami {}.",
    "the {} in a video game.",
    "a sketch of a {}.",
    "a doodle of the {}.",
    "a origami {}.",
    "a low resolution photo of a {}.",
    "the toy {}.",
    "a rendition of the {}.",
    "a photo of the clean {}.",
    "a photo of a large {}.",
    "a rendition of a {}.",
    "a photo of a nice {}.",
    "a photo of a weird {}.",
    "a blurry photo of a {}.",
    "a cartoon {}.",
    "art of a {}.",
    "a sketch of the {}.",
    "a embroidered {}.",
    "a pixelated photo of a {}.",
    "itap of the {}.",
    "a jpeg corrupted photo of the {}.",
    "a good photo of a {}.",
    "a plushie {}.",
    "a photo of the nice {}.",
    "a photo of the small {}.",
    "a photo of the weird {}.",
    "the cartoon {}.",
    "art of the {}.",
    "a drawing of the {}.",
    "a photo of the large {}.",
    "a black and white photo of a {}.",
    "the plushie {}.",
    "a dark photo of a {}.",
    "itap of a {}.",
    "graffiti of the {}.",
    "a toy {}.",
    "itap of my {}.",
    "a photo of a cool {}.",
    "a photo of a small {}.",
    "a tattoo of the {}.",
)
SIMPLE_TEMPLATES: tuple[str, ...] = (
    "itap of a {}.",
    "a bad photo of the {}.",
    "a origami {}.",
    "a photo of the large {}.",
    "a {} in a video game.",
    "art of the {}.",
    "a photo of the small {}.",
)

TEMPLATE_SETS: dict[str, tuple[str, ...]] = {"openai": OPENAI_TEMPLATES, "simple": SIMPLE_TEMPLATES}


def check_template(template: str) -> str:
    """A template with ``{}`` where the label goes (``str.format`` with one argument).

    Raises:
        InvalidArgumentError: no ``{}``, or braces ``str.format`` cannot fill with one label.
    """
    if "{}" not in template:
        raise InvalidArgumentError(f"the template {template!r} has no {{}} for the label")
    try:
        template.format("label")
    except (IndexError, KeyError, ValueError) as exc:
        raise InvalidArgumentError(f"the template {template!r} is not a format string with one {{}}: {exc}") from None
    return template


def resolve_templates(template: str | None = None, templates: str | os.PathLike[str] | None = None) -> tuple[str, ...]:
    """The prompts to ensemble: one ``template``, a named set (``openai``, ``simple``), or a
    file with one template per line (blank lines and ``#`` comments ignored); by default
    :data:`DEFAULT_TEMPLATE`.

    Raises:
        InvalidArgumentError: both given, an unknown set or unreadable file, a template without ``{}``.
    """
    if template is not None and templates is not None:
        raise InvalidArgumentError("give either a template or a template set, not both")
    if templates is None:
        return (check_template(DEFAULT_TEMPLATE if template is None else template),)
    if isinstance(templates, str) and templates in TEMPLATE_SETS:
        return TEMPLATE_SETS[templates]
    path = Path(templates)
    if not path.is_file():
        raise InvalidArgumentError(f"--templates is openai, simple or a file of templates; {str(templates)!r} is none of them")
    lines = _lines(path, "template")
    return tuple(check_template(t) for t in lines)


def read_labels(path: str | os.PathLike[str]) -> list[str]:
    """Labels from a file, one per line (blank lines and ``#`` comments ignored).

    Raises:
        InvalidArgumentError: unreadable or empty.
    """
    return _lines(Path(path), "label")


def check_labels(labels: list[str]) -> list[str]:
    """Labels stripped of surrounding blanks: at least one, none empty, no duplicates.

    Raises:
        InvalidArgumentError: no labels, an empty label or a duplicate.
    """
    cleaned = [label.strip() for label in labels]
    if not cleaned:
        raise InvalidArgumentError("no labels: give --label NAME (repeatable) or --labels FILE")
    seen: set[str] = set()
    for label in cleaned:
        if not label:
            raise InvalidArgumentError("a label is empty")
        if label in seen:
            raise InvalidArgumentError(f"the label {label!r} is given twice")
        seen.add(label)
    return cleaned


def _lines(path: Path, what: str) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"cannot read the {what}s file {path}: {exc}") from None
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    if not lines:
        raise InvalidArgumentError(f"the {what}s file {path} has no {what}s")
    return lines
