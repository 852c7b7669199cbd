"""Training: contrastive fine-tuning of a CLIP checkpoint, or training a small one from scratch.

A room of its own inside ``indexer``: it imports ``retrieval`` and itself only (never the index
build), and torch/transformers only inside functions, so importing it costs nothing until a run.
:func:`finetune` is the entry point; ``clipsearch finetune`` maps its options onto
:class:`FinetuneConfig`.
"""

from .augment import AugmentConfig
from .finetune import FinetuneConfig, FinetuneReport, finetune, lr_factor, resolve_spec

__all__ = ["AugmentConfig", "FinetuneConfig", "FinetuneReport", "finetune", "lr_factor", "resolve_spec"]
