"""Randomly initialised Hugging Face CLIP checkpoints, built offline, with the real CLIP tokenizer.

Tests, benchmarks and the offline demo need a checkpoint directory that loads exactly like
``openai/clip-vit-base-patch32`` (``CLIPModel``, ``CLIP*ModelWithProjection``, ``CLIPProcessor``,
``AutoTokenizer``) without network access. The weights here are random, but everything around
them is real:

* the tokenizer is OpenAI's CLIP BPE (49,408 ids), rebuilt from the vocabulary file that
  ``open_clip`` ships (``bpe_simple_vocab_16e6.txt.gz``), so token ids equal ``open_clip``'s;
* the image processor uses OpenAI's resize / crop / mean / std settings;
* the text config's ``eos_token_id`` is the tokenizer's end-of-text id, so the text tower pools
  at the first end-of-text token, also in batches padded with end-of-text.

Token-id parity with ``open_clip`` (checked by the tests): identical for ordinary text (ASCII,
punctuation, digits, accents, CJK, emoji, any whitespace, any case, truncation). The Hugging Face
tokenizer only normalises with NFC + whitespace collapse + per-character lowercase, whereas
``open_clip`` first runs ``ftfy.fix_text`` and ``html.unescape`` twice and uses ``str.lower``.
Hence these classes of strings differ unless passed through :func:`clean_text_like_open_clip`
first: curly quotes (``’ “ ”``), HTML entities (``&amp;``), full-width forms (``ＡＢＣ１！``),
Latin ligatures (``ﬁ``), mojibake (``cafÃ©``), Greek final sigma (``ΟΔΟΣ``), the separator
controls U+001C..U+001F. Literal special-token strings differ whatever the cleaning:
``"<|endoftext|>"`` is special to Hugging Face, ``"<end_of_text>"`` to ``open_clip``. The real
``openai/clip-vit-base-patch32`` tokenizer on the Hub behaves the same way as ours.

Nothing is imported from torch / transformers / open_clip at import time: importing this module
must stay free for code that only wants :data:`PRESETS`.

Command line::

    python -m retrieval.random_model OUT_DIR [--preset tiny|vit-b-32|vit-l-14] [--seed 0]
"""

from __future__ import annotations

import argparse
import gzip
import html
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from .checks import is_int, is_positive_int
from .encoders.base import quiet_transformers
from .errors import InvalidArgumentError

#: Where :func:`make_random_clip` puts the image processor settings: ``"hub"`` a top-level
#: ``preprocessor_config.json`` (like openai/clip-vit-base-patch32), ``"processor"`` what
#: transformers 5's ``CLIPProcessor.save_pretrained`` writes (nested in ``processor_config.json``).
PROCESSOR_LAYOUTS: tuple[str, ...] = ("hub", "processor")

if TYPE_CHECKING:
    from transformers import CLIPConfig, CLIPTokenizer

# OpenAI CLIP's vocabulary layout (mirrors open_clip.tokenizer.SimpleTokenizer): 256 byte
# symbols, the same 256 with "</w>", 48,894 merges, then start-of-text and end-of-text.
CLIP_VOCAB_SIZE: int = 49_408
CLIP_NUM_MERGES: int = 49_152 - 256 - 2  # = 48,894; SimpleTokenizer uses lines[1:49152-256-2+1]
BOS_TOKEN: str = "<|startoftext|>"
EOS_TOKEN: str = "<|endoftext|>"
BOS_TOKEN_ID: int = 49_406
EOS_TOKEN_ID: int = 49_407

# OpenAI CLIP image normalisation (same numbers as transformers' OPENAI_CLIP_MEAN / _STD).
OPENAI_CLIP_MEAN: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)
_BICUBIC: int = 3  # PIL.Image.Resampling.BICUBIC, written as the int the processor config stores

_BPE_FILE_NAME = "bpe_simple_vocab_16e6.txt.gz"


