"""Single byte ranges (RFC 9110, 14) of an original held in memory: a video or image read out of
its WebDataset shard, which a browser's ``<video>`` asks for piece by piece to seek in it.

A file on disk gets Starlette's ``FileResponse``, which answers ranges itself; this is the same
answer for bytes: 206 with ``Content-Range`` for one satisfiable range, 416 for an
unsatisfiable one, and the whole content (200) for a header it does not read (several ranges,
another unit), as the RFC lets a server do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from starlette.responses import Response

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def byte_range(header: str | None, size: int) -> tuple[int, int] | None | bool:
    """The first and last byte a ``Range`` header asks of ``size`` bytes; None: answer the whole
    content; False: the range cannot be satisfied."""
    match = _RANGE.fullmatch(header.strip()) if header else None
    if match is None or (not match.group(1) and not match.group(2)):
        return None
    first, last = match.group(1), match.group(2)
    if not first:  # the last N bytes
        n = int(last)
        return (max(0, size - n), size - 1) if n > 0 and size > 0 else False
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size or (last and int(last) < start):
        return False
    return start, end


def ranged(data: bytes, range_header: str | None, media_type: str, headers: Mapping[str, str]) -> Response:
    """``data`` as the answer to a GET or HEAD with ``range_header`` (see the module docs)."""
    size = len(data)
    common = {**headers, "Accept-Ranges": "bytes"}
    span = byte_range(range_header, size)
    if span is False:
        return Response(status_code=416, headers={**common, "Content-Range": f"bytes */{size}"})
    if span is None or span is True:
        return Response(data, media_type=media_type, headers=common)
    start, end = span
    return Response(data[start:end + 1], status_code=206, media_type=media_type,
                    headers={**common, "Content-Range": f"bytes {start}-{end}/{size}"})


__all__ = ["byte_range", "ranged"]
