"""What every encoder backend shares: the Encoder protocol, devices, normalisation, file
hashing and the offline checks in front of model hubs.

Nothing here imports torch, transformers or open_clip at import time.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol
from urllib.parse import urlparse

import numpy as np

from ..errors import InvalidArgumentError
from ..images import PreprocessConfig

if TYPE_CHECKING:
    import torch

    from .precision import Mode, TowerPrecision

# (resolved path, size, mtime_ns) -> sha256 hex of the file's contents, for the process's life.
_FILE_HASH_CACHE: dict[tuple[str, int, int], str] = {}


@dataclass(frozen=True)
class TextPath:
    """Which text tower a text query would run on, and why.

    Attributes:
        path: ``numpy`` (this package, no torch), ``onnxruntime`` (this package's tokenizer and
            loop, the fp32 tower's forward pass on ONNX Runtime, :func:`choose_text_runtime`) or
            ``torch`` (the backend's own encoder).
        reason: why, in a few words.
    """

    path: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


class TextEncoder(Protocol):
    """What a text query needs from a model: the torch encoders below, and the numpy text tower
    (:class:`~retrieval.encoders.numpy_text.NumpyTextEncoder`), which has no image half.

    Capabilities are declared here, not probed: ``family_name`` (None where the backend has no
    families), ``query_languages`` (() where any text is read as it is),
    ``text_precision_info`` and ``loaded_path`` exist on every text encoder.
    """

    name: str
    backend: str
    dim: int
    max_text_length: int

    @property
    def fingerprint(self) -> str: ...

    @property
    def family_name(self) -> str | None:
        """The checkpoint's family (``clip``, ``siglip``, ...), what a query model is matched by; None: no families."""
        ...

    @property
    def query_languages(self) -> tuple[str, ...]:
        """The language codes texts must name (NLLB's FLORES-200 codes); () when any text is read as it is."""
        ...

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray: ...

    def text_precision_info(self) -> dict[str, Any]:
        """JSON-able record of the text tower's precision: requested and chosen mode, the gate's figures."""
        ...

    def loaded_path(self) -> TextPath | None:
        """The text path this loaded encoder runs and why (what ``info`` reports), or None where
        the caller plans it from the query's settings (:func:`~.text_choice.text_path`), as for
        the torch encoders."""
        ...


class ImageQueryEncoder(Protocol):
    """What image queries run on: a full :class:`Encoder`, or the index's image tower reopened
    without torch's model (:class:`~retrieval.encoders.recorded_tower.RecordedTower`). The query
    layer asks these instead of telling the two apart.
    """

    def embed_image(self, source: str | bytes | os.PathLike[str] | BinaryIO, cfg: PreprocessConfig, draft: bool = True) -> np.ndarray:
        """The ``(1, dim)`` vector of an image file, decoded as ``draft`` says and preprocessed by ``cfg``."""
        ...

    def image_query_path(self) -> dict[str, str | None]:
        """What runs image queries here: ``tower`` (``recorded`` or ``encoder``), ``runtime``
        (``torch``, ``openvino``, ``onnxruntime``) and ``reason``; None for the full encoder, which
        runs where the recorded tower was not reopened, for a reason only its caller knows."""
        ...


class Encoder(TextEncoder, ImageQueryEncoder, Protocol):
    """What the indexer and the query layer need from a model, whatever its backend.

    ``info`` is the JSON-able mapping an index manifest records as ``model_info``;
    ``image_precision`` the image tower's mode (:mod:`.precision`), which a build sets and
    calibrates and a query matches to the index's; ``text_precision`` the text tower's, which a
    caller may set apart (``classify`` asks for its labels' precision while images stay fp32).
    """

    preprocess: PreprocessConfig
    device: torch.device
    image_precision: TowerPrecision
    text_precision: TowerPrecision

    @property
    def info(self) -> dict[str, Any]: ...

    def embed_pixels(self, pixel_values: torch.Tensor) -> np.ndarray: ...

    def set_image_size(self, size: int) -> None:
        """Embed images at ``size`` pixels (scaled preprocessing); an error where the backend cannot."""
        ...

    def logit_params(self) -> tuple[float, float | None]:
        """``(exp(logit_scale), logit_bias)`` of the checkpoint: how the reference model turns
        cosine similarities into logits (bias None for CLIP's softmax, a float for SigLIP's sigmoid)."""
        ...

    def calibrate_images(self, pixel_values: torch.Tensor) -> Mode:
        """Resolve an ``auto`` image precision on this sample now; returns the mode."""
        ...

    def follow_image_runtime(self, recorded: str | None, precision: str | None = None) -> None:
        """Ask first for the runtime an index's vectors came from (its ``image_runtime``), for
        the mode they were made in (``precision``; None: every mode). A no-op where torch runs
        every image tower."""
        ...

    def image_runtime_pending(self) -> bool:
        """Whether the current mode's runtime is still to be chosen on a sample of images."""
        ...

    def image_runtime_name(self) -> str:
        """What runs the current mode's image tower: ``torch``, ``openvino`` or ``onnxruntime``."""
        ...


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cpu``, ``cuda``, ``cuda:N`` as given.

    Raises:
        InvalidArgumentError: unknown device string, or CUDA asked for but not available.
    """
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidArgumentError(f"unknown device {device!r}; use auto, cpu or cuda") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InvalidArgumentError("--device cuda was asked for but CUDA is not available here; use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise InvalidArgumentError(f"unsupported device {device!r}; use auto, cpu or cuda")
    return dev


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Row-wise L2 normalisation in float32 (zero rows stay zero)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, np.finfo(np.float32).tiny)


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's contents, cached per file identity (path, size, mtime).

    Raises:
        OSError: the file cannot be read.
    """
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    cached = _FILE_HASH_CACHE.get(key)
    if cached is None:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
        cached = _FILE_HASH_CACHE[key] = h.hexdigest()
    return cached


def user_cache() -> Path:
    """clipsearch's folder in the user's cache: ``$XDG_CACHE_HOME/clipsearch``, else ``~/.cache/clipsearch``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "clipsearch"


def offline_requested() -> bool:
    """True when the user asked for offline mode (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``)."""
    flags = (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return any(flag.strip().lower() in ("1", "true", "yes", "on") for flag in flags)


def host_resolves(host: str) -> bool:
    """Whether ``host`` has a DNS entry: a machine without network fails this at once."""
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True


def hub_reachable() -> bool:
    """Cheap check before asking the hub: offline mode set, or the hub's host does not resolve."""
    if offline_requested():
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    return host_resolves(host)


def url_reachable(url: str) -> bool:
    """Like :func:`hub_reachable` for a plain download URL."""
    if offline_requested():
        return False
    host = urlparse(url).hostname
    return bool(host) and host_resolves(host)  # type: ignore[arg-type]  # bool(host) rules out None; mypy does not narrow it


@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """Make huggingface_hub (and transformers through it) use the local cache only, for the duration.

    huggingface_hub reads ``HF_HUB_OFFLINE`` once at import; its ``is_offline_mode()`` reads the
    module constant on every request, so switching the constant is what takes effect. Without
    this, a cached file is revalidated online first, which without network means retries.
    """
    from huggingface_hub import constants

    previous = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = previous


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' and huggingface_hub's logging (load reports, hub retries)."""
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as hf_logging

    hub_logger = hub_logging.get_logger("huggingface_hub")
    hub_level = hub_logger.level
    hub_logger.setLevel(logging.ERROR)
    previous = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)
        hub_logger.setLevel(hub_level)
        if bars:
            hf_logging.enable_progress_bar()


# OpenVINO heads its messages with the source locations they passed through ("Exception from
# src/...cpp:224:", "Check '...' failed at src/...cpp:345:"); the cause is on the line after them.
_LOCATION_LINE = re.compile(r"^(Exception from |Check ').*:\d+:$")


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message that says more than where it was raised (or
    its type name), for one-line errors."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    told = [line for line in lines if not _LOCATION_LINE.match(line)]
    return (told or lines or [type(exc).__name__])[0]
