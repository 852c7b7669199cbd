"""Text going into a Hugging Face tokenizer: as given, and a notice where the window cuts it.

Queries reach the tokenizer unchanged, in any script: no ASCII folding or Unicode normalisation
here, because each tokenizer applies its own (CLIP's NFC and lowercasing, Gemma's none), and
doing any of it twice would change the tokens the model was trained on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

LOG = logging.getLogger(__package__)


def warn_truncated(tokenizer: Any, texts: Sequence[str], max_length: int, model: str) -> list[int]:
    """Log a warning for each text longer than the model's window; the reference truncates them
    silently, and so do we, but a user should know their query's end was not read.

    Args:
        tokenizer: the checkpoint's tokenizer.
        texts: the texts about to be tokenized.
        max_length: the text tower's window in tokens (special tokens included).
        model: the model's name for the message.

    Returns:
        The indices of the texts that will be truncated.
    """
    if not texts:
        return []
    from ..base import quiet_transformers

    with quiet_transformers():  # transformers' own "longer than the maximum" line is for developers
        lengths = [len(ids) for ids in tokenizer(list(texts), truncation=False)["input_ids"]]
    cut = [i for i, n in enumerate(lengths) if n > max_length]
    for i in cut:
        shown = texts[i] if len(texts[i]) <= 60 else texts[i][:57] + "..."
        LOG.warning(
            "text %r is %d tokens, longer than %s's window of %d: truncated to the first %d, as the model reads it",
            shown, lengths[i], model, max_length, max_length,
        )
    return cut
