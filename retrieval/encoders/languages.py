"""Query languages for tokenizers that must be told one: NLLB's FLORES-200 codes.

Most multilingual text towers (XLM-R, SigLIP 2's Gemma tokenizer, mT5) read any language as it
is, and a query language means nothing to them. NLLB's tokenizer (open_clip's NLLB-CLIP) starts
every text with a language token (``eng_Latn``, ``zho_Hans``, ...) and falls back to English when
none is set, so a query in another language would be silently embedded as English. Such a model
takes the query's language as a FLORES-200 code, and a query without one is refused.

The language is given to the Hugging Face tokenizer through its ``src_lang`` attribute, the one
spelling that takes effect in transformers 4 and 5 alike (open_clip's ``set_language`` calls
``set_src_lang_special_tokens``, which transformers 5 undoes on the next call).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from ..errors import InvalidArgumentError

# FLORES-200: ISO 639-3 language, underscore, ISO 15924 script (eng_Latn, zho_Hans, arb_Arab).
FLORES_CODE = re.compile(r"[a-z]{3}_[A-Z][a-z]{3}")
# Named in the messages: a few codes users look for first.
EXAMPLES = ("eng_Latn", "zho_Hans", "rus_Cyrl", "arb_Arab", "deu_Latn")


def language_codes(tokenizer: Any) -> tuple[str, ...]:
    """The FLORES-200 codes a Hugging Face tokenizer takes as ``src_lang``; () when it takes none.

    ``tokenizer`` is a transformers tokenizer (or anything else: then ()).
    """
    if not isinstance(getattr(type(tokenizer), "src_lang", None), property):
        return ()
    specials = getattr(tokenizer, "all_special_tokens", None) or ()
    return tuple(sorted(t for t in specials if isinstance(t, str) and FLORES_CODE.fullmatch(t)))


def check_language(model: str, codes: tuple[str, ...], language: str | None) -> str | None:
    """The language a query runs in: ``language`` checked against ``codes``.

    A model whose tokenizer takes no language (``codes`` empty) reads the text as it is and
    ignores ``language`` (None is returned).

    Raises:
        InvalidArgumentError: the model needs a language and none was given, or a code it
            does not know.
    """
    if not codes:
        return None
    examples = ", ".join(c for c in EXAMPLES if c in codes) or ", ".join(codes[:5])
    if language is None or not str(language).strip():
        raise InvalidArgumentError(
            f"{model} needs the query's language: give it as a FLORES-200 code (--query-lang, or query_lang "
            f"in the API), e.g. {examples}"
        )
    if language not in codes:
        raise InvalidArgumentError(
            f"unknown query language {language!r} for {model}: it takes FLORES-200 codes ({len(codes)} of them), "
            f"e.g. {examples}"
        )
    return language


def language_embedder(encoder: Any, query_lang: str | None) -> tuple[str | None, Callable[[list[str]], Any]]:
    """``(language, embed)``: the checked language of ``query_lang`` for ``encoder`` (None for a
    model that takes none) and the call that embeds texts in it, ``encoder.embed_texts`` with
    ``language=`` where the model needs it. The one place callers turn a query language into a call.

    Raises:
        InvalidArgumentError: see :func:`check_language`.
    """
    language = check_language(encoder.name, tuple(encoder.query_languages), query_lang)
    if language is None:
        return None, encoder.embed_texts
    return language, functools.partial(encoder.embed_texts, language=language)


def set_language(tokenizer: Any, language: str) -> None:
    """Tell a Hugging Face tokenizer the language of the texts it tokenizes next."""
    tokenizer.src_lang = language


__all__ = ["EXAMPLES", "FLORES_CODE", "check_language", "language_codes", "language_embedder", "set_language"]
