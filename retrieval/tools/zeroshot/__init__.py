"""Zero-shot classification: labels scored against images by their CLIP embeddings.

``classifier`` (label vectors, scores), ``templates`` (prompt sets, label checks), ``run``
(an index's stored vectors or image files, Parquet output), ``folder`` (ImageFolder evaluation).
"""

from .classifier import ZeroShotClassifier, ensemble, top_labels
from .folder import ImageFolder, ZeroShotReport, evaluate_folder, zero_shot_metrics
from .run import Prediction, classify_files, classify_index, write_predictions
from .templates import DEFAULT_TEMPLATE, OPENAI_TEMPLATES, SIMPLE_TEMPLATES, check_labels, read_labels, resolve_templates

__all__ = [
    "DEFAULT_TEMPLATE",
    "OPENAI_TEMPLATES",
    "SIMPLE_TEMPLATES",
    "ImageFolder",
    "Prediction",
    "ZeroShotClassifier",
    "ZeroShotReport",
    "check_labels",
    "classify_files",
    "classify_index",
    "ensemble",
    "evaluate_folder",
    "read_labels",
    "resolve_templates",
    "top_labels",
    "write_predictions",
    "zero_shot_metrics",
]
