"""``clipsearch search``: the closest images to a text or an image query (over HTTP: :mod:`clipsearch.server.search`)."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from retrieval.errors import InvalidArgumentError

from ..search_params import ARITHMETIC, SearchParams
from ._common import (
    add_device_arguments,
    add_filter_arguments,
    add_precision_argument,
    filter_from_args,
    open_searchable,
    print_json,
)
from .options import add_options

if TYPE_CHECKING:
    from retrieval.hits import Hit
    from retrieval.request import SearchRequest

    from ._common import Subparsers

_TERMS_ON_THE_CLI = (
    "A TERM is text, or an image file when it starts with ./ ../ / ~/ or file://; 'N:' before it is its "
    "weight (default 1), e.g. --add '0.5:./beach.jpg'. With --add or --subtract the QUERY takes a weight too."
)


def run(args: argparse.Namespace) -> int:
    """Search the index or shard set; print one line per hit, or ``{"results": [...]}`` with
    ``--json`` (a set's results also say ``partial`` and ``missing_shards``)."""
    from retrieval.partitions import coverage

    # Checked before the index and the model load: a bad query, cut-off or term fails at once.
    req = _request(args)
    # One process, one search: auto's text tower weighs int8's set-up against the texts it embeds.
    texts = sum(t.kind == "text" for t in req.terms) if req.terms else int(req.text is not None)
    index = open_searchable(args.index_dir, model=args.model, device=args.device, precision=args.precision, text_queries=texts)
    hits = index.search(req)
    shards = coverage(hits)
    if args.json:
        print_json({"results": [h.to_dict(facts=True) for h in hits], **(shards or {})})
    else:
        if shards and shards["partial"]:
            print(f"partial: shard(s) {', '.join(shards['missing_shards'])} did not answer in time")
        if not hits:
            print(_why_none(args, req.where is not None and req.where.active))
        browsing = req.kind == "browse"
        for rank, hit in enumerate(hits, 1):
            taken = f"  {hit.taken or 'undated'}" if args.sort == "taken" or browsing else ""
            score = "     -" if hit.score is None else f"{hit.score:.4f}"
            print(f"{rank:>3}  {score}  {hit.path}{_moment(hit)}{taken}{_why(hit)}{_who(hit)}")
    return 0


def _request(args: argparse.Namespace) -> SearchRequest:
    # The command line as the library's one checked request.
    from retrieval.query_terms import QueryTerm, parse_term
    from retrieval.request import SearchRequest

    if args.query is not None and args.image is not None:
        raise InvalidArgumentError("give either a text query or --image, not both")
    where = filter_from_args(args)
    search = {"k": args.k, "where": where, "min_score": args.min_score, "sort": args.sort,
              "mode": args.mode, "query_lang": args.query_lang}
    if args.query is None and args.image is None and not args.add:
        if not where.active:
            raise InvalidArgumentError("give a text query, --image PATH or --add TERM (or a filter such as --person NAME to list)")
        return SearchRequest(**search)
    if args.add or args.subtract:
        # The QUERY takes an N: weight here; a missing image or a zero weight fails at once.
        first = [parse_term(args.query)] if args.query is not None else []
        if args.image is not None:
            first = [QueryTerm(args.image, "image")]
        add = first + [parse_term(t) for t in args.add]
        return SearchRequest(add=add, subtract=[parse_term(t) for t in args.subtract], **search)
    if args.image is not None:
        return SearchRequest(image=args.image, **search)
    return SearchRequest(text=args.query, **search)


def _why(hit: Hit) -> str:
    # What put a hit where it is, beside its cosine: the words its text matched, and in a
    # fused list the share of the query's words and the fused score it was ordered by.
    words = "; ".join(f"{source}: {', '.join(found)}" for source, found in (hit.matched or {}).items())
    parts = [words] if words else []
    if hit.keyword is not None:
        parts.append(f"words {hit.keyword:.2f}" + (f", fused {hit.fused:.2f}" if hit.fused is not None else ""))
    return f"  [{' | '.join(parts)}]" if parts else ""


def _moment(hit: Hit) -> str:
    # A video's hit: its best moment as people write times (clip.mp4 01:23-01:31), then its best frame's.
    if hit.media != "video" or hit.start is None or hit.end is None:
        return ""
    from retrieval.moments import clock

    more = f", {len(hit.moments) - 1} more" if hit.moments and len(hit.moments) > 1 else ""
    best = f"  (best {clock(hit.frame_time)}{more})" if hit.frame_time is not None else ""
    return f" {clock(hit.start)}-{clock(math.ceil(hit.end))}{best}"


def _who(hit: Hit) -> str:
    # "Who is in this photo": the people of its faces, in an index built with --faces.
    return f"  (with {', '.join(hit.people)})" if hit.people else ""


def _why_none(args: argparse.Namespace, filtered: bool) -> str:
    if args.mode == "keyword":
        return "no results (no image's text matches the query's words)"
    if args.min_score is not None:
        return f"no results (no image{' passing the filters' if filtered else ''} scores at least {args.min_score})"
    return "no results (no image matches the filters)" if filtered else "no results (the index is empty)"


def register(subparsers: Subparsers) -> None:
    """Add ``search`` to the ``clipsearch`` sub-parsers."""
    p = subparsers.add_parser("search", help="search an index by text or by image", description="Search an index by text or by image.")
    p.add_argument("index_dir", metavar="INDEX_DIR")
    p.add_argument("query", metavar="QUERY", nargs="?",
                   help="text query (none: the images the filters keep, newest first, e.g. --person Alice)")
    p.add_argument("--image", metavar="PATH", help="search with this image instead of text")
    # -k, --add, --subtract: the search parameters the CLI takes, from their one declaration.
    add_options(p, SearchParams, descriptions={ARITHMETIC: _TERMS_ON_THE_CLI})
    # No -k: 10 results, or with --min-score every result scoring at least S (the library's rule).
    p.set_defaults(k=None)
    p.add_argument("--model", help="query model (default: the one recorded in the index; must be the same weights)")
    add_device_arguments(p)
    add_precision_argument(p, "auto", "text query tower precision (image queries use the index's mode)")
    add_filter_arguments(p)
    p.add_argument(
        "--json", action="store_true",
        help='print {"results": [{"id", "path", "score", "taken", "camera", "gps", "matched", "ocr_text"; "keyword" and '
        '"fused" (hybrid and keyword modes); "caption", "url" (images from shards); "faces" (an index built with '
        '--faces: box, person, name); "media", "start", "end", "frame_time", "moments" (videos)}, ...]}; without a '
        'query "score" is null',
    )
    p.set_defaults(handler=run)
