"""clip-retrieval's clip-back API, the request side: a ``/knn-service`` or ``/metadata`` JSON
body checked and turned into our own :class:`~clipsearch.server.search.ApiSearch`, and the
answer shaped as clip-back shapes it (near-duplicates dropped as clip-back drops them).

Pure functions: the routes (:mod:`clipsearch.server.clip_back`) read the body, call these, run
the search through :func:`~clipsearch.server.search.find_hits` and serialise.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import numpy as np

from retrieval.duplicates import components
from retrieval.errors import InvalidArgumentError
from retrieval.index import Hit, ImageIndex
from retrieval.request import SearchRequest

from ..search_params import MAX_DEPTH
from .search import ApiSearch, unit_vector

# clip-back's near-duplicate threshold: results whose embeddings have an inner product above it
# with a higher-ranked result are dropped (KnnService.get_non_uniques).
DEDUP_THRESHOLD = 0.94
# The options clip-retrieval's clients send that change nothing here (no safety model, violence
# detector or aesthetic embeddings): accepted, named in this response header, not applied.
IGNORED_HEADER = "X-Clipsearch-Ignored"
IGNORED_OPTIONS = ("use_safety_model", "use_violence_detector", "aesthetic_score", "aesthetic_weight")
# Rows of the similarity matrix computed at once while deduplicating (a block times the results).
_DEDUP_BLOCK = 512
_MAX_VECTOR_LEN = 16384


@dataclass(frozen=True)
class KnnQuery:
    """One checked ``/knn-service`` body: the search, and how much of its answer to shape."""

    indice_name: str
    kind: str
    num_images: int
    num_result_ids: int
    deduplicate: bool
    text: str | None = None
    image: bytes | None = None
    image_url: str | None = None
    vector: tuple[float, ...] | None = None
    # The ignored options the caller asked for (sent with a value that would have an effect).
    ignored: tuple[str, ...] = ()

    def search_request(self, image: bytes | None = None) -> ApiSearch:
        """Our search of this query, ``num_result_ids`` deep (``image``: a fetched image_url).

        Raises:
            InvalidArgumentError: what :class:`~retrieval.request.SearchRequest` refuses.
        """
        kind = "image" if self.kind == "image_url" else self.kind
        data = image if image is not None else self.image
        upload = None
        if data is not None:
            upload = io.BytesIO(data)
            upload.name = "upload"  # how decoding errors name it (instead of '<stream>')
        search = SearchRequest(
            text=self.text,
            image=upload,
            vector=unit_vector(self.vector) if self.vector is not None else None,
            k=self.num_result_ids,
            mode="vector",  # clip-back is a k-NN service: its clients get the vector ranking
        )
        return ApiSearch(kind=kind, search=search, k=self.num_result_ids, offset=0, index=self.indice_name)  # type: ignore[arg-type]


def json_object(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body, whatever its content type (clip-front posts
    ``text/plain``, as clip-back reads any body as JSON).

    Raises:
        InvalidArgumentError: malformed JSON, or a value that is not an object.
    """
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"the body must be a JSON object, not {type(data).__name__}")
    return data


def _count(data: Mapping[str, Any], name: str, default: int | None) -> int:
    value = data.get(name)
    if value is None:
        if default is None:
            raise InvalidArgumentError(f"{name} is required (1 to {MAX_DEPTH})")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DEPTH:
        raise InvalidArgumentError(f"{name} must be an integer from 1 to {MAX_DEPTH}, got {value!r}")
    return value


def _flag(data: Mapping[str, Any], name: str) -> bool:
    value = data.get(name)
    if value is None:
        return False
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise InvalidArgumentError(f"{name} must be true or false, got {value!r}")


def _ignored(data: Mapping[str, Any]) -> tuple[str, ...]:
    asked = []
    for name in IGNORED_OPTIONS:
        value = data.get(name)
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise InvalidArgumentError(f"{name} must be a number, a string or a boolean, got {type(value).__name__}")
        if value not in (None, False, ""):
            asked.append(name)
    return tuple(asked)


def _image(value: Any) -> bytes:
    if not isinstance(value, str):
        raise InvalidArgumentError(f"image must be a base64 string, not {type(value).__name__}")
    text = value.split(",", 1)[1] if value.startswith("data:") and "," in value else value
    try:
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgumentError("image is not valid base64") from None
    if not data:
        raise InvalidArgumentError("image is empty")
    return data


def _vector(value: Any) -> tuple[float, ...]:
    if not isinstance(value, list) or not value or len(value) > _MAX_VECTOR_LEN:
        raise InvalidArgumentError(f"embedding_input must be a non-empty list of at most {_MAX_VECTOR_LEN} numbers")
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value):
        raise InvalidArgumentError("embedding_input must hold numbers only")
    if not all(math.isfinite(v) for v in value):
        raise InvalidArgumentError("embedding_input must hold finite numbers")
    return tuple(float(v) for v in value)


