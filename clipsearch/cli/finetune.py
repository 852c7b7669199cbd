"""``clipsearch finetune``: the command-line face of :mod:`indexer.training.finetune`.

Numbers are parsed here and range-checked by :class:`~indexer.training.finetune.FinetuneConfig`, so a
bad value (``--lr 0``, ``--epochs 0``) is a one-line error with exit status 1 like any other
mistake. The progress table goes to stdout (to stderr with ``--json``, which keeps stdout for
the one JSON object); skipped pairs are reported on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

# The choices are needed for --help; these modules import torch only inside functions.
from indexer.training.contrastive import ACCUM_MODES, FREEZE_CHOICES
from indexer.training.train_state import SAVE_DTYPES

from ._common import PROG, add_device_arguments, print_json

if TYPE_CHECKING:
    from ._common import Subparsers


def _crop_scale(text: str) -> tuple[float, float]:
    """``0.7`` -> (0.7, 1.0); ``0.6,0.9`` -> (0.6, 0.9)."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN or MIN,MAX, got {text!r}") from None
    if len(values) == 1:
        values.append(1.0)
    if len(values) != 2:
        raise argparse.ArgumentTypeError(f"expected MIN or MIN,MAX, got {text!r}")
    return values[0], values[1]


def run(args: argparse.Namespace) -> int:
    """Train (or resume) and save the model; print the outcome, or one JSON object with ``--json``."""
    from indexer.training.augment import AugmentConfig
    from indexer.training.finetune import FinetuneConfig, finetune

    config = FinetuneConfig(
        data=args.data,
        out=args.out,
        model=args.model,
        from_config=args.from_config,
        val=args.val,
        images_root=args.images_root,
        epochs=args.epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        accum_mode=args.accum_mode,
        weight_decay=args.weight_decay,
        warmup_steps=args.warmup_steps,
        freeze=args.freeze,
        augment=AugmentConfig(enabled=not args.no_augment, min_scale=args.crop_scale[0], max_scale=args.crop_scale[1]),
        seed=args.seed,
        device=args.device,
        save_every=args.save_every,
        save_dtype=args.save_dtype,
        resume=args.resume,
        keep_checkpoint=args.keep_checkpoint,
        stop_after_steps=args.stop_after_steps,
    )
    table = sys.stderr if args.json else sys.stdout

    def log(line: str) -> None:
        print(line, file=table, flush=True)

    def warn(line: str) -> None:
        print(f"{PROG}: warning: {line}" if not line.startswith(" ") else line, file=sys.stderr, flush=True)

    report = finetune(config, log=log, warn=warn)
    if args.json:
        print_json(report.to_dict())
    elif report.finished:
        print(f"saved {report.out} ({report.steps} steps, {report.train_seconds:.1f} s of training)")
    else:
        print(f"stopped after step {report.steps} of {report.total_steps}; continue with --resume (checkpoint in {report.out}/checkpoint)")
    return 0


def _number(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """argparse type: ``kind(text)``, with a one-line message naming what was expected."""

    def parse(text: str) -> int | float:
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None

    return parse


def register(subparsers: Subparsers) -> None:
    """Add ``finetune`` to the ``clipsearch`` sub-parsers."""
    p = subparsers.add_parser(
        "finetune",
        help="fine-tune a CLIP model on image-caption pairs (or train a small one from scratch)",
        description=(
            'Contrastive fine-tuning of a Hugging Face CLIP checkpoint on a JSON Lines file of {"path": ..., "caption": ...} '
            "pairs. OUT becomes a standard Hugging Face checkpoint that `clipsearch index --model OUT` loads."
        ),
    )
    integer, number = _number(int), _number(float)
    p.add_argument("--data", required=True, metavar="PAIRS.jsonl", help='training pairs, one {"path", "caption"} object per line')
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (must be new or empty, unless --resume)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--model", metavar="BASE", help="base checkpoint: Hugging Face hub id or local directory")
    source.add_argument(
        "--from-config", metavar="SPEC",
        help="train from scratch: preset tiny|vit-b-32|vit-l-14, or a JSON file of RandomClipSpec fields",
    )
    p.add_argument(
        "--val", metavar="VAL.jsonl",
        help="held-out pairs: text-to-image MRR and Recall@1/5/10 before training and after each epoch",
    )
    p.add_argument("--images-root", metavar="DIR", help="directory image paths are relative to (default: each pairs file's directory)")
    p.add_argument("--epochs", type=integer, default=10, help="passes over the training pairs (default: 10)")
    p.add_argument("--lr", type=number, default=None, help="peak learning rate (default: 1e-5 with --model, 5e-4 with --from-config)")
    p.add_argument("--batch-size", type=integer, default=64, help="pairs encoded at once (default: 64)")
    p.add_argument(
        "--grad-accum", type=integer, default=1, metavar="K",
        help="micro-batches per optimizer step: effective batch = batch size x K (default: 1)",
    )
    p.add_argument("--accum-mode", choices=ACCUM_MODES, default="gradcache",
                   help="gradcache: loss over the whole effective batch, exact big-batch gradients (default); "
                        "micro: one loss per micro-batch, negatives from it only")  # fmt: skip
    p.add_argument("--weight-decay", type=number, default=0.1, help="AdamW weight decay of weight matrices (default: 0.1)")
    p.add_argument(
        "--warmup-steps", type=integer, default=None,
        help="linear warm-up steps before the cosine decay (default: 10%% of the steps)",
    )
    p.add_argument("--freeze", choices=FREEZE_CHOICES, default="none", help="keep a tower's weights unchanged (default: none)")
    p.add_argument(
        "--crop-scale", type=_crop_scale, default=(0.7, 1.0), metavar="MIN[,MAX]",
        help="area fraction kept by the random crop (default: 0.7,1.0)",
    )
    p.add_argument("--no-augment", action="store_true", help="train on the indexing preprocessing only (no random crop)")
    p.add_argument("--seed", type=integer, default=0, help="seed of the data order, crops and --from-config weights (default: 0)")
    add_device_arguments(p)
    p.add_argument("--save-every", type=integer, default=None, metavar="N", help="also checkpoint every N steps (always after each epoch)")
    p.add_argument("--save-dtype", choices=SAVE_DTYPES, default="float32", help="dtype of the saved weights (default: float32)")
    p.add_argument("--resume", action="store_true", help="continue the run checkpointed in OUT/checkpoint (same options)")
    p.add_argument(
        "--keep-checkpoint", action="store_true",
        help="keep OUT/checkpoint/ (optimizer state etc.) after the final model is written",
    )
    p.add_argument(
        "--stop-after-steps", type=integer, default=None, metavar="N",
        help="stop after N steps in all, checkpointed, to --resume later",
    )
    p.add_argument("--json", action="store_true", help="print a final JSON object (metrics before/after, steps, seconds, loss history)")
    p.set_defaults(handler=run)
