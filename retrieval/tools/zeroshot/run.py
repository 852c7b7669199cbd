"""Zero-shot classification of an index's images (their stored vectors) or of image files."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import InvalidArgumentError
from ...images import DEFAULT_MAX_PIXELS, load_pixels
from .classifier import ZeroShotClassifier, top_labels

if TYPE_CHECKING:
    from ...encoders import Encoder
    from ...filters import Filter
    from ...index import ImageIndex

# Rows of stored vectors scored at a time: bounds memory on a large index.
DEFAULT_BATCH_ROWS = 65536


@dataclass(frozen=True)
class Prediction:
    """Scores of one image: ``id`` None for a file classified without an index."""

    id: int | None
    path: str
    scores: np.ndarray

    def to_dict(self, labels: Sequence[str], top_k: int) -> dict[str, Any]:
        best = top_labels(self.scores[None], labels, top_k)[0]
        return {"id": self.id, "path": self.path, "labels": [{"label": name, "score": score} for name, score in best]}


def classify_index(
    index: ImageIndex, classifier: ZeroShotClassifier, where: Filter | None = None, batch_rows: int = DEFAULT_BATCH_ROWS
) -> Iterator[list[Prediction]]:
    """Score the stored vectors of ``index`` (the images passing ``where``), in id order, in
    batches of at most ``batch_rows`` images; no image is decoded again.

    Raises:
        ModelMismatchError: the classifier's model is not the index's.
    """
    if classifier.weights.shape[1] != index.dim:
        raise InvalidArgumentError(f"the classifier has dim {classifier.weights.shape[1]}, the index {index.dim}")
    for ids, vectors in index.iter_vectors(where, batch_rows=batch_rows):
        scores = classifier.scores(vectors)
        yield [Prediction(int(i), p, s) for i, p, s in zip(ids, index.paths_of(ids), scores, strict=True)]


def classify_files(
    encoder: Encoder, files: Sequence[str | os.PathLike[str]], classifier: ZeroShotClassifier, batch_size: int = 32
) -> Iterator[list[Prediction]]:
    """Decode, embed and score image files (in batches, in the given order).

    Raises:
        ImageDecodeError: a file cannot be decoded.
    """
    import torch

    for start in range(0, len(files), batch_size):
        chunk = files[start : start + batch_size]
        pixels = torch.stack([load_pixels(f, encoder.preprocess, max_pixels=DEFAULT_MAX_PIXELS)[0] for f in chunk])
        scores = classifier.scores(encoder.embed_pixels(pixels))
        yield [Prediction(None, os.fspath(f), s) for f, s in zip(chunk, scores, strict=True)]


def write_predictions(path: str | os.PathLike[str], labels: Sequence[str], batches: Iterator[list[Prediction]]) -> int:
    """Write predictions as Parquet (``id``, ``path``, ``label``, ``score``, ``scores`` in label
    order), streamed batch by batch into a temporary file that replaces ``path`` at the end;
    returns the number of rows.

    Raises:
        InvalidArgumentError: ``path`` cannot be written (the previous file, if any, is kept).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field("path", pa.string(), nullable=False),
            pa.field("label", pa.string(), nullable=False),
            pa.field("score", pa.float32(), nullable=False),
            pa.field("scores", pa.list_(pa.float32(), len(labels)), nullable=False),
        ],
        metadata={b"labels": "\n".join(labels).encode()},
    )
    target = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot write {target}: {exc.strerror or exc}") from None
    os.close(fd)
    rows = 0
    try:
        with pq.ParquetWriter(tmp, schema) as writer:
            for batch in batches:
                scores = np.stack([p.scores for p in batch]).astype(np.float32)
                best = scores.argmax(axis=1)
                writer.write_table(
                    pa.table(
                        {
                            "id": pa.array([p.id for p in batch], pa.int64()),
                            "path": [p.path for p in batch],
                            "label": [labels[j] for j in best],
                            "score": scores[np.arange(len(batch)), best],
                            "scores": pa.FixedSizeListArray.from_arrays(pa.array(scores.reshape(-1)), len(labels)),
                        },
                        schema=schema,
                    )
                )
                rows += len(batch)
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise InvalidArgumentError(f"cannot write {target}: {exc.strerror or exc}") from None
        raise
    return rows


__all__ = ["DEFAULT_BATCH_ROWS", "Prediction", "classify_files", "classify_index", "write_predictions"]
