"""``clipsearch eval-zeroshot``: zero-shot accuracy on an ImageFolder (FOLDER/<class>/<images>)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ._common import add_device_arguments, add_query_lang_argument, positive_int, print_json

if TYPE_CHECKING:
    from ._common import Subparsers


def run(args: argparse.Namespace) -> int:
    """Evaluate; print a table, or ``{"classes", "images", "skipped", "acc1", "acc5", ...}`` with ``--json``."""
    from retrieval.encoders import load_encoder
    from retrieval.tools.zeroshot import ImageFolder, evaluate_folder, resolve_templates

    templates = resolve_templates(args.template, args.templates)
    folder = ImageFolder.scan(args.folder)
    encoder = load_encoder(args.model, device=args.device)
    report = evaluate_folder(encoder, folder, templates, batch_size=args.batch_size, query_lang=args.query_lang)
    if args.json:
        print_json({**report.to_dict(), "labels": list(folder.labels)})
        return 0
    print(f"{report.images} images in {report.classes} classes ({report.skipped} skipped), {report.templates} template(s)")
    rows = [
        ("acc1", report.acc1),
        ("acc5", report.acc5),
        ("mean per-class recall", report.mean_per_class_recall),
        ("chance", report.chance),
    ]
    for name, value in rows:
        if value is not None:
            print(f"  {name:<22} {value:.4f}")
    return 0


def register(subparsers: Subparsers) -> None:
    """Add ``eval-zeroshot`` to the ``clipsearch`` sub-parsers."""
    p = subparsers.add_parser(
        "eval-zeroshot",
        help="zero-shot classification accuracy on FOLDER/<class>/<images>",
        description="Zero-shot accuracy on an ImageFolder layout: the class names are the sub-folder names "
        "(_ and - read as spaces); acc1, acc5 (5+ classes) and mean per-class recall as CLIP_benchmark defines them.",
    )
    p.add_argument("folder", metavar="IMAGE_FOLDER")
    p.add_argument("--model", required=True, help="hub id or local checkpoint directory (HF CLIP or open_clip)")
    p.add_argument("--template", metavar="TEXT", help='one prompt template with {} (default: "a photo of a {}.")')
    p.add_argument("--templates", metavar="SET|FILE", help="openai (80 prompts), simple (7) or a file of templates")
    p.add_argument("--batch-size", type=positive_int, default=32, help="images per model batch (default: 32)")
    add_device_arguments(p)
    add_query_lang_argument(p, "the class names and templates")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)
