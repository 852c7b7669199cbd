"""Single byte ranges (RFC 9110, 14) of an original that is no file on disk: an image held in
memory, or a video of a WebDataset shard read range by range, which a browser's ``<video>`` asks
for piece by piece to seek in it.

A file on disk gets Starlette's ``FileResponse``, which answers ranges itself; this is the same
answer for bytes: 206 with ``Content-Range`` for one satisfiable range, 416 for an
unsatisfiable one, and the whole content (200) for a header it does not read (several ranges,
another unit), as the RFC lets a server do. A range read from a shard holds at most
:data:`RANGE_LIMIT` bytes: a ``<video>`` asks ``bytes=N-`` (all the rest) at each seek, and the
RFC lets a server send less than asked (the client asks again from where the answer ends).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from starlette.responses import Response

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
# The most bytes of a shard's video one 206 holds (the rest of a long range is asked for again).
RANGE_LIMIT = 8 << 20


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
    return ranged_read(len(data), lambda start, end: data[start:end + 1], range_header, media_type, headers)


def ranged_read(size: int, read: Callable[[int, int], bytes], range_header: str | None, media_type: str,
                headers: Mapping[str, str], *, head: bool = False, limit: int | None = None) -> Response:
    """The answer to a GET (or, ``head``, a HEAD: nothing read) with ``range_header`` of ``size``
    bytes that ``read(first, last)`` reads: only the range asked, at most ``limit`` bytes of it."""
    common = {**headers, "Accept-Ranges": "bytes"}
    span = byte_range(range_header, size)
    if span is False:
        return Response(status_code=416, headers={**common, "Content-Range": f"bytes */{size}"})
    if span is None or span is True:
        if head:
            return Response(media_type=media_type, headers={**common, "Content-Length": str(size)})
        return Response(read(0, size - 1) if size else b"", media_type=media_type, headers=common)
    start, end = span
    if limit is not None:
        end = min(end, start + limit - 1)
    common["Content-Range"] = f"bytes {start}-{end}/{size}"
    if head:
        return Response(status_code=206, media_type=media_type, headers={**common, "Content-Length": str(end + 1 - start)})
    return Response(read(start, end), status_code=206, media_type=media_type, headers=common)


__all__ = ["RANGE_LIMIT", "byte_range", "ranged", "ranged_read"]
