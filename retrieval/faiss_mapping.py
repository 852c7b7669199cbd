"""Whether a generation's FAISS file is memory-mapped or read into RAM, and why.

An index records how its FAISS index was planned (``index_options.max_memory``, the budget the
user gave; ``index_tuning.mapped_bytes``, what the plan leaves on disk to be mapped: the float16
vectors of a re-ranked index). A reader opens the file by that plan, so that the budget set when
building is the budget kept when searching:

- a plan that maps part of the file (a re-ranking stage) gets the file mapped: the re-ranking
  vectors are pages of the file, and so are the compact codes, which queries fault in (and
  ``ImageIndex.warm`` reads ahead) without adding anonymous memory;
- a file larger than the recorded ``max_memory`` is mapped, never read whole into RAM;
- any other file the plan keeps resident is read into RAM;
- an index that records no budget maps files of :data:`MMAP_MIN_BYTES` and more.

``mmap=True`` or ``False`` given to ``ImageIndex.open`` overrides the plan. A file that lacks
rows of the generation (a build committed part-way) is always read: the missing rows are added
to it in memory, and a mapped index is read-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .layout import Manifest

# Without a recorded budget, FAISS files at least this big are memory-mapped: opening costs no
# RAM and no read of the whole file; the OS pages in what searches touch.
MMAP_MIN_BYTES = 1 << 30


def format_bytes(n: int) -> str:
    """1536 -> '1.5 KB' (binary units, as ``--max-memory`` reads them)."""
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"


@dataclass(frozen=True)
class FaissMapping:
    """How a generation's FAISS file is opened.

    Attributes:
        mmap: True when the file is memory-mapped, False when it is read into RAM (or absent).
        reason: why, in a few words (``info`` prints it as ``faiss_mmap_reason``).
    """

    mmap: bool
    reason: str


def _positive_int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def plan_mapping(manifest: Manifest, file_bytes: int, asked: bool | None = None) -> FaissMapping:
    """How the FAISS file of ``manifest`` (``file_bytes`` long) is opened.

    Args:
        manifest: the generation's manifest (its recorded options and tuning).
        file_bytes: the FAISS file's size.
        asked: ``mmap`` as given to ``ImageIndex.open``; None follows the plan.
    """
    ref = manifest.faiss
    if ref is None:
        return FaissMapping(False, "no FAISS file yet: an exact index is built in memory from the stored vectors")
    if ref.rows != manifest.count:
        return FaissMapping(
            False, f"the file covers {ref.rows} of {manifest.count} rows: read, and the rest added in memory"
        )
    if asked is not None:
        return FaissMapping(asked, f"mmap={asked} asked for")
    size = format_bytes(file_bytes)
    mapped = _positive_int(manifest.index_tuning.get("mapped_bytes"))
    if mapped:
        return FaissMapping(True, f"the plan maps its re-ranking vectors ({format_bytes(mapped)}); codes paged in as queries touch them")
    budget = _positive_int(manifest.index_options.get("max_memory"))
    if budget and file_bytes > budget:
        return FaissMapping(True, f"the file ({size}) is larger than the recorded max_memory ({format_bytes(budget)})")
    if budget:
        return FaissMapping(False, f"the plan keeps it in RAM: the file ({size}) fits the recorded max_memory ({format_bytes(budget)})")
    if file_bytes >= MMAP_MIN_BYTES:
        return FaissMapping(True, f"no recorded max_memory; files of {format_bytes(MMAP_MIN_BYTES)} and more are mapped")
    return FaissMapping(False, f"no recorded max_memory; files under {format_bytes(MMAP_MIN_BYTES)} are read")


__all__ = ["MMAP_MIN_BYTES", "FaissMapping", "plan_mapping"]
