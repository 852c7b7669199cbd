"""``python -m retrieval.tools.random_model``: write a random checkpoint and print its path."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .multilingual import MULTILINGUAL_PRESETS, make_random_multilingual
from .random_clip import make_random_clip
from .siglip import SIGLIP_PRESETS, make_random_siglip
from .specs import PRESETS


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: write a random checkpoint and print its path.

    Args:
        argv: arguments without the program name; ``None`` means ``sys.argv[1:]``.

    Returns:
        0 on success, 2 on a bad argument (one-line message on stderr), 1 if writing failed.
    """
    parser = argparse.ArgumentParser(
        prog="python -m retrieval.tools.random_model",
        description="Write a randomly initialised Hugging Face CLIP checkpoint with the real CLIP tokenizer "
        "(or, with a siglip-* preset, a SigLIP checkpoint laid out like SigLIP 2 FixRes; with xlm-roberta-tiny or "
        "nllb-clip-tiny, an open_clip local-dir: folder with that multilingual text tower).",
    )
    parser.add_argument("out_dir", help="directory to write the checkpoint to")
    # No argparse `choices`: its multi-line usage dump is not the one-line error we promise.
    names = [*PRESETS, *SIGLIP_PRESETS, *MULTILINGUAL_PRESETS]
    parser.add_argument("--preset", default="tiny", help=f"one of: {', '.join(names)} (default: tiny)")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed (default: 0)")
    parser.add_argument(
        "--processor-layout",
        default="hub",
        help="hub: a top-level preprocessor_config.json (default); processor: as transformers 5's "
        "CLIPProcessor.save_pretrained writes it, nested in processor_config.json",
    )
    args = parser.parse_args(argv)
    if args.preset not in names:
        print(f"error: unknown preset {args.preset!r}; choose one of: {', '.join(names)}", file=sys.stderr)
        return 2
    try:
        if args.preset in MULTILINGUAL_PRESETS:
            path = make_random_multilingual(args.out_dir, preset=args.preset, seed=args.seed)
        elif args.preset in SIGLIP_PRESETS:
            path = make_random_siglip(args.out_dir, preset=args.preset, seed=args.seed)
        else:
            path = make_random_clip(args.out_dir, preset=args.preset, seed=args.seed, processor_layout=args.processor_layout)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot write {args.out_dir}: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0
