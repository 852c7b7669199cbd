"""open_clip models behind the same :class:`~retrieval.encoders.base.Encoder` interface.

A model is named ``open_clip:`` followed by one of::

    ARCH/TAG                  built-in architecture with open_clip's pretrained weights
                              (e.g. ViT-B-32/laion2b_s34b_b79k; cached or downloaded)
    ARCH@/path/weights.pt     built-in architecture with local weights
    ARCH/TAG@/path/weights    local copy of TAG's weights, with TAG's preprocessing
    /path/arch.json@/path/w   an architecture given as an open_clip model-config JSON file
    hf-hub:ORG/NAME           an open_clip repository on the Hugging Face Hub
    local-dir:/path/dir       a directory with open_clip_config.json and the weights

Images go through open_clip's own preprocessing (``PreprocessCfg`` mapped onto
:class:`~retrieval.images.PreprocessConfig`) and texts through open_clip's own tokenizer, so
embeddings equal ``model.encode_image(preprocess(img))`` / ``model.encode_text(tokenizer(t))``.

Loading resolves the name, the weights file, the embedding size and the preprocessing without
building the model; the model is built on the first embedding call (open_clip builds both
towers; a text query runs only the text tower).
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import hashlib
import json
import logging
import os
import socket
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ...errors import InvalidArgumentError, ModelLoadError
from ...images import PreprocessConfig
from .. import base
from ..base import file_sha256, first_line, l2_normalize, quiet_transformers, resolve_device
from ..precision import PROBE_TEXTS, PixelPrecisionMixin, TowerPrecision, autocast, check_precision

if TYPE_CHECKING:
    import torch

LOG = logging.getLogger(__name__)

PREFIX = "open_clip:"
HF_HUB = "hf-hub:"
LOCAL_DIR = "local-dir:"

CONFIG_FILE = "open_clip_config.json"
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

_USAGE = (
    "name an open_clip model as open_clip:ARCH/TAG (e.g. open_clip:ViT-B-32/laion2b_s34b_b79k), "
    "open_clip:ARCH@/path/to/weights.pt, open_clip:hf-hub:ORG/NAME or open_clip:local-dir:/path/to/dir"
)
_LOCAL_HINT = "pass a local checkpoint: --model open_clip:ARCH@/path/to/weights.pt (or open_clip:local-dir:/path/to/dir)"
_TOKENIZER_HINT = (
    "pass a local checkpoint directory holding the open_clip config, the weights and the tokenizer files: "
    "--model open_clip:local-dir:/path/to/dir"
)

T = TypeVar("T")


def is_open_clip_name(model: str) -> bool:
    """True when ``model`` names an open_clip model (``open_clip:...``)."""
    return model.startswith(PREFIX)


@dataclass(frozen=True)
class OpenClipSpec:
    """A parsed ``open_clip:...`` model name.

    Attributes:
        kind: ``"tag"`` (built-in weights), ``"file"`` (local weights file), ``"hub"``
            (Hugging Face repository) or ``"dir"`` (local open_clip directory).
        architecture: built-in architecture name, or None.
        arch_file: absolute path of a model-config JSON file used as the architecture, or None.
        pretrained: open_clip pretrained tag (normalised like open_clip does), or None.
        weights: absolute path of the local weights file (kind ``"file"``), or None.
        hub_id: ``ORG/NAME`` (kind ``"hub"``), or None.
        directory: absolute path of the open_clip directory (kind ``"dir"``), or None.
    """

    kind: str
    architecture: str | None = None
    arch_file: Path | None = None
    pretrained: str | None = None
    weights: Path | None = None
    hub_id: str | None = None
    directory: Path | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("tag", "file", "hub", "dir"):
            raise ValueError(f"unknown open_clip spec kind {self.kind!r}")

    @property
    def arch_label(self) -> str:
        """How the architecture is written in the name (built-in name or config file path)."""
        return self.architecture if self.architecture is not None else str(self.arch_file)

    @property
    def name(self) -> str:
        """Canonical name: absolute paths, normalised tag; loading it gives the same model."""
        if self.kind == "hub":
            return f"{PREFIX}{HF_HUB}{self.hub_id}"
        if self.kind == "dir":
            return f"{PREFIX}{LOCAL_DIR}{self.directory}"
        arch = self.arch_label + (f"/{self.pretrained}" if self.pretrained else "")
        return f"{PREFIX}{arch}@{self.weights}" if self.kind == "file" else f"{PREFIX}{arch}"


def parse_spec(model: str) -> OpenClipSpec:
    """Parse an ``open_clip:...`` name (syntax and local paths only; no model lookup).

    Raises:
        InvalidArgumentError: not an open_clip name, or malformed.
        ModelLoadError: a named local file or directory does not exist.
    """
    if not is_open_clip_name(model):
        raise InvalidArgumentError(f"{model!r} is not an open_clip model name; {_USAGE}")
    rest = model[len(PREFIX) :].strip()
    if not rest:
        raise InvalidArgumentError(f"{model!r} names no model; {_USAGE}")
    if rest.startswith(HF_HUB):
        hub_id = rest[len(HF_HUB) :].strip("/")
        parts = hub_id.split("/")
        if len(parts) != 2 or not all(parts):
            raise InvalidArgumentError(f"{model!r}: expected open_clip:hf-hub:ORG/NAME")
        return OpenClipSpec(kind="hub", hub_id=hub_id)
    if rest.startswith(LOCAL_DIR):
        directory = Path(rest[len(LOCAL_DIR) :]).expanduser()
        if not directory.is_dir():
            raise ModelLoadError(f"open_clip model directory {str(directory)!r} does not exist")
        directory = directory.resolve()
        if not (directory / CONFIG_FILE).is_file():
            raise ModelLoadError(f"{directory} is not an open_clip model directory: it has no {CONFIG_FILE}")
        return OpenClipSpec(kind="dir", directory=directory)
    # A config-file architecture may contain '@' in its path; split after ".json" then.
    cut = rest.find(".json@")
    if cut >= 0:
        arch_part, weights_part = rest[: cut + 5], rest[cut + 6 :]
    elif "@" in rest:
        arch_part, weights_part = rest.split("@", 1)
    else:
        arch_part, weights_part = rest, None
    architecture, pretrained, arch_file = _parse_arch(arch_part, model)
    if weights_part is None:
        if arch_file is not None:
            raise InvalidArgumentError(f"{model!r} has an architecture but no weights: use open_clip:{arch_part}@/path/to/weights.pt")
        if pretrained is None:
            raise InvalidArgumentError(
                f"{model!r} names an architecture without weights: use open_clip:{architecture}/TAG with one of "
                f"its pretrained tags ({_tags_text(architecture)}), or open_clip:{architecture}@/path/to/weights.pt"
            )
        return OpenClipSpec(kind="tag", architecture=architecture, pretrained=pretrained)
    if not weights_part.strip():
        raise InvalidArgumentError(f"{model!r}: nothing after '@'; expected a weights file path")
    weights = Path(weights_part).expanduser()
    if not weights.is_file():
        what = "is a directory, not a weights file" if weights.is_dir() else "does not exist"
        raise ModelLoadError(f"open_clip weights file {weights_part!r} {what}")
    return OpenClipSpec(kind="file", architecture=architecture, arch_file=arch_file, pretrained=pretrained, weights=weights.resolve())


def _parse_arch(text: str, model: str) -> tuple[str | None, str | None, Path | None]:
    """``ARCH``, ``ARCH/TAG`` or a config JSON path -> (architecture, tag, config file)."""
    text = text.strip()
    if text.endswith(".json"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise ModelLoadError(f"open_clip architecture config file {text!r} does not exist")
        return None, None, path.resolve()
    arch, _, tag = text.partition("/")
    if not arch or (_ and not tag) or "/" in tag:
        raise InvalidArgumentError(f"{model!r}: expected ARCH or ARCH/TAG before '@' or at the end; {_USAGE}")
    return arch, (_clean_tag(tag) if tag else None), None


def _clean_tag(tag: str) -> str:
    # open_clip looks tags up lower-cased with '-' as '_'; the canonical name does the same.
    return tag.strip().lower().replace("-", "_")


def _tags_text(architecture: str) -> str:
    import open_clip

    tags = open_clip.list_pretrained_tags_by_model(architecture)
    return ", ".join(tags) if tags else "open_clip has none for it"


def _check_architecture(architecture: str) -> dict[str, Any]:
    """The built-in config of ``architecture``; a clear error naming close matches otherwise."""
    import open_clip

    cfg = open_clip.get_model_config(architecture)
    if cfg is None:
        close = difflib.get_close_matches(architecture, open_clip.list_models(), n=5, cutoff=0.6)
        maybe = f" Close matches: {', '.join(close)}." if close else ""
        raise ModelLoadError(
            f"unknown open_clip architecture {architecture!r}.{maybe} List the architectures with "
            "`python -c \"import open_clip; print(open_clip.list_models())\"` and their pretrained weights with "
            "`python -c \"import open_clip; print(open_clip.list_pretrained())\"`"
        )
    return cfg


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


# -- the encoder ------------------------------------------------------------------------------


class OpenClipEncoder(PixelPrecisionMixin):
    """An open_clip model (built on first use).

    Use :meth:`load`; the constructor takes already-resolved parts.
    """

    backend = "open_clip"

    def __init__(
        self,
        spec: OpenClipSpec,
        model_cfg: Mapping[str, Any],
        preprocess_cfg: Mapping[str, Any],
        weights: Path,
        device: torch.device,
        precision: str = "fp32",
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.model_cfg = copy.deepcopy(dict(model_cfg))
        # open_clip's own PreprocessCfg as a dict: what the model was trained with.
        self.preprocess_cfg = dict(preprocess_cfg)
        self.weights = weights
        self.device = device
        try:
            self.preprocess = PreprocessConfig.from_open_clip(self.preprocess_cfg)
            self.dim = int(self.model_cfg["embed_dim"])
            self.max_text_length = int(self.model_cfg["text_cfg"].get("context_length", 77))
        except (ValueError, TypeError, KeyError) as exc:
            raise ModelLoadError(f"{self.name}: unsupported open_clip configuration: {exc}") from exc
        self._fingerprint: str | None = None
        self._model: Any = None
        self._tokenizer: Any = None
        self._registered: str | None = None
        # One module holds both towers: one int8 copy serves both.
        variants: dict[str, Any] = {}
        self.image_precision = TowerPrecision(precision, device, variants)
        self.text_precision = TowerPrecision(precision, device, variants)

    @classmethod
    def load(cls, model: str, device: str = "auto", precision: str = "fp32") -> OpenClipEncoder:
        """Resolve an ``open_clip:...`` name: weights file, embedding size, preprocessing.

        Args:
            model: see the module docs for the forms.
            device: ``auto`` (CUDA when available), ``cpu`` or ``cuda[:N]``.
            precision: ``fp32``, ``bf16``, ``fp16``, ``int8`` or ``auto`` for both towers.

        Raises:
            InvalidArgumentError: malformed name, bad device or precision.
            ModelLoadError: unknown architecture or tag, missing files, or weights that are not
                cached and cannot be downloaded.
        """
        check_precision(precision)
        dev = resolve_device(device)
        spec = parse_spec(model)
        try:
            import open_clip
            from open_clip.transform import PreprocessCfg, merge_preprocess_dict
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise ModelLoadError(f"open_clip models need the open_clip_torch package: {first_line(exc)}") from exc

        overlay: dict[str, Any] = {}
        if spec.kind in ("hub", "dir"):
            if spec.kind == "hub":
                config_file, weights = _hub_files(spec.name, spec.hub_id or "")
            else:
                config_file = (spec.directory or Path()) / CONFIG_FILE
                weights = _dir_weights(spec.directory or Path())
            model_cfg, overlay = _read_dir_config(config_file, spec.name)
            model_cfg = _check_model_cfg(model_cfg, str(config_file))
        elif spec.arch_file is not None:
            model_cfg, overlay = _read_arch_file(spec.arch_file, spec.name)
            model_cfg = _check_model_cfg(model_cfg, str(spec.arch_file))
            weights = spec.weights or Path()
        else:
            architecture = spec.architecture or ""
            model_cfg = _check_architecture(architecture)
            if spec.pretrained is not None:
                overlay = open_clip.get_pretrained_cfg(architecture, spec.pretrained)
                if not overlay:
                    raise ModelLoadError(
                        f"open_clip has no pretrained tag {spec.pretrained!r} for {architecture}; "
                        f"its tags: {_tags_text(architecture)}"
                    )
                _warn_quick_gelu(spec, model_cfg, overlay)
            elif _tags_preprocess_differently(architecture):
                LOG.warning(
                    "%s: local weights without a tag get open_clip's default preprocessing, but %s's pretrained "
                    "tags use their own; if these are a tag's weights, name it: open_clip:%s/TAG@%s",
                    spec.name, architecture, architecture, spec.weights,
                )
            weights = spec.weights if spec.kind == "file" else _tag_weights(spec.name, architecture, spec.pretrained or "", overlay)
        preprocess = merge_preprocess_dict(PreprocessCfg(), overlay)
        # create_model sets the size from the built vision tower, which takes it from vision_cfg.
        size = model_cfg["vision_cfg"].get("image_size", 224)
        preprocess["size"] = tuple(size) if isinstance(size, (list, tuple)) else (int(size), int(size))
        return cls(spec, model_cfg, preprocess, Path(weights), dev, precision=precision)

    # -- identity -------------------------------------------------------------------------------

    @property
    def _arch_identity(self) -> str:
        # Built-ins by name (stable across open_clip versions, which may add config keys);
        # config files and directories by content.
        if self.spec.architecture is not None and self.spec.kind in ("tag", "file"):
            return f"builtin:{self.spec.architecture}"
        canonical = json.dumps(self.model_cfg, sort_keys=True, separators=(",", ":"))
        return "config:" + hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def fingerprint(self) -> str:
        """sha256 over the architecture and the weights' contents (computed once, on first use).

        The same weights loaded under another spelling (a relative path, a copy of the file)
        give the same fingerprint; the same weights under another architecture (e.g. a
        ``-quickgelu`` variant, which computes different embeddings) do not.

        Raises:
            ModelLoadError: the weights file cannot be read.
        """
        if self._fingerprint is None:
            try:
                weights_hash = file_sha256(self.weights)
            except OSError as exc:
                raise ModelLoadError(f"{self.name}: cannot read the weights file {self.weights}: {exc.strerror}") from exc
            digest = hashlib.sha256(f"open_clip\0{self._arch_identity}\0{weights_hash}\n".encode())
            self._fingerprint = "sha256:" + digest.hexdigest()
        return self._fingerprint

    @property
    def info(self) -> dict[str, Any]:
        """What the index manifest records about the model (``model_info``)."""
        from open_clip import __version__ as oc_version

        weights_hash = file_sha256(self.weights) if self.weights.is_file() else None
        return {
            "backend": self.backend,
            "source": self.spec.kind,
            "architecture": self.spec.architecture,
            "architecture_file": str(self.spec.arch_file) if self.spec.arch_file else None,
            "pretrained": self.spec.pretrained,
            "hf_hub": self.spec.hub_id,
            "local_dir": str(self.spec.directory) if self.spec.directory else None,
            "weights": str(self.weights),
            "weights_sha256": weights_hash,
            "model_cfg": self.model_cfg,
            "preprocess_cfg": {k: list(v) if isinstance(v, tuple) else v for k, v in self.preprocess_cfg.items()},
            "context_length": self.max_text_length,
            "open_clip_version": oc_version,
            **self.image_precision.manifest_info(),
        }

    # -- lazy parts -----------------------------------------------------------------------------

    def _arch_name(self) -> str:
        """A name ``open_clip.create_model`` knows for this architecture."""
        import open_clip

        if self.spec.architecture is not None and self.spec.kind in ("tag", "file"):
            return self.spec.architecture
        if self.spec.kind == "dir":
            return f"local-dir:{self.spec.directory}"
        if self.spec.kind == "hub":
            return f"local-dir:{self.weights.parent}"
        if self._registered is None:
            # A config file: register it under a name derived from its content (never one of
            # open_clip's own names), which is open_clip's documented way to add architectures.
            name = "clipsearch-" + self._arch_identity.split(":", 1)[1][:16]
            if open_clip.get_model_config(name) is None:
                import atexit
                import shutil
                import tempfile

                folder = Path(tempfile.mkdtemp(prefix="clipsearch-open_clip-"))
                # Kept until exit: open_clip may rescan its config paths when others add theirs.
                atexit.register(shutil.rmtree, folder, True)
                (folder / f"{name}.json").write_text(json.dumps(self.model_cfg), encoding="utf-8")
                open_clip.add_model_config(folder / f"{name}.json")
            self._registered = name
        return self._registered

    @property
    def model(self) -> Any:
        """The open_clip model in eval mode, built and loaded on first use.

        Raises:
            ModelLoadError: the weights do not fit the architecture, or building failed.
        """
        if self._model is None:
            self._model = self._build()
        return self._model

    def _build(self) -> Any:
        import open_clip

        arch = self._arch_name()
        force = {k: v for k, v in self.preprocess_cfg.items() if k != "size"}

        def create() -> Any:
            with _quiet_open_clip():
                return open_clip.create_model(
                    arch,
                    pretrained=None,
                    load_weights=False,
                    pretrained_image=False,
                    pretrained_text=False,
                    device=self.device,
                    precision="fp32",
                    force_preprocess_cfg=force,
                )

        if "hf_model_name" in self.model_cfg.get("text_cfg", {}):
            # A text tower built from a Hugging Face model reads that model's config (cache or hub).
            hf_name = self.model_cfg["text_cfg"]["hf_model_name"]
            model = _fetch(
                self.name,
                f"text tower config ({hf_name})",
                create,
                hint=f"its text tower needs the Hugging Face model {hf_name} in the local Hugging Face cache",
            )
        else:
            try:
                model = create()
            except Exception as exc:  # noqa: BLE001 - a bad config fails in many ways
                raise ModelLoadError(f"{self.name}: cannot build architecture {self.spec.arch_label}: {first_line(exc)}") from exc
        try:
            with _quiet_open_clip():
                open_clip.load_checkpoint(model, str(self.weights), strict=True, weights_only=True, device="cpu")
        except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError, pickling errors, ...
            raise ModelLoadError(
                f"{self.name}: cannot load {self.weights} into architecture {self.spec.arch_label}: {first_line(exc)}"
            ) from exc
        model = model.to(self.device).eval()
        built = PreprocessConfig.from_open_clip(open_clip.get_model_preprocess_cfg(model))
        if built != self.preprocess:
            # Our preprocessing comes from the configs before building; a newer open_clip that
            # derives it differently must not silently index with other pixels.
            raise ModelLoadError(
                f"{self.name}: open_clip built the model with preprocessing {built}, expected {self.preprocess}"
            )
        return model

    @property
    def tokenizer(self) -> Any:
        """open_clip's tokenizer for this model (``open_clip.get_tokenizer``), on first use.

        Raises:
            ModelLoadError: a Hugging Face tokenizer that is not cached and cannot be fetched.
        """
        if self._tokenizer is None:
            import open_clip

            name = f"{HF_HUB}{self.spec.hub_id}" if self.spec.kind == "hub" else self._arch_name()
            with _quiet_open_clip():
                self._tokenizer = _fetch(
                    self.name,
                    "tokenizer",
                    lambda: open_clip.get_tokenizer(name, context_length=self.max_text_length),
                    hint=_TOKENIZER_HINT,
                )
        return self._tokenizer

    # -- embedding ------------------------------------------------------------------------------

    def embed_texts(self, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
        """Encode texts to L2-normalised float32 vectors of shape ``(len(texts), dim)``.

        Texts longer than the model's context are truncated by open_clip's tokenizer.
        """

        mode = self.text_precision.calibrate(lambda m: self._embed_texts(PROBE_TEXTS, batch_size, m))
        return self._embed_texts(texts, batch_size, mode)

    def _embed_texts(self, texts: Sequence[str], batch_size: int, mode: str) -> np.ndarray:
        import torch

        out = np.empty((len(texts), self.dim), dtype=np.float32)
        tokenizer, model = self.tokenizer, self.text_precision.module(self.model, mode)
        device = torch.device("cpu") if mode == "int8" else self.device
        with torch.inference_mode(), autocast(mode, device):
            for start in range(0, len(texts), batch_size):
                tokens = tokenizer(list(texts[start : start + batch_size]))
                emb = model.encode_text(tokens.to(device))
                out[start : start + len(emb)] = emb.float().cpu().numpy()
        return l2_normalize(out)

    def _embed_pixels(self, pixel_values: torch.Tensor, mode: str) -> np.ndarray:
        import torch

        model = self.image_precision.module(self.model, mode)
        device = torch.device("cpu") if mode == "int8" else self.device
        with torch.inference_mode(), autocast(mode, device):
            emb = model.encode_image(pixel_values.to(device, torch.float32, non_blocking=True))
            return l2_normalize(emb.float().cpu().numpy())


def _tags_preprocess_differently(architecture: str) -> bool:
    """Whether some pretrained tag of ``architecture`` uses other preprocessing than the default."""
    import open_clip
    from open_clip.transform import PreprocessCfg, merge_preprocess_dict

    default = merge_preprocess_dict(PreprocessCfg(), {})
    for tag in open_clip.list_pretrained_tags_by_model(architecture):
        merged = merge_preprocess_dict(PreprocessCfg(), open_clip.get_pretrained_cfg(architecture, tag))
        if {k: tuple(v) if isinstance(v, list) else v for k, v in merged.items()} != default:
            return True
    return False


def _warn_quick_gelu(spec: OpenClipSpec, model_cfg: Mapping[str, Any], pretrained_cfg: Mapping[str, Any]) -> None:
    # open_clip only warns too: the weights load either way but give other embeddings than the
    # ones they were trained for.
    wanted, built = bool(pretrained_cfg.get("quick_gelu", False)), bool(model_cfg.get("quick_gelu", False))
    if wanted != built:
        other = f"{spec.architecture}-quickgelu" if wanted else (spec.architecture or "").removesuffix("-quickgelu")
        LOG.warning(
            "%s: tag %r was trained with quick_gelu=%s but %s uses quick_gelu=%s (as open_clip does, the model is "
            "built as named); open_clip:%s/%s is probably what you want",
            spec.name, spec.pretrained, wanted, spec.architecture, built, other, spec.pretrained,
        )


class _OpenClipLogFilter(logging.Filter):
    """Drops records logged from inside the open_clip package (it logs on the root logger)."""

    def __init__(self, package_dir: str) -> None:
        super().__init__()
        self.package_dir = package_dir

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.pathname.startswith(self.package_dir)


@contextlib.contextmanager
def _quiet_open_clip() -> Iterator[None]:
    """Keep open_clip's progress chatter (and its 'initialized randomly' warning, which is
    about the step before our weights load) off the user's terminal and logging config."""
    import open_clip

    root = logging.getLogger()
    log_filter = _OpenClipLogFilter(os.path.dirname(open_clip.__file__))
    # logging.warning() on a root logger without handlers installs a stderr handler for good.
    guard = logging.NullHandler() if not root.handlers else None
    if guard is not None:
        root.addHandler(guard)
    root.addFilter(log_filter)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.removeFilter(log_filter)
        if guard is not None:
            root.removeHandler(guard)


__all__ = ["OpenClipEncoder", "OpenClipSpec", "PREFIX", "is_open_clip_name", "parse_spec"]
