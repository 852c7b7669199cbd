"""Hugging Face CLIP checkpoints: a hub id or a local directory in, normalised vectors out.

Each tower loads on first use: a text search needs only ``CLIPTextModelWithProjection`` and
never pays for the vision tower, the indexer only ``CLIPVisionModelWithProjection``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidArgumentError, ModelLoadError
from ..images import PreprocessConfig
from . import base
from .base import file_sha256, l2_normalize, quiet_transformers, resolve_device
from .precision import PROBE_TEXTS, Mode, PixelPrecisionMixin, Precision, TowerPrecision, autocast, parse_precision

if TYPE_CHECKING:
    import torch

DEFAULT_MODEL = "openai/clip-vit-base-patch32"

# Weight files from_pretrained reads, in its order of preference.
_WEIGHT_PATTERNS = ("model.safetensors", "model-*-of-*.safetensors", "pytorch_model.bin", "pytorch_model-*-of-*.bin")

# The two places a checkpoint keeps its CLIPImageProcessor settings. The Hub's CLIP checkpoints
# (and CLIPImageProcessor.save_pretrained) write them as the whole of preprocessor_config.json;
# transformers 5's CLIPProcessor.save_pretrained writes no such file but nests them under
# "image_processor" in processor_config.json (beside "processor_class").
PREPROCESSOR_FILE = "preprocessor_config.json"
PROCESSOR_FILE = "processor_config.json"
_NESTED_KEY = "image_processor"


@dataclass(frozen=True)
class ImageProcessorConfig:
    """A checkpoint's ``CLIPImageProcessor`` settings and where they were read from.

    Attributes:
        settings: the ``CLIPImageProcessor`` keys (``size``, ``crop_size``, ``resample``, ...).
        source: the file they came from, :data:`PREPROCESSOR_FILE` or :data:`PROCESSOR_FILE`.
        raw: that file's bytes.
    """

    settings: Mapping[str, Any]
    source: str
    raw: bytes

    def preprocessor_json(self) -> bytes:
        """The settings as a top-level ``preprocessor_config.json`` (the Hub layout).

        The file's own bytes when they came from one; otherwise the nested settings written
        the way ``CLIPImageProcessor.save_pretrained`` writes them (sorted keys, indent 2).
        """
        if self.source == PREPROCESSOR_FILE:
            return self.raw
        return (json.dumps(dict(self.settings), indent=2, sort_keys=True) + "\n").encode("utf-8")


def read_image_processor_config(directory: Path, name: str | None = None) -> ImageProcessorConfig:
    """Read a checkpoint's image preprocessing settings from either layout, as transformers does.

    Same precedence as ``CLIPImageProcessor.from_pretrained`` in transformers 5: an
    ``image_processor`` entry in ``processor_config.json`` wins; otherwise the whole of
    ``preprocessor_config.json``. So the settings are the ones the reference processor uses,
    also for a checkpoint that has both files.

    Args:
        directory: the checkpoint directory.
        name: the model's name for messages (default: the directory).

    Returns:
        The settings with their source file and its bytes.

    Raises:
        ModelLoadError: neither layout is present, or the file is not a JSON object.
    """
    label = name or str(directory)

    def load(filename: str) -> tuple[Any, bytes]:
        raw = (directory / filename).read_bytes()
        try:
            return json.loads(raw.decode("utf-8")), raw
        except (UnicodeDecodeError, ValueError) as exc:
            raise ModelLoadError(f"{label}: unreadable {filename}: {exc}") from exc

    try:
        if (directory / PROCESSOR_FILE).is_file():
            data, raw = load(PROCESSOR_FILE)
            nested = data.get(_NESTED_KEY) if isinstance(data, dict) else None
            if nested is not None:
                if not isinstance(nested, dict):
                    raise ModelLoadError(f"{label}: {PROCESSOR_FILE}: {_NESTED_KEY!r} is not a JSON object")
                return ImageProcessorConfig(nested, PROCESSOR_FILE, raw)
        if (directory / PREPROCESSOR_FILE).is_file():
            data, raw = load(PREPROCESSOR_FILE)
            if not isinstance(data, dict):
                raise ModelLoadError(f"{label}: {PREPROCESSOR_FILE} is not a JSON object")
            return ImageProcessorConfig(data, PREPROCESSOR_FILE, raw)
    except OSError as exc:
        raise ModelLoadError(f"{label}: cannot read its image processor settings: {exc}") from exc
    raise ModelLoadError(
        f"{label} has no {PREPROCESSOR_FILE} (nor image processor settings in {PROCESSOR_FILE}); "
        "cannot know its image preprocessing"
    )


def _looks_like_path(model: str) -> bool:
    # Hub ids are "name" or "org/name"; anything else with a slash can only be a path.
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
    if _looks_like_path(model) or local.exists():
        raise ModelLoadError(f"model checkpoint directory {model!r} does not exist")
    return model, _hub_snapshot(model)


def _hub_snapshot(model: str) -> Path:
    # The cache first, without network; the hub only when it can be reached (huggingface_hub
    # would otherwise retry for ~25 s on a machine without network before failing).
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


class HFClipEncoder(PixelPrecisionMixin):
    """A Hugging Face CLIP checkpoint (``CLIP*WithProjection`` towers loaded lazily).

    Use :meth:`load`; the constructor takes already-resolved parts.
    """

    backend = "hf"

    def __init__(
        self,
        name: str,
        directory: Path,
        config: Any,
        preprocess: PreprocessConfig,
        device: torch.device,
        precision: Precision = "fp32",
        image_processor: ImageProcessorConfig | None = None,
    ) -> None:
        self.name = name
        self.directory = directory
        self.config = config
        self.preprocess = preprocess
        # What ``preprocess`` was read from (None when built by hand), e.g. for finetune's export.
        self.image_processor = image_processor
        self.device = device
        self.dim = int(config.projection_dim)
        self.max_text_length = int(config.text_config.max_position_embeddings)
        self._fingerprint: str | None = None
        self._text_model: Any = None
        self._vision_model: Any = None
        self._tokenizer: Any = None
        self._logit_scale: float | None = None
        # The checkpoint's own input size; set_image_size embeds at another one.
        self.native_image_size = int(config.vision_config.image_size)
        self.embed_image_size = self.native_image_size
        self._native_preprocess = preprocess
        # Separate modules, separate int8 copies: each tower resolves its own mode.
        self.image_precision = TowerPrecision(precision, device)
        self.text_precision = TowerPrecision(precision, device)

    @classmethod
    def load(cls, model: str = DEFAULT_MODEL, device: str = "auto", precision: str = "fp32") -> HFClipEncoder:
        """Open a CLIP checkpoint by hub id or local directory (weights load on first use).

        Args:
            model: hub id such as ``openai/clip-vit-base-patch32`` or a checkpoint directory.
            device: ``auto`` (CUDA when available), ``cpu`` or ``cuda[:N]``.
            precision: ``fp32``, ``bf16``, ``fp16``, ``int8`` or ``auto``, for both towers
                (see :mod:`retrieval.encoders.precision`).

        Raises:
            ModelLoadError: the checkpoint cannot be found or is not a CLIP checkpoint.
            InvalidArgumentError: bad device or precision.
        """
        requested = parse_precision(precision)
        dev = resolve_device(device)
        name, directory = resolve_checkpoint(model)
        try:
            from transformers import CLIPConfig

            with quiet_transformers():
                config = CLIPConfig.from_pretrained(directory)
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"{name} is not a CLIP checkpoint: {str(exc).splitlines()[0]}") from exc
        if getattr(config, "model_type", None) != "clip":
            raise ModelLoadError(f"{name} is not a CLIP checkpoint (model_type={config.model_type!r})")
        processor = read_image_processor_config(directory, name)
        try:
            preprocess = PreprocessConfig.from_hf(processor.settings)
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{name}: unreadable image processor settings in {processor.source}: {exc}") from exc
        return cls(name, directory, config, preprocess, dev, precision=requested, image_processor=processor)

    @property
    def info(self) -> dict[str, Any]:
        """What the index manifest records about the model (``model_info``)."""
        vision = self.config.vision_config
        return {
            "backend": self.backend,
            "checkpoint": self.name,
            "model_type": "clip",
            "image_size": int(vision.image_size),
            "patch_size": int(vision.patch_size),
            "context_length": self.max_text_length,
            "embed_dim": self.dim,
            "embed_image_size": self.embed_image_size,
            **self.image_precision.manifest_info(),
        }

    @property
    def fingerprint(self) -> str:
        """Stable id of the checkpoint's weights (computed once, on first use)."""
        if self._fingerprint is None:
            self._fingerprint = checkpoint_fingerprint(self.directory)
        return self._fingerprint

    def set_image_size(self, size: int) -> None:
        """Embed images at ``size`` x ``size`` pixels instead of the checkpoint's own size: the
        preprocessing is scaled to it and the vision tower interpolates its position embeddings
        (``interpolate_pos_encoding=True``), as ``get_image_features`` does with that flag.

        Raises:
            InvalidArgumentError: not a positive multiple of the patch size.
        """
        patch = int(self.config.vision_config.patch_size)
        if isinstance(size, bool) or not isinstance(size, int) or size < patch or size % patch:
            raise InvalidArgumentError(
                f"image size must be a multiple of {self.name}'s patch size {patch} "
                f"(its own size is {self.native_image_size}), got {size!r}"
            )
        self.preprocess = self._native_preprocess.scaled(size, self.native_image_size)
        self.embed_image_size = size

    def logit_params(self) -> tuple[float, float | None]:
        """``(exp(logit_scale), None)``: the learned temperature of the full CLIP checkpoint.

        Read from the weight files alone (the towers do not hold it); a checkpoint without it
        gets the config's initial value, as ``CLIPModel.from_pretrained`` would initialise it.
        """
        if self._logit_scale is None:
            self._logit_scale = math.exp(_read_scalar(self.directory, "logit_scale", float(self.config.logit_scale_init_value)))
        return self._logit_scale, None

    def _load_tower(self, cls_name: str) -> Any:
        import torch
        import transformers

        model_cls = getattr(transformers, cls_name)
        try:
            with quiet_transformers():
                model, info = model_cls.from_pretrained(
                    self.directory, output_loading_info=True, dtype=torch.float32
                )
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"cannot load {cls_name} from {self.name}: {str(exc).splitlines()[0]}") from exc
        missing = list(info.get("missing_keys") or [])
        if missing:
            # A tower with missing weights would silently embed with random parameters.
            raise ModelLoadError(
                f"{self.name} lacks weights for {cls_name} ({len(missing)} missing, e.g. {missing[0]})"
            )
        return model.eval().to(self.device)

    @property
    def text_model(self) -> Any:
        if self._text_model is None:
            self._text_model = self._load_tower("CLIPTextModelWithProjection")
        return self._text_model

    @property
    def vision_model(self) -> Any:
        if self._vision_model is None:
            self._vision_model = self._load_tower("CLIPVisionModelWithProjection")
        return self._vision_model

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            try:
                from transformers import AutoTokenizer

                with quiet_transformers():
                    self._tokenizer = AutoTokenizer.from_pretrained(self.directory)
            except Exception as exc:  # noqa: BLE001
                raise ModelLoadError(f"cannot load the tokenizer of {self.name}: {str(exc).splitlines()[0]}") from exc
        return self._tokenizer

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """Tokenize like the reference processor: pad to the longest, truncate to the model's length."""
        return self.tokenizer(
            list(texts),
            padding=True,
            truncation=True,
            max_length=self.max_text_length,
            return_tensors="pt",
        )

    def embed_texts(self, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
        """Encode texts to L2-normalised float32 vectors of shape ``(len(texts), dim)``."""

        mode = self.text_precision.calibrate(lambda m: self._embed_texts(PROBE_TEXTS, batch_size, m))
        return self._embed_texts(texts, batch_size, mode)

    def _embed_texts(self, texts: Sequence[str], batch_size: int, mode: Mode) -> np.ndarray:
        import torch

        out = np.empty((len(texts), self.dim), dtype=np.float32)
        model = self.text_precision.module(self.text_model, mode)
        device = torch.device("cpu") if mode == "int8" else self.device
        with torch.inference_mode(), autocast(mode, device):
            for start in range(0, len(texts), batch_size):
                batch = self.tokenize(texts[start : start + batch_size])
                emb = model(
                    input_ids=batch["input_ids"].to(device),
                    attention_mask=batch["attention_mask"].to(device),
                ).text_embeds
                out[start : start + len(emb)] = emb.float().cpu().numpy()
        return l2_normalize(out)

    def _embed_pixels(self, pixel_values: torch.Tensor, mode: Mode) -> np.ndarray:
        import torch

        model = self.image_precision.module(self.vision_model, mode)
        device = torch.device("cpu") if mode == "int8" else self.device
        with torch.inference_mode(), autocast(mode, device):
            # Another input size than the checkpoint's (set_image_size, or an index embedded at
            # one) needs the position embeddings interpolated to the patch grid.
            other_size = tuple(pixel_values.shape[-2:]) != (self.native_image_size, self.native_image_size)
            emb = model(
                pixel_values=pixel_values.to(device, torch.float32, non_blocking=True), interpolate_pos_encoding=other_size
            ).image_embeds
            return l2_normalize(emb.float().cpu().numpy())


def _read_scalar(directory: Path, name: str, default: float) -> float:
    # One scalar out of the weights, without loading the model: safetensors headers are read
    # and the value memory-mapped; torch .bin files are mapped by torch.load(mmap=True).
    from .numpy_text.config import UnsupportedTextTower
    from .numpy_text.weights import SafetensorsReader

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
