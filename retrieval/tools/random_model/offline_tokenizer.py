"""OpenAI's CLIP tokenizer rebuilt offline from open_clip's BPE file, as a transformers ``CLIPTokenizer``.

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
"""

from __future__ import annotations

import gzip
import html
import importlib.util
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from ...checks import is_positive_int
from ...errors import InvalidArgumentError

if TYPE_CHECKING:
    from transformers import CLIPTokenizer

# OpenAI CLIP's vocabulary layout (mirrors open_clip.tokenizer.SimpleTokenizer): 256 byte
# symbols, the same 256 with "</w>", 48,894 merges, then start-of-text and end-of-text.
CLIP_VOCAB_SIZE: int = 49_408
CLIP_NUM_MERGES: int = 49_152 - 256 - 2  # = 48,894; SimpleTokenizer uses lines[1:49152-256-2+1]
BOS_TOKEN: str = "<|startoftext|>"
EOS_TOKEN: str = "<|endoftext|>"
BOS_TOKEN_ID: int = 49_406
EOS_TOKEN_ID: int = 49_407

_BPE_FILE_NAME = "bpe_simple_vocab_16e6.txt.gz"


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
