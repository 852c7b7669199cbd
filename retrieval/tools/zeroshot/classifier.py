"""The zero-shot classifier: one unit vector per label, and how image vectors become scores.

As the reference does it (open_clip's ``build_zero_shot_classifier``, Hugging Face's
zero-shot image classification): each label's prompts are embedded and L2-normalised, their
mean re-normalised is the label's vector; an image's logits are ``exp(logit_scale) * image @
labels.T`` (plus the logit bias of SigLIP-style models), turned into scores by a softmax over
the labels (a sigmoid per label where the model has a bias).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...encoders.languages import language_embedder
from ...errors import InvalidArgumentError
from .templates import check_labels, check_template

if TYPE_CHECKING:
    from ...encoders import Encoder


@dataclass(frozen=True)
class ZeroShotClassifier:
    """Labels, their ``(n_labels, dim)`` unit vectors and the model's logit scale and bias."""

    labels: tuple[str, ...]
    templates: tuple[str, ...]
    weights: np.ndarray
    scale: float
    bias: float | None = None

    @classmethod
    def build(cls, encoder: Encoder, labels: Sequence[str], templates: Sequence[str], query_lang: str | None = None) -> ZeroShotClassifier:
        """Embed every ``template.format(label)`` with ``encoder``'s text tower and ensemble them.

        ``query_lang``: the prompts' FLORES-200 code, for a model whose tokenizer needs one
        (NLLB-CLIP); ignored by the others.

        Raises:
            InvalidArgumentError: no labels, an empty or duplicate label, a template without
                ``{}``, a missing or unknown language where the model needs one.
        """
        names = tuple(check_labels(list(labels)))
        prompts = tuple(check_template(t) for t in templates)
        if not prompts:
            raise InvalidArgumentError("no templates")
        texts = [t.format(label) for label in names for t in prompts]
        vectors = language_embedder(encoder, query_lang)[1](texts)  # batched by the encoder itself
        scale, bias = encoder.logit_params()
        return cls(names, prompts, ensemble(vectors.reshape(len(names), len(prompts), -1)), scale, bias)

    @property
    def multi_label(self) -> bool:
        """True for sigmoid scores (SigLIP-style): each label's score stands alone."""
        return self.bias is not None

    def logits(self, images: np.ndarray) -> np.ndarray:
        """``(n, n_labels)`` logits of L2-normalised image vectors ``(n, dim)``."""
        images = np.asarray(images, dtype=np.float32)
        if images.ndim != 2 or images.shape[1] != self.weights.shape[1]:
            raise InvalidArgumentError(f"image vectors must have shape (n, {self.weights.shape[1]}), got {images.shape}")
        out = self.scale * (images.astype(np.float64) @ self.weights.T.astype(np.float64))
        return out + self.bias if self.bias is not None else out

    def scores(self, images: np.ndarray) -> np.ndarray:
        """``(n, n_labels)`` float32 scores: softmax over the labels, or a sigmoid per label."""
        logits = self.logits(images)
        if self.bias is not None:
            return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def ensemble(vectors: np.ndarray) -> np.ndarray:
    """``(n_labels, n_templates, dim)`` prompt vectors -> ``(n_labels, dim)``: each prompt
    normalised, averaged per label, the mean normalised again (open_clip's recipe)."""
    vectors = np.asarray(vectors, dtype=np.float64)
    unit = vectors / np.linalg.norm(vectors, axis=2, keepdims=True)
    mean = unit.mean(axis=1)
    return (mean / np.linalg.norm(mean, axis=1, keepdims=True)).astype(np.float32)


def top_labels(scores: np.ndarray, labels: Sequence[str], k: int) -> list[list[tuple[str, float]]]:
    """Per row, the ``k`` best ``(label, score)`` by descending score (ties by label order)."""
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return [[(labels[j], float(row[j])) for j in idx] for row, idx in zip(scores, order, strict=True)]


__all__ = ["ZeroShotClassifier", "ensemble", "top_labels"]
