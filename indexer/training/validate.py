"""Held-out text-to-image retrieval during training, with the metric code of ``clipsearch eval``.

The held-out pairs become an in-memory index and its queries exactly as ``clipsearch eval``
would see them with a queries file written for those images: every distinct image once, one
query per distinct caption (captions equal character for character are merged, like
``data/demo/queries.jsonl``), relevant = the images with that caption. Ranks come from
:func:`retrieval.tools.evaluation.ranking.exact_ranks` over the L2-normalised embeddings, and MRR, Recall@K
and their chance levels from :mod:`retrieval.tools.evaluation.metrics`, so the numbers printed while training
match ``clipsearch eval`` on an index of the same images (up to the last bits of the
embeddings).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from retrieval.encoders import l2_normalize
from retrieval.errors import InvalidArgumentError
from retrieval.tools.evaluation import metrics
from retrieval.tools.evaluation.ranking import exact_ranks

from .contrastive import encode_images, encode_texts

if TYPE_CHECKING:
    import torch

DEFAULT_KS: tuple[int, ...] = (1, 5, 10)
_EMBED_BATCH = 256


@dataclass(frozen=True)
class RetrievalMetrics:
    """MRR and Recall@K (fractions), as ``clipsearch eval`` reports them."""

    mrr: float
    recall: dict[int, float]

    def to_dict(self) -> dict[str, float]:
        return {"mrr": self.mrr, **{f"recall@{k}": v for k, v in self.recall.items()}}


@dataclass(frozen=True)
class ValidationSet:
    """Held-out images (preprocessed, no augmentation) and the caption queries over them.

    Attributes:
        files: the distinct image files, in first-seen order (index = id).
        pixels: float32 ``(len(files), 3, h, w)``.
        queries: distinct captions, in first-seen order.
        relevant: per query, the ids of the images with that caption.
    """

    files: tuple[Path, ...]
    pixels: torch.Tensor
    queries: tuple[str, ...]
    relevant: tuple[np.ndarray, ...]

    def chance(self, ks: Sequence[int] = DEFAULT_KS) -> RetrievalMetrics:
        """Exact expected metrics of a uniformly random ranking, averaged over the queries."""
        n = len(self.files)
        sizes = [len(r) for r in self.relevant]
        return RetrievalMetrics(
            mrr=float(np.mean([metrics.expected_random_mrr(n, r) for r in sizes])),
            recall={k: float(np.mean([metrics.expected_random_recall(n, r, k) for r in sizes])) for k in ks},
        )


def build_validation_set(files: Sequence[Path], captions: Sequence[str], pixels: Sequence[torch.Tensor]) -> ValidationSet:
    """Group held-out pairs into distinct images and distinct-caption queries.

    Args:
        files, captions, pixels: one entry per usable pair (``pixels[i]`` is the
            preprocessed image of ``files[i]``; repeated files have equal pixels).

    Raises:
        InvalidArgumentError: no pairs, or fewer than 2 distinct images (nothing to rank).
    """
    import torch

    if not files:
        raise InvalidArgumentError("the validation set holds no usable pair")
    ids: dict[Path, int] = {}
    kept: list[torch.Tensor] = []
    by_caption: dict[str, list[int]] = {}
    for file, caption, pix in zip(files, captions, pixels, strict=True):
        if file not in ids:
            ids[file] = len(ids)
            kept.append(pix)
        members = by_caption.setdefault(caption, [])
        if ids[file] not in members:
            members.append(ids[file])
    if len(ids) < 2:
        raise InvalidArgumentError("the validation set needs at least 2 distinct images to rank")
    return ValidationSet(
        files=tuple(ids),
        pixels=torch.stack(kept),
        queries=tuple(by_caption),
        relevant=tuple(np.asarray(v, dtype=np.int64) for v in by_caption.values()),
    )


def embed_validation_set(model: Any, tokenizer: Any, vset: ValidationSet, max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """L2-normalised float32 ``(images, queries)`` embeddings, in eval mode, no augmentation.

    Texts are tokenized like ``HFClipEncoder.tokenize`` (pad to the longest, truncate at the
    model's context length).
    """
    import torch

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            images = [
                encode_images(model, vset.pixels[s : s + _EMBED_BATCH].to(device)).float().cpu().numpy()
                for s in range(0, len(vset.files), _EMBED_BATCH)
            ]
            texts = []
            for s in range(0, len(vset.queries), _EMBED_BATCH):
                tok = tokenizer(
                    list(vset.queries[s : s + _EMBED_BATCH]),
                    padding=True,
                    truncation=True,
                    max_length=max_length,
                    return_tensors="pt",
                )
                emb = encode_texts(model, tok["input_ids"].to(device), tok["attention_mask"].to(device))
                texts.append(emb.float().cpu().numpy())
    finally:
        model.train(was_training)
    return l2_normalize(np.concatenate(images)), l2_normalize(np.concatenate(texts))


def retrieval_metrics(
    image_embeds: np.ndarray, query_embeds: np.ndarray, relevant: Sequence[np.ndarray], ks: Sequence[int] = DEFAULT_KS
) -> RetrievalMetrics:
    """Exact text-to-image ranks (``clipsearch eval``'s ranking) -> MRR and Recall@K."""
    count = len(image_embeds)

    def source(rows: int) -> Iterator[tuple[int, np.ndarray]]:
        for start in range(0, count, rows):
            yield start, image_embeds[start : start + rows]

    ranks, _, _ = exact_ranks(source, count, query_embeds, list(relevant), top_n=1)
    first = np.array([r.min() for r in ranks])
    return RetrievalMetrics(mrr=metrics.mrr(first), recall={k: metrics.recall_at_k(first, k) for k in ks})


def evaluate_model(model: Any, tokenizer: Any, vset: ValidationSet, max_length: int, ks: Sequence[int] = DEFAULT_KS) -> RetrievalMetrics:
    """Embed the validation set with ``model`` and measure text-to-image retrieval."""
    images, queries = embed_validation_set(model, tokenizer, vset, max_length)
    return retrieval_metrics(images, queries, vset.relevant, ks)