@dataclass(frozen=True)
class RandomClipSpec:
    """Shapes of a CLIP model (vision ViT + text transformer + projections).

    Raises:
        InvalidArgumentError: (a ``ValueError``) if a field is not a positive int, a hidden size
            is not divisible by its head count, ``image_size`` is not a multiple of
            ``patch_size``, or ``max_length`` < 2 (start- and end-of-text need two positions).
    """

    image_size: int
    patch_size: int
    vision_hidden: int
    vision_layers: int
    vision_heads: int
    vision_intermediate: int
    text_hidden: int
    text_layers: int
    text_heads: int
    text_intermediate: int
    projection_dim: int
    max_length: int

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            # True as a layer count is a bug, not a shape (is_positive_int refuses bools).
            if not is_positive_int(value):
                raise InvalidArgumentError(f"RandomClipSpec.{f.name} must be a positive int, got {value!r}")
        if self.vision_hidden % self.vision_heads:
            raise InvalidArgumentError(
                f"vision_hidden ({self.vision_hidden}) must be divisible by vision_heads ({self.vision_heads})"
            )
        if self.text_hidden % self.text_heads:
            raise InvalidArgumentError(
                f"text_hidden ({self.text_hidden}) must be divisible by text_heads ({self.text_heads})"
            )
        if self.image_size % self.patch_size:
            # HF would silently drop the border pixels; a test model should not hide that.
            raise InvalidArgumentError(
                f"image_size ({self.image_size}) must be a multiple of patch_size ({self.patch_size})"
            )
        if self.max_length < 2:
            raise InvalidArgumentError(f"max_length must be >= 2, got {self.max_length}")


PRESETS: dict[str, RandomClipSpec] = {
    # Small enough that building, saving and loading take well under a second on CPU.
    "tiny": RandomClipSpec(
        image_size=64,
        patch_size=16,
        vision_hidden=32,
        vision_layers=2,
        vision_heads=2,
        vision_intermediate=64,
        text_hidden=32,
        text_layers=2,
        text_heads=2,
        text_intermediate=64,
        projection_dim=48,
        max_length=77,
    ),
    # The shapes of openai/clip-vit-base-patch32 (151M parameters, ~605 MB in float32), for
    # benchmarks whose timings must be representative of the real model.
    "vit-b-32": RandomClipSpec(
        image_size=224,
        patch_size=32,
        vision_hidden=768,
        vision_layers=12,
        vision_heads=12,
        vision_intermediate=3072,
        text_hidden=512,
        text_layers=12,
        text_heads=8,
        text_intermediate=2048,
        projection_dim=512,
        max_length=77,
    ),
    # The shapes of openai/clip-vit-large-patch14 (428M parameters, ~1.7 GB in float32): ~18x
    # the vision compute of ViT-B/32 per image (257 tokens of 1024 against 50 of 768), for
    # telling a model-bound build from a feeding-bound one on a GPU.
    "vit-l-14": RandomClipSpec(
        image_size=224,
        patch_size=14,
        vision_hidden=1024,
        vision_layers=24,
        vision_heads=16,
        vision_intermediate=4096,
        text_hidden=768,
        text_layers=12,
        text_heads=12,
        text_intermediate=3072,
        projection_dim=768,
        max_length=77,
    ),
}


def _bytes_to_unicode() -> dict[int, str]:
    """Return OpenAI CLIP's reversible byte -> printable unicode symbol table (256 entries).

    A copy of ``open_clip.tokenizer.bytes_to_unicode``: importing ``open_clip`` costs seconds
    (it pulls in torch and timm), and the order of this table fixes the first 512 token ids.
    """
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs], strict=True))


def _find_bpe_file() -> Path:
    """Locate ``open_clip``'s bundled BPE file without importing ``open_clip``.

    ``importlib.util.find_spec`` on a top-level package does not execute it, unlike
    ``importlib.resources.files("open_clip")`` which imports the whole package.

    Raises:
        FileNotFoundError: if open_clip is not installed or does not ship the BPE file.
    """
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "open_clip is not installed; it ships the CLIP BPE vocabulary (pip install open_clip_torch)"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / _BPE_FILE_NAME
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{_BPE_FILE_NAME} not found in open_clip at {list(spec.submodule_search_locations)}")


