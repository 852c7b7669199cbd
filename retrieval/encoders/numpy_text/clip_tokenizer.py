"""The CLIP tokenizer rebuilt from the checkpoint's ``tokenizer.json`` with the ``tokenizers`` library."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .tower_config import UnsupportedTextTower

# Tokenizer classes whose pipeline :func:`load_clip_tokenizer` reproduces.
TOKENIZER_CLASSES: tuple[str, ...] = ("CLIPTokenizer", "CLIPTokenizerFast")


@dataclass(frozen=True)
class TokenizerSettings:
    """What ``tokenizer_config.json`` says, as far as the query ids depend on it."""

    bos_token: str = "<|startoftext|>"
    eos_token: str = "<|endoftext|>"
    pad_token: str = "<|endoftext|>"
    unk_token: str = "<|endoftext|>"

    @classmethod
    def read(cls, directory: Path) -> TokenizerSettings:
        """Read and check the settings.

        Raises:
            UnsupportedTextTower: another tokenizer class, left padding or truncation, or
                special tokens given as something else than strings.
        """
        path = directory / "tokenizer_config.json"
        if not path.is_file():
            raise UnsupportedTextTower("no tokenizer_config.json")
        data = json.loads(path.read_text("utf-8"))
        if data.get("tokenizer_class") not in TOKENIZER_CLASSES:
            raise UnsupportedTextTower(f"tokenizer class {data.get('tokenizer_class')!r}")
        for side in ("padding_side", "truncation_side"):
            if data.get(side, "right") != "right":
                raise UnsupportedTextTower(f"{side} {data.get(side)!r}")
        for flag in ("add_bos_token", "add_eos_token"):
            if data.get(flag, True) is not True:
                # transformers would rebuild the post-processor without that token.
                raise UnsupportedTextTower(f"tokenizer_config {flag} is {data.get(flag)!r}")
        values: dict[str, str] = {}
        for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
            value = data.get(name, getattr(cls, name))
            if isinstance(value, Mapping):
                value = value.get("content")
            if not isinstance(value, str):
                raise UnsupportedTextTower(f"tokenizer_config {name} is {value!r}")
            values[name] = value
        return cls(**values)


def load_clip_tokenizer(directory: Path, max_length: int) -> tuple[Any, TokenizerSettings]:
    """The checkpoint's tokenizer as transformers 5's ``CLIPTokenizer`` builds it, truncating.

    The vocabulary, merges and added tokens come from ``tokenizer.json``; normaliser,
    pre-tokeniser and post-processor are the ones ``CLIPTokenizer.__init__`` installs (as
    transformers does, whatever the file says).

    Raises:
        UnsupportedTextTower: no ``tokenizer.json``, or one this cannot reproduce.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, normalizers, pre_tokenizers, processors

    settings = TokenizerSettings.read(directory)
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise UnsupportedTextTower("no tokenizer.json")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises plain Exceptions
        raise UnsupportedTextTower(f"unreadable tokenizer.json: {exc}") from exc
    bpe = tok.model
    if (
        type(bpe).__name__ != "BPE"
        or bpe.end_of_word_suffix != "</w>"
        or bpe.continuing_subword_prefix not in (None, "")
        or bpe.dropout not in (None, 0.0)
    ):
        raise UnsupportedTextTower("tokenizer.json is not CLIP's byte-level BPE")
    specials = [settings.bos_token, settings.eos_token, settings.pad_token, settings.unk_token]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in dict.fromkeys(specials)])
    found = {t: tok.token_to_id(t) for t in specials}
    ids = {t: i for t, i in found.items() if i is not None}
    if len(ids) != len(found):
        raise UnsupportedTextTower("a special token of tokenizer_config.json is not in the vocabulary")
    # The pipeline of transformers' CLIPTokenizer.__init__ (models/clip/tokenization_clip.py).
    tok.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(
                Regex(r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""),
                behavior="removed",
                invert=True,
            ),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.post_processor = processors.RobertaProcessing(
        (settings.eos_token, ids[settings.eos_token]), (settings.bos_token, ids[settings.bos_token]), False, False
    )
    tok.no_padding()
    tok.enable_truncation(max_length=max_length)
    return tok, settings
