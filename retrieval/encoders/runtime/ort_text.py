"""An exported text tower on ONNX Runtime's CPU provider, in the numpy text tower's shape.

:class:`OrtTextTower` has what :class:`~retrieval.encoders.numpy_text.encoder.NumpyTextEncoder`
calls on a tower (``cfg``, ``uses_torch``, ``forward``), so the encoder tokenizes, truncates at
the pooled token and normalises exactly as it does for numpy; only the forward pass changes
runtime. Each text is one run of one row at its own length, with no padding:
its vector cannot depend on the other texts of a call.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...errors import ModelLoadError
from ..cpu import usable_cores
from .ort_tower import cpu_session

if TYPE_CHECKING:
    from ..numpy_text.tower_config import TextTowerConfig


def default_threads() -> int:
    """The numpy tower's thread budget: OpenBLAS's thread count where threadpoolctl can read it
    (``serve`` sets it, ``--blas-threads``, 1 by default for concurrent requests), else the cores
    this process may run on (OpenBLAS's own default)."""
    try:
        from threadpoolctl import threadpool_info

        counts = [int(i["num_threads"]) for i in threadpool_info() if i.get("internal_api") == "openblas"]
        if counts:
            return max(1, min(counts))
    except Exception:  # noqa: BLE001, S110  (not installed or unreadable: the cores, below)
        pass
    return usable_cores()


class OrtTextTower:
    """``forward(ids, mask) -> projected vector`` of one sequence on ONNX Runtime, from the
    export at ``path`` (:func:`~.export.cached_text_export`), on ``threads`` (default:
    :func:`default_threads`).

    Raises:
        ModelLoadError: ONNX Runtime cannot load the file, or it is not a text-tower export.
    """

    uses_torch = False

    def __init__(self, path: Path, cfg: TextTowerConfig, threads: int | None = None) -> None:
        self.session = cpu_session(path, threads or default_threads())
        names = sorted(i.name for i in self.session.get_inputs())
        if names != ["attention_mask", "input_ids"]:
            raise ModelLoadError(f"{path} is not a text-tower export (inputs {names})")
        self.path = path
        self.cfg = cfg

    def forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Projected (not normalised) output of one sequence ``ids`` (``(L,)``, up to and
        including its pooled token) with its attention ``mask``."""
        feeds = {"input_ids": ids.astype(np.int64)[None], "attention_mask": mask.astype(np.int64)[None]}
        out = self.session.run(None, feeds)[0]
        return np.asarray(out[0], dtype=np.float32)