@lru_cache(maxsize=1)
def _clip_vocab_and_merges() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Return (vocab in id order, merges as "a b" lines), cached: decompressing is the slow part."""
    lines = gzip.decompress(_find_bpe_file().read_bytes()).decode("utf-8").split("\n")
    # Line 0 is a header; SimpleTokenizer keeps exactly lines[1:49152-256-2+1].
    merges = tuple(lines[1 : CLIP_NUM_MERGES + 1])
    if len(merges) != CLIP_NUM_MERGES or any(len(m.split()) != 2 for m in merges):
        raise ValueError(f"{_BPE_FILE_NAME} does not hold {CLIP_NUM_MERGES} merge lines; is open_clip damaged?")
    symbols = list(_bytes_to_unicode().values())
    vocab = symbols + [s + "</w>" for s in symbols] + ["".join(m.split()) for m in merges] + [BOS_TOKEN, EOS_TOKEN]
    if len(vocab) != CLIP_VOCAB_SIZE or len(set(vocab)) != CLIP_VOCAB_SIZE:
        raise ValueError(f"rebuilt CLIP vocabulary has {len(vocab)} entries, expected {CLIP_VOCAB_SIZE} distinct")
    return tuple(vocab), merges


def build_clip_tokenizer(max_length: int = 77) -> CLIPTokenizer:
    """Build OpenAI's CLIP tokenizer offline, as a transformers ``CLIPTokenizer``.

    The vocabulary and merges are rebuilt from ``open_clip``'s bundled BPE file, written as
    ``vocab.json`` + ``merges.txt`` to a temporary directory and loaded from there (the same
    route as loading ``openai/clip-vit-base-patch32``). In transformers 5 ``CLIPTokenizer`` is
    the Rust ``tokenizers``-backed class (``CLIPTokenizerFast`` is an alias of it), which is
    also what ``CLIPProcessor`` and ``AutoTokenizer`` give.

    Args:
        max_length: the tokenizer's ``model_max_length`` (CLIP's text context, 77).

    Returns:
        A tokenizer with 49,408 ids; bos ``<|startoftext|>`` (49406), eos = pad = unk
        ``<|endoftext|>`` (49407), like openai/clip-vit-base-patch32. Call it with
        ``padding="max_length", truncation=True, max_length=77`` to get open_clip's ids
        (open_clip pads with 0 where this pads with 49407; the attention mask tells them apart).

    Raises:
        InvalidArgumentError: (a ``ValueError``) if ``max_length`` is not an int >= 2.
        FileNotFoundError: if open_clip (which ships the BPE file) is not installed.
    """
    if not is_positive_int(max_length, minimum=2):
        raise InvalidArgumentError(f"max_length must be an int >= 2, got {max_length!r}")
    from transformers import CLIPTokenizer

    vocab, merges = _clip_vocab_and_merges()
    with tempfile.TemporaryDirectory(prefix="clip-tokenizer-") as tmp:
        with open(os.path.join(tmp, "vocab.json"), "w", encoding="utf-8") as f:
            json.dump({token: i for i, token in enumerate(vocab)}, f, ensure_ascii=False)
        with open(os.path.join(tmp, "merges.txt"), "w", encoding="utf-8") as f:
            # The "#version" header is what HF's merges.txt files carry; loaders skip it.
            f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
        # Everything is read into memory here, so the directory can go away afterwards.
        tokenizer = CLIPTokenizer.from_pretrained(
            tmp,
            bos_token=BOS_TOKEN,
            eos_token=EOS_TOKEN,
            pad_token=EOS_TOKEN,
            unk_token=EOS_TOKEN,
            model_max_length=max_length,
        )
    # Don't leave a deleted temporary path as the tokenizer's provenance.
    tokenizer.name_or_path = "openai-clip-bpe (rebuilt from open_clip)"
    if len(tokenizer) != CLIP_VOCAB_SIZE or tokenizer.eos_token_id != EOS_TOKEN_ID:
        raise ValueError(
            f"rebuilt CLIP tokenizer is inconsistent: {len(tokenizer)} ids, eos id {tokenizer.eos_token_id}"
        )
    return tokenizer


def clean_text_like_open_clip(text: str) -> str:
    """Clean ``text`` exactly as open_clip's default tokenizer does before BPE.

    Hugging Face's CLIP tokenizer only applies NFC, whitespace collapsing and per-character
    lowercasing. open_clip (``clean="lower"``) applies ``ftfy.fix_text``, ``html.unescape``
    twice, whitespace collapsing and ``str.lower``. Passing text through this function first
    makes the HF tokenizer's ids equal open_clip's for every string except literal special-token
    strings (see the module docstring).

    Args:
        text: the raw caption or query.

    Returns:
        The cleaned text (ftfy-fixed, HTML-unescaped, single-spaced, stripped, lower-case).
        Without ftfy installed the ftfy step is skipped (open_clip itself requires ftfy).

    Raises:
        InvalidArgumentError: (a ``ValueError``) if ``text`` is not a str.
    """
    if not isinstance(text, str):
        raise InvalidArgumentError(f"text must be a str, got {type(text).__name__}")
    try:
        import ftfy
    except ImportError:  # pragma: no cover - open_clip depends on ftfy
        pass
    else:
        text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text))  # twice, as open_clip.tokenizer.basic_clean does
    return " ".join(text.split()).strip().lower()


def _resolve_spec(preset: str | RandomClipSpec) -> RandomClipSpec:
    """Map a preset name or spec to a spec.

    Raises:
        InvalidArgumentError: (a ``ValueError``) for an unknown name or a value of another type.
    """
    if isinstance(preset, RandomClipSpec):
        return preset
    if isinstance(preset, str):
        try:
            return PRESETS[preset]
        except KeyError:
            raise InvalidArgumentError(
                f"unknown preset {preset!r}; choose one of: {', '.join(sorted(PRESETS))}"
            ) from None
    raise InvalidArgumentError(f"preset must be a preset name or a RandomClipSpec, got {type(preset).__name__}")


def clip_config(preset: str | RandomClipSpec) -> CLIPConfig:
    """The ``CLIPConfig`` of a preset or spec, as :func:`make_random_clip` saves it.

    Raises:
        InvalidArgumentError: (a ``ValueError``) for an unknown preset.
    """
    from transformers import CLIPConfig

    spec = _resolve_spec(preset)
    text_config = {
        "vocab_size": CLIP_VOCAB_SIZE,
        "hidden_size": spec.text_hidden,
        "intermediate_size": spec.text_intermediate,
        "num_hidden_layers": spec.text_layers,
        "num_attention_heads": spec.text_heads,
        "max_position_embeddings": spec.max_length,
        # transformers 5 builds CLIPTextModelWithProjection from text_config alone, so the
        # projection width must be there too, not only at the top level.
        "projection_dim": spec.projection_dim,
        "bos_token_id": BOS_TOKEN_ID,
        # Not 2 (the legacy value that switches CLIPTextTransformer to "argmax of input_ids"
        # pooling): with 49407 it pools at the *first* end-of-text token, which stays right for
        # batches padded with end-of-text (our pad token) and for added tokens.
        "eos_token_id": EOS_TOKEN_ID,
        # The model never reads pad_token_id; it is set to what the tokenizer pads with so that
        # code padding by hand from the config agrees with the tokenizer (HF's default is 1).
        "pad_token_id": EOS_TOKEN_ID,
    }
    vision_config = {
        "hidden_size": spec.vision_hidden,
        "intermediate_size": spec.vision_intermediate,
        "num_hidden_layers": spec.vision_layers,
        "num_attention_heads": spec.vision_heads,
        "image_size": spec.image_size,
        "patch_size": spec.patch_size,
        "projection_dim": spec.projection_dim,  # see text_config: needed by the WithProjection class
    }
    return CLIPConfig(text_config=text_config, vision_config=vision_config, projection_dim=spec.projection_dim)


def make_random_clip(
    out_dir: str | os.PathLike[str],
    preset: str | RandomClipSpec = "tiny",
    seed: int = 0,
    processor_layout: str = "hub",
) -> Path:
    """Write a randomly initialised CLIP checkpoint (model + processor) to ``out_dir``.

    The directory then holds ``config.json``, ``model.safetensors``, ``preprocessor_config.json``
    (``processor_config.json`` instead with ``processor_layout="processor"``),
    ``tokenizer.json`` and ``tokenizer_config.json`` (transformers 5 writes no ``vocab.json`` /
    ``merges.txt``: ``tokenizer.json`` holds both), and loads with ``CLIPModel``,
    ``CLIPVisionModelWithProjection``, ``CLIPTextModelWithProjection``, ``CLIPProcessor`` and
    ``AutoTokenizer``. The same spec and seed give byte-identical ``model.safetensors``.

    Args:
        out_dir: directory to write; created (with parents) if missing, files in it overwritten.
        preset: a name from :data:`PRESETS` or a :class:`RandomClipSpec`.
        seed: seed of the weight initialisation (0 <= seed < 2**63).
        processor_layout: one of :data:`PROCESSOR_LAYOUTS`; the weights do not depend on it.

    Returns:
        ``out_dir`` as a ``pathlib.Path``.

    Raises:
        InvalidArgumentError: (a ``ValueError``) for an unknown preset, a bad seed or layout.
        FileNotFoundError: if open_clip (which ships the BPE file) is not installed.
        OSError: if ``out_dir`` cannot be created or written.
    """
    spec = _resolve_spec(preset)
    if not is_int(seed) or not 0 <= seed < 2**63:
        raise InvalidArgumentError(f"seed must be an int in [0, 2**63), got {seed!r}")
    if processor_layout not in PROCESSOR_LAYOUTS:
        raise InvalidArgumentError(f"processor_layout must be one of {PROCESSOR_LAYOUTS}, got {processor_layout!r}")
    out = Path(out_dir)
    # Build the tokenizer first: it is the step that fails without open_clip, before any writing.
    tokenizer = build_clip_tokenizer(spec.max_length)

    import torch
    from transformers import CLIPImageProcessor, CLIPModel, CLIPProcessor

    config = clip_config(spec)

    # fork_rng: seed the initialisation without changing the caller's global RNG state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # float32 whatever the process default dtype is, so that bytes depend only on the seed.
        model = CLIPModel(config).float().eval()

    image_processor = CLIPImageProcessor(
        size={"shortest_edge": spec.image_size},
        crop_size={"height": spec.image_size, "width": spec.image_size},
        do_resize=True,
        do_center_crop=True,
        resample=_BICUBIC,
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=list(OPENAI_CLIP_MEAN),
        image_std=list(OPENAI_CLIP_STD),
        do_convert_rgb=True,
    )
    # Built before writing, so that it fails here if transformers would not accept the pair.
    processor = CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer)

    out.mkdir(parents=True, exist_ok=True)
    with quiet_transformers():
        model.save_pretrained(out, safe_serialization=True)
    if processor_layout == "processor":
        processor.save_pretrained(out)
    else:
        # Saved piecewise: CLIPProcessor.save_pretrained in transformers 5 writes only the nested
        # layout, while the Hub's openai/clip-vit-base-patch32 has a top-level
        # preprocessor_config.json. clipsearch and CLIPProcessor.from_pretrained read both.
        image_processor.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: write a random checkpoint and print its path.

    Args:
        argv: arguments without the program name; ``None`` means ``sys.argv[1:]``.

    Returns:
        0 on success, 2 on a bad argument (one-line message on stderr), 1 if writing failed.
    """
    parser = argparse.ArgumentParser(
        prog="python -m retrieval.random_model",
        description="Write a randomly initialised Hugging Face CLIP checkpoint with the real CLIP tokenizer.",
    )
    parser.add_argument("out_dir", help="directory to write the checkpoint to")
    # No argparse `choices`: its multi-line usage dump is not the one-line error we promise.
    parser.add_argument("--preset", default="tiny", help=f"one of: {', '.join(PRESETS)} (default: tiny)")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed (default: 0)")
    parser.add_argument(
        "--processor-layout",
        default="hub",
        help="hub: a top-level preprocessor_config.json (default); processor: as transformers 5's "
        "CLIPProcessor.save_pretrained writes it, nested in processor_config.json",
    )
    args = parser.parse_args(argv)
    try:
        path = make_random_clip(args.out_dir, preset=args.preset, seed=args.seed, processor_layout=args.processor_layout)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot write {args.out_dir}: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
