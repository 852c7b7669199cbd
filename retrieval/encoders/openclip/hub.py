"""Where an open_clip model's files come from: the local cache first, the network only when
it can be reached; then reading the config files they hold.

Built-in tags download through open_clip (from the Hugging Face Hub or a plain URL), Hub
repositories through huggingface_hub, local directories are read as they are.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from ...errors import ModelLoadError
from .. import base
from ..base import first_line, quiet_transformers
from .names import CONFIG_FILE

# Weight files of an open_clip repository or directory, in open_clip's order of preference.
_DIR_WEIGHTS = (
    "open_clip_model.safetensors",
    "open_clip_pytorch_model.safetensors",
    "open_clip_pytorch_model.bin",
    "open_clip_pytorch_model.pth",
    "model.safetensors",
    "pytorch_model.bin",
    "pytorch_model.pth",
    "model.pth",
)
_HUB_WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")

# A plain URL download (open_clip uses urllib without a timeout) must not hang forever.
_URL_TIMEOUT_S = 60.0

_LOCAL_HINT = "pass a local checkpoint: --model open_clip:ARCH@/path/to/weights.pt (or open_clip:local-dir:/path/to/dir)"
_TOKENIZER_HINT = (
    "pass a local checkpoint directory holding the open_clip config, the weights and the tokenizer files: "
    "--model open_clip:local-dir:/path/to/dir"
)

T = TypeVar("T")


# -- fetching files: the cache first, the network only when it can be reached ------------------


def _fetch(
    model: str,
    what: str,
    fetch: Callable[[], T],
    *,
    url: str | None = None,
    cached: Callable[[], bool] | None = None,
    hint: str = _LOCAL_HINT,
) -> T:
    """Run ``fetch`` from the local cache first, then online if the source can be reached.

    Args:
        model: the model name, for messages.
        what: what is being fetched, for messages (e.g. "weights (timm/ViT-B-16-SigLIP)").
        fetch: does the work through huggingface_hub / open_clip.
        url: set when the source is a plain URL rather than the Hugging Face Hub.
        cached: for a URL, whether its file is already in the local cache.
        hint: what to do offline, ending the error message.

    Raises:
        ModelLoadError: not cached and the source cannot be reached, or the download failed.
    """
    first: BaseException | None = None
    if url is None or (cached is not None and cached()):
        try:
            # Hub: switch huggingface_hub to cache-only. URL: cached files need no network.
            offline = base.hub_offline() if url is None else _socket_timeout(_URL_TIMEOUT_S)
            with quiet_transformers(), offline:
                return fetch()
        except Exception as exc:  # noqa: BLE001 - hub errors come in many types; the cause is kept
            first = exc
    reachable = base.url_reachable(url) if url is not None else base.hub_reachable()
    if not reachable:
        source = "its download host" if url is not None else "the Hugging Face Hub"
        # The cache miss itself (kept as __cause__) is long and says nothing more.
        raise ModelLoadError(
            f"cannot load model {model!r}: its {what} could not be found in the local cache and {source} "
            f"cannot be reached from this machine. Offline, {hint}"
        ) from first
    try:
        with quiet_transformers(), _socket_timeout(_URL_TIMEOUT_S):
            return fetch()
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(
            f"cannot load model {model!r}: its {what} could not be fetched ({first_line(exc)}). Offline, {hint}"
        ) from exc


@contextlib.contextmanager
def _socket_timeout(seconds: float) -> Iterator[None]:
    # urllib.request.urlopen without a timeout blocks forever on a stalled connection; this is
    # the only handle on it. huggingface_hub sets its own timeouts and is unaffected.
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)


def _tag_weights(model: str, architecture: str, tag: str, pretrained_cfg: Mapping[str, Any]) -> Path:
    """The local file of a pretrained tag's weights, downloaded if needed (as open_clip would)."""
    from open_clip import pretrained as oc_pretrained

    if pretrained_cfg.get("file"):
        path = Path(pretrained_cfg["file"])
        if not path.is_file():
            raise ModelLoadError(f"{model}: the weights file {path} of tag {tag!r} does not exist")
        return path
    hub = pretrained_cfg.get("hf_hub") or ""
    url = pretrained_cfg.get("url") or ""
    # open_clip prefers the Hub whenever an entry has one and huggingface_hub is installed.
    use_hub = bool(hub) and oc_pretrained.has_hf_hub()
    if not use_hub and not url:
        raise ModelLoadError(f"{model}: open_clip knows tag {tag!r} of {architecture} but not where its weights are")
    what = f"weights ({hub.rstrip('/')})" if use_hub else f"weights ({url})"
    cfg = dict(pretrained_cfg)
    if use_hub:
        cfg["url"] = ""
    # open_clip keeps URL downloads in ~/.cache/clip (and checks their sha256 itself).
    url_file = Path(os.path.expanduser("~/.cache/clip")) / os.path.basename(url)
    target = _fetch(
        model,
        what,
        lambda: oc_pretrained.download_pretrained(cfg),
        url=None if use_hub else url,
        cached=None if use_hub else url_file.is_file,
    )
    if not target or not Path(target).is_file():
        raise ModelLoadError(f"{model}: open_clip returned no weights file for tag {tag!r}")
    return Path(target)


def _hub_files(model: str, hub_id: str) -> tuple[Path, Path]:
    """(open_clip_config.json, weights file) of a Hub repository, from the cache or the Hub."""

    def fetch() -> tuple[Path, Path]:
        from huggingface_hub import hf_hub_download

        config = Path(hf_hub_download(hub_id, CONFIG_FILE))
        last: BaseException | None = None
        for name in _HUB_WEIGHTS:
            try:
                return config, Path(hf_hub_download(hub_id, name))
            except Exception as exc:  # noqa: BLE001
                last = exc
        raise FileNotFoundError(f"{hub_id} has none of {', '.join(_HUB_WEIGHTS)}") from last

    return _fetch(model, f"config and weights ({hub_id})", fetch)


def _dir_weights(directory: Path) -> Path:
    """The weights file open_clip would load from an open_clip directory."""
    for name in _DIR_WEIGHTS:
        if (directory / name).is_file():
            return directory / name
    found = sorted(
        (p for pattern in ("*.safetensors", "*.bin", "*.pth") for p in directory.glob(pattern)),
        key=lambda p: (p.suffix != ".safetensors", p.name),
    )
    if not found:
        raise ModelLoadError(f"{directory} holds no open_clip weights (*.safetensors, *.bin or *.pth)")
    return found[0]


def _read_dir_config(path: Path, model: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model_cfg, preprocess_cfg) of an ``open_clip_config.json``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{model}: cannot read {path}: {first_line(exc)}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("model_cfg"), dict):
        raise ModelLoadError(f"{model}: {path} has no 'model_cfg'; it is not an open_clip config")
    return data["model_cfg"], dict(data.get("preprocess_cfg") or {})


def _read_arch_file(path: Path, model: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model_cfg, preprocess_cfg) of an architecture JSON: a bare model config or a full config."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{model}: cannot read {path}: {first_line(exc)}") from exc
    if isinstance(data, dict) and isinstance(data.get("model_cfg"), dict):
        return data["model_cfg"], dict(data.get("preprocess_cfg") or {})
    return data, {}


def _check_model_cfg(cfg: Any, where: str) -> dict[str, Any]:
    if not isinstance(cfg, dict) or not all(k in cfg for k in ("embed_dim", "vision_cfg", "text_cfg")):
        raise ModelLoadError(f"{where} is not an open_clip model config: it needs embed_dim, vision_cfg and text_cfg")
    return cfg