def parse_knn(data: Mapping[str, Any]) -> KnnQuery:
    """A ``/knn-service`` body as a :class:`KnnQuery`.

    The query is the first given of ``text``, ``image``, ``image_url``, ``embedding_input``
    (clip-back's order; an empty string counts as absent). ``num_result_ids`` defaults to
    ``num_images``.

    Raises:
        InvalidArgumentError: a missing ``indice_name`` or ``num_images``, a count out of
            1..10,000, no query, bad base64 or vector values, ``use_mclip: true``, a modality
            other than ``image`` (``text`` searches caption embeddings, which no index here has).
    """
    name = data.get("indice_name")
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError("indice_name is required: the index to search (GET /indices-list names them)")
    num_images = _count(data, "num_images", None)
    num_result_ids = _count(data, "num_result_ids", num_images)
    if _flag(data, "use_mclip"):
        raise InvalidArgumentError("use_mclip is not supported: the index's own model encodes the text (send use_mclip: false)")
    modality = data.get("modality", "image")
    if modality == "text":
        raise InvalidArgumentError(
            f"modality 'text' searches caption embeddings, and index {name!r} has none; use modality 'image'"
        )
    if modality not in (None, "image"):
        raise InvalidArgumentError(f"modality must be 'image' (or 'text'), got {modality!r}")
    common: dict[str, Any] = {
        "indice_name": name,
        "num_images": num_images,
        "num_result_ids": num_result_ids,
        "deduplicate": _flag(data, "deduplicate"),
        "ignored": _ignored(data),
    }
    text = data.get("text")
    if text is not None and not isinstance(text, str):
        raise InvalidArgumentError(f"text must be a string, not {type(text).__name__}")
    if text:
        return KnnQuery(kind="text", text=text, **common)
    if data.get("image") not in (None, ""):
        return KnnQuery(kind="image", image=_image(data["image"]), **common)
    url = data.get("image_url")
    if url not in (None, ""):
        if not isinstance(url, str):
            raise InvalidArgumentError(f"image_url must be a string, not {type(url).__name__}")
        return KnnQuery(kind="image_url", image_url=url, **common)
    if data.get("embedding_input") is not None:
        return KnnQuery(kind="vector", vector=_vector(data["embedding_input"]), **common)
    raise InvalidArgumentError("give one of text, image (base64), image_url, embedding_input")


def parse_ids(data: Mapping[str, Any], count: int) -> list[int]:
    """The ``ids`` of a ``/metadata`` body, each an id of an index of ``count`` images.

    Raises:
        InvalidArgumentError: not a list of at most 10,000 non-negative integers below ``count``.
    """
    ids = data.get("ids")
    if not isinstance(ids, list) or len(ids) > MAX_DEPTH:
        raise InvalidArgumentError(f"ids must be a list of at most {MAX_DEPTH} image ids")
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < count:
            raise InvalidArgumentError(f"ids must be image ids from 0 to {count - 1}, got {i!r}")
    return ids


def near_duplicates(vectors: np.ndarray, threshold: float = DEDUP_THRESHOLD) -> np.ndarray:
    """Which of ``vectors`` (in rank order) clip-back's ``deduplicate`` drops: those linked, by
    inner products above ``threshold`` (transitively), to a higher-ranked one. A boolean mask."""
    n = len(vectors)
    drop = np.zeros(n, dtype=bool)
    if n < 2:
        return drop
    raw = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(raw, axis=1, keepdims=True)
    unit = (raw / np.where(norms == 0, 1, norms)).astype(np.float32)
    firsts, seconds = [], []
    for start in range(0, n, _DEDUP_BLOCK):
        rows, cols = np.nonzero(unit[start : start + _DEDUP_BLOCK] @ unit.T > threshold)
        rows += start
        later = cols > rows
        firsts.append(rows[later])
        seconds.append(cols[later])
    for group in components(np.concatenate(firsts), np.concatenate(seconds)):
        drop[group[1:]] = True  # a group is sorted: its first member ranks highest and stays
    return drop


def metadata_of(index: ImageIndex, ids: Sequence[int], name: str, base_url: str) -> list[dict[str, Any]]:
    """clip-back's metadata of ``ids``: ``url`` and ``caption`` as clip-retrieval returns them
    for an image from a WebDataset shard (its source url and its ``.txt`` caption, stored when it
    was indexed), else ``url`` is this server's ``/api/images/{id}`` (absolute; none for an index
    imported from embeddings, which has no files to serve) and ``caption`` the image's relative
    path; and ``path``."""
    paths = index.metadata.paths_of(list(ids)) if ids else []
    samples = index.metadata.sample_meta(list(ids)) if ids else []
    quoted = quote(name, safe="")
    root = base_url.rstrip("/")
    out = []
    for i, p, sample in zip(ids, paths, samples, strict=True):
        meta: dict[str, Any] = {"caption": sample["caption"] if sample["caption"] is not None else p, "path": p}
        if sample["url"] is not None:
            meta["url"] = sample["url"]
        elif index.manifest.source_root:
            meta["url"] = f"{root}/api/images/{i}?index={quoted}"
        out.append(meta)
    return out


def knn_answer(index: ImageIndex, hits: list[Hit], query: KnnQuery, base_url: str) -> list[dict[str, Any]]:
    """The ``/knn-service`` answer: near-duplicates dropped when asked, then every hit as
    ``{metadata..., "id", "similarity"}`` (clip-back's order), metadata on the first
    ``num_images`` only, as clip-back answers (clip-front asks ``/metadata`` for the rest)."""
    if query.deduplicate and len(hits) > 1:
        drop = near_duplicates(index.vectors.vectors_of([h.id for h in hits]))
        hits = [h for h, gone in zip(hits, drop, strict=True) if not gone]
    head = hits[: query.num_images]
    metas = metadata_of(index, [h.id for h in head], query.indice_name, base_url)
    out: list[dict[str, Any]] = [{**m, "id": h.id, "similarity": h.score} for h, m in zip(head, metas, strict=True)]
    out.extend({"id": h.id, "similarity": h.score} for h in hits[query.num_images :])
    return out


__all__ = [
    "DEDUP_THRESHOLD",
    "IGNORED_HEADER",
    "IGNORED_OPTIONS",
    "KnnQuery",
    "json_object",
    "knn_answer",
    "metadata_of",
    "near_duplicates",
    "parse_ids",
    "parse_knn",
]
