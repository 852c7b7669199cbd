"""FAISS: build, write, read, search and tune. The only package that imports faiss.

Small modules of functions over numpy arrays and FAISS objects, by job:

- :mod:`.structure`: an index's parts (IVF, HNSW, refine stage) and the vectors it holds;
- :mod:`.building`: create from a factory string, train, reserve, add;
- :mod:`.io`: write, and read into memory or memory-mapped;
- :mod:`.refine_stream`: a re-ranked index's file written and extended with its refine vectors streamed;
- :mod:`.pagecache`: warming a memory-mapped index, ``madvise``, the memory available;
- :mod:`.searching`: search parameters, filtered top-k, range search;
- :mod:`.exact`: exact top-k and recall@k;
- :mod:`.tuning`: the cheapest search parameters reaching a recall target.

Vectors are L2-normalised float32 and searched by inner product, so scores are cosines.
FAISS row i holds the image with id i; :mod:`retrieval.index` checks this on open.
"""

from __future__ import annotations

from .building import DEFAULT_INDEX_TYPE, QUANTIZER_ADD_EF, TRAIN_ITERATIONS, add, build, create, reserve, train, training_rows_needed
from .exact import ExactTopK, recall_at
from .io import read, write
from .pagecache import available_memory, warm
from .refine_stream import open_refined, refine_codes, streams_refine, streams_refine_file, write_refined
from .searching import range_search, search, set_search_params
from .structure import FaissIndex, kind_of, refine_of, stored_vectors
from .tuning import K_FACTORS, refine_cost, tunable, tune

__all__ = [
    "DEFAULT_INDEX_TYPE",
    "K_FACTORS",
    "QUANTIZER_ADD_EF",
    "TRAIN_ITERATIONS",
    "ExactTopK",
    "FaissIndex",
    "add",
    "available_memory",
    "build",
    "create",
    "kind_of",
    "open_refined",
    "range_search",
    "read",
    "recall_at",
    "refine_codes",
    "refine_cost",
    "refine_of",
    "reserve",
    "search",
    "set_search_params",
    "stored_vectors",
    "streams_refine",
    "streams_refine_file",
    "train",
    "training_rows_needed",
    "tunable",
    "tune",
    "warm",
    "write",
    "write_refined",
]
