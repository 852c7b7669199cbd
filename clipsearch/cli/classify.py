"""``clipsearch classify``: zero-shot labels for an index's images (stored vectors) or for image files."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import TYPE_CHECKING

from retrieval.errors import InvalidArgumentError

from ._common import (
    add_device_arguments,
    add_filter_arguments,
    add_precision_argument,
    add_query_lang_argument,
    filter_from_args,
    positive_int,
    print_json,
)

if TYPE_CHECKING:
    from retrieval.tools.zeroshot import Prediction

    from ._common import Subparsers


def run(args: argparse.Namespace) -> int:
    """Classify; print each image's best labels, or ``{"labels", "results"}`` with ``--json``."""
    from collections.abc import Iterator

    from retrieval.encoders import load_encoder
    from retrieval.encoders.precision import parse_precision
    from retrieval.index import ImageIndex
    from retrieval.layout import is_index_dir
    from retrieval.tools.zeroshot import (
        ZeroShotClassifier,
        check_labels,
        classify_files,
        classify_index,
        read_labels,
        resolve_templates,
        top_labels,
        write_predictions,
    )

    # Inputs are checked before any model or index loads: mistakes fail fast.
    labels = check_labels([*args.label, *(read_labels(args.labels) if args.labels else [])])
    templates = resolve_templates(args.template, args.templates)
    where = filter_from_args(args)
    indexed = len(args.targets) == 1 and is_index_dir(args.targets[0])
    batches: Iterator[list[Prediction]]
    if indexed:
        index = ImageIndex.open(args.targets[0], model=args.model, device=args.device, precision=args.precision)
        classifier = ZeroShotClassifier.build(index.encoders.encoder, labels, templates, args.query_lang)
        batches = classify_index(index, classifier, where=where)
    else:
        if args.model is None:
            raise InvalidArgumentError(f"{args.targets[0]} is not an index: give one INDEX_DIR, or --model M and image files")
        if where.active:
            raise InvalidArgumentError("filters apply to an index, not to image files")
        precision = parse_precision(args.precision)
        encoder = load_encoder(args.model, device=args.device)
        encoder.text_precision.request(precision)  # the label prompts'; the image files stay fp32
        classifier = ZeroShotClassifier.build(encoder, labels, templates, args.query_lang)
        batches = classify_files(encoder, args.targets, classifier)
    top_k = min(args.top_k, len(labels))
    if args.out:
        predictions: list[Prediction] = []
        counts: Counter[str] = Counter()

        def keep(stream: Iterator[list[Prediction]]) -> Iterator[list[Prediction]]:
            for batch in stream:
                if args.json:
                    predictions.extend(batch)
                else:
                    counts.update(labels[int(p.scores.argmax())] for p in batch)
                yield batch

        rows = write_predictions(args.out, labels, keep(batches))
        if args.json:
            _print_json(labels, predictions, top_k)
        else:
            print(f"classified {rows} images among {len(labels)} labels -> {args.out}")
            for label, n in counts.most_common():
                print(f"  {n:>7}  {label}")
        return 0
    if args.json:
        _print_json(labels, [p for batch in batches for p in batch], top_k)
        return 0
    shown = 0
    for batch in batches:
        for p in batch:
            best = ", ".join(f"{name} {score:.3f}" for name, score in top_labels(p.scores[None], labels, top_k)[0])
            print(f"{p.path}  {best}")
            shown += 1
    if not shown:
        print("no images (none matches the filters)" if where.active else "no images (the index is empty)")
    return 0


def _print_json(labels: list[str], predictions: list[Prediction], top_k: int) -> None:
    print_json({"labels": labels, "results": [p.to_dict(labels, top_k) for p in predictions]})


def register(subparsers: Subparsers) -> None:
    """Add ``classify`` to the ``clipsearch`` sub-parsers."""
    p = subparsers.add_parser(
        "classify",
        help="zero-shot classification of an index's images or of image files",
        description="Zero-shot classification: score each image against text labels, as CLIP's zero-shot recipe "
        "does (softmax over the labels of exp(logit_scale) * cosine). With one INDEX_DIR the stored embeddings "
        "are used (nothing is decoded again); with --model M, the given image files are embedded.",
    )
    p.add_argument("targets", metavar="INDEX_DIR|IMAGE", nargs="+", help="one index directory, or image files (with --model)")
    p.add_argument("--label", action="append", default=[], metavar="NAME", help="a label (repeatable)")
    add_precision_argument(p, "auto", "text tower precision of the label prompts")
    p.add_argument("--labels", metavar="FILE", help="a file of labels, one per line")
    p.add_argument("--template", metavar="TEXT", help='one prompt template with {} for the label (default: "a photo of a {}.")')
    p.add_argument(
        "--templates", metavar="SET|FILE",
        help="ensemble a template set: openai (OpenAI's 80 ImageNet prompts), simple (7) or a file, one template per line",
    )
    add_query_lang_argument(p, "the labels and template")
    p.add_argument("--top-k", type=positive_int, default=5, help="labels shown per image (default: 5)")
    p.add_argument("--model", help="model for image files; with an index, a query model with the same weights")
    add_device_arguments(p)
    add_filter_arguments(p)
    p.add_argument("--out", metavar="FILE.parquet", help="also write id, path, label, score and all scores as Parquet")
    p.add_argument("--json", action="store_true", help='print {"labels", "results": [{"id", "path", "labels": [{"label", "score"}]}]}')
    p.set_defaults(handler=run)
