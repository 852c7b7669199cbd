"""The vectors of recent query texts, so that a repeated query skips the text tower.

A server sees the same texts again (a results page reloaded, the next page of results, the
same query on several indexes of one model): each costs a text-tower pass that a lookup
replaces. :class:`QueryVectorCache` keeps the vectors of the ``capacity`` most recently used
distinct texts (least recently used first out). It belongs to one text encoder:
:class:`~retrieval.encoders.query.QueryEncoders` holds one per index and passes it on to the
next generation only when it passes on the encoder itself.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .errors import InvalidArgumentError

DEFAULT_CAPACITY = 1024


class QueryVectorCache:
    """An LRU map from query text to its L2-normalised vector; thread-safe.

    Args:
        capacity: distinct texts kept (0 turns the cache off: every call embeds).

    Raises:
        InvalidArgumentError: a negative capacity.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 0:
            raise InvalidArgumentError(f"query cache capacity must be an integer >= 0, got {capacity!r}")
        self.capacity = capacity
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def embed(self, texts: Sequence[str], embed: Callable[[list[str]], np.ndarray], *, namespace: str = "") -> np.ndarray:
        """``(len(texts), dim)`` vectors: cached ones looked up, the others embedded with
        ``embed`` (one call for all distinct misses, outside the lock) and kept.

        ``namespace`` keeps apart texts whose vectors differ by something besides the text (the
        query language a tokenizer is told): the same text in two namespaces is two entries.
        """
        if self.capacity == 0 or not texts:
            return embed(list(texts))
        keyed = [f"{namespace}\0{t}" if namespace else t for t in texts]
        found: dict[str, np.ndarray] = {}
        with self._lock:
            for text in keyed:
                vector = self._vectors.get(text)
                if vector is not None:
                    self._vectors.move_to_end(text)
                    found[text] = vector
        missing_texts = list(dict.fromkeys(t for t, key in zip(texts, keyed, strict=True) if key not in found))
        missing = [f"{namespace}\0{t}" if namespace else t for t in missing_texts]
        missed = set(missing)
        if missing:
            for text, vector in zip(missing, embed(missing_texts), strict=True):
                found[text] = vector
        with self._lock:
            misses = sum(1 for t in keyed if t in missed)
            self.hits += len(keyed) - misses
            self.misses += misses
            for text in missing:
                vector = found[text].copy()
                vector.flags.writeable = False  # shared by every later hit
                self._vectors[text] = vector
                self._vectors.move_to_end(text)
            while len(self._vectors) > self.capacity:
                self._vectors.popitem(last=False)
        return np.stack([found[t] for t in keyed]).astype(np.float32, copy=False)

    def info(self) -> dict[str, Any]:
        """``capacity``, ``size`` (texts held), ``hits`` and ``misses`` so far."""
        with self._lock:
            return {"capacity": self.capacity, "size": len(self._vectors), "hits": self.hits, "misses": self.misses}


__all__ = ["DEFAULT_CAPACITY", "QueryVectorCache"]
