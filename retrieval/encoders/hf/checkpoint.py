"""Where a Hugging Face checkpoint's files are (a local directory, else the Hub cache, else the
Hub when it can be reached) and what its weight files hold."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ...errors import InvalidArgumentError, ModelLoadError
from .. import base
from ..base import file_sha256, quiet_transformers

# Weight files from_pretrained reads, in its order of preference.
_WEIGHT_PATTERNS = ("model.safetensors", "model-*-of-*.safetensors", "pytorch_model.bin", "pytorch_model-*-of-*.bin")


def looks_like_path(model: str) -> bool:
    """Whether ``model`` can only be a path: hub ids are ``name`` or ``org/name``."""
    return model.startswith(("/", ".", "~")) or model.count("/") > 1 or model.endswith("/")


def resolve_checkpoint(model: str) -> tuple[str, Path]:
    """Find the local directory of a checkpoint given by hub id or path.

    Returns:
        (canonical name, directory): the absolute path for local checkpoints (so an index
        records where its model lives), the hub id otherwise.

    Raises:
        ModelLoadError: the path does not exist, or the hub id is not cached and cannot be
            downloaded.
    """
    if not model or not model.strip():
        raise InvalidArgumentError("model must not be empty")
    local = Path(model).expanduser()
    if local.is_dir():
        resolved = local.resolve()
        if not (resolved / "config.json").is_file():
            hint = (
                f"; it looks like an open_clip model: use --model open_clip:local-dir:{resolved}"
                if (resolved / "open_clip_config.json").is_file()
                else ""
            )
            raise ModelLoadError(f"{resolved} is not a model checkpoint directory: it has no config.json{hint}")
        return str(resolved), resolved
    if looks_like_path(model) or local.exists():
        raise ModelLoadError(f"model checkpoint directory {model!r} does not exist")
    return model, _hub_snapshot(model)


def cached_checkpoint(model: str) -> tuple[str, Path] | None:
    """``(name, directory)`` of a checkpoint found without any network access: a local
    checkpoint directory, or a hub id already in the local Hugging Face cache; None otherwise.

    Raises:
        ModelLoadError: a path that is not a checkpoint directory.
    """
    local = Path(model).expanduser()
    if local.is_dir() or looks_like_path(model):
        return resolve_checkpoint(model)
    try:
        from huggingface_hub import snapshot_download

        directory = Path(snapshot_download(model, allow_patterns=["*.json", "*.txt", "*.safetensors"], local_files_only=True))
    except Exception:  # noqa: BLE001 - hub errors come in many types
        return None
    return (model, directory) if (directory / "config.json").is_file() else None


def _hub_snapshot(model: str) -> Path:
    # The cache first, without network; the hub only when it can be reached (huggingface_hub
    # would otherwise retry for many seconds on a machine without network before failing).
    from huggingface_hub import snapshot_download

    def fetch(patterns: list[str], offline: bool) -> Path:
        with quiet_transformers():
            return Path(snapshot_download(model, allow_patterns=patterns, local_files_only=offline))

    last: BaseException | None = None
    for offline in (True, False):
        if not offline and not base.hub_reachable():
            raise ModelLoadError(
                f"cannot load model {model!r}: it is not in the local Hugging Face cache and the Hub cannot "
                "be reached from this machine. Pass a local checkpoint directory: --model /path/to/checkpoint"
            )
        try:
            directory = fetch(["*.json", "*.txt", "*.safetensors"], offline)
            if not any(directory.glob("*.safetensors")):
                directory = fetch(["*.json", "*.txt", "*.bin"], offline)
            if (directory / "config.json").is_file() and _weight_files(directory):
                return directory
        except Exception as exc:  # noqa: BLE001 - hub errors come in many types; the cause is kept
            last = exc
    raise ModelLoadError(_offline_message(model, last))


def _offline_message(model: str, exc: BaseException | None) -> str:
    cause = f" ({str(exc).splitlines()[0]})" if exc is not None and str(exc) else ""
    return (
        f"cannot load model {model!r}: it is not a local directory and could not be fetched from the "
        f"Hugging Face Hub{cause}. Offline, pass a local checkpoint directory: --model /path/to/checkpoint"
    )


def _weight_files(directory: Path) -> list[Path]:
    for pattern in _WEIGHT_PATTERNS:
        files = sorted(directory.glob(pattern))
        if files:
            return files
    return []


def checkpoint_fingerprint(directory: Path) -> str:
    """sha256 over the weight files from_pretrained would read (names, sizes and contents).

    The result is cached per file identity (path, size, mtime) for the life of the process.

    Raises:
        ModelLoadError: the directory holds no weight files.
    """
    files = _weight_files(directory)
    if not files:
        raise ModelLoadError(f"{directory} holds no model weights (model.safetensors or pytorch_model.bin)")
    digest = hashlib.sha256()
    for path in files:
        # Indexes record this digest: any change to what it covers makes them all report a mismatch.
        digest.update(f"{path.name}\0{path.stat().st_size}\0{file_sha256(path)}\n".encode())
    return "sha256:" + digest.hexdigest()


def read_scalar(directory: Path, name: str, default: float) -> float:
    """The first value of tensor ``name`` in the checkpoint's weights, ``default`` where it has none.

    Read without loading the model: safetensors headers are read and the value memory-mapped;
    torch ``.bin`` files are mapped by ``torch.load(mmap=True)``.
    """
    from ..numpy_text.tower_config import UnsupportedTextTower
    from ..numpy_text.weights import SafetensorsReader

    try:
        reader = SafetensorsReader.for_checkpoint(directory)
    except UnsupportedTextTower:
        import torch

        for path in sorted(directory.glob("pytorch_model*.bin")):
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            if name in state:
                return float(state[name].reshape(-1)[0])
        return default
    return float(reader.float32(name).reshape(-1)[0]) if name in reader else default


def read_model_type(directory: Path, name: str) -> str | None:
    """The ``model_type`` of a checkpoint's ``config.json`` (None where it has none), read as JSON
    so that a family transformers does not know still gets a message naming the supported ones.

    Raises:
        ModelLoadError: ``config.json`` is missing or not a JSON object.
    """
    import json

    try:
        data = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelLoadError(f"{name}: unreadable config.json: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{name}: config.json is not a JSON object")
    value = data.get("model_type")
    return str(value) if value is not None else None
