"""open_clip models behind the same ``Encoder`` interface as :mod:`retrieval.encoders.hf.encoder`.

See :mod:`retrieval.encoders.openclip` for how a model is named.

Images go through open_clip's own preprocessing (``PreprocessCfg`` mapped onto
:class:`~retrieval.images.PreprocessConfig`) and texts through open_clip's own tokenizer, so
embeddings equal ``model.encode_image(preprocess(img))`` / ``model.encode_text(tokenizer(t))``.

Loading resolves the name, the weights file, the embedding size and the preprocessing without
building the model; the model is built on the first embedding call (open_clip builds both
towers; a text query runs only the text tower).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import InvalidArgumentError, ModelLoadError
from ...images import PreprocessConfig
from ..base import file_sha256, first_line, l2_normalize, resolve_device
from ..chunking import grid_tokens, images_per_call, in_calls
from ..languages import check_language, language_codes, set_language
from ..precision import PROBE_TEXTS, Mode, PixelPrecisionMixin, Precision, TowerPrecision, autocast, parse_precision
from .hub import (
    _TOKENIZER_HINT,
    _check_model_cfg,
    _dir_weights,
    _fetch,
    _hub_files,
    _read_arch_file,
    _read_dir_config,
    _tag_weights,
)
from .names import CONFIG_FILE, HF_HUB, OpenClipSpec, _check_architecture, _tags_text, parse_spec
from .quiet import _quiet_open_clip

if TYPE_CHECKING:
    import torch

# The package's name, not this module's: a logging config may filter on it.
LOG = logging.getLogger(__package__)


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
        precision: Precision = "fp32",
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
        # A tokenizer told a query language (NLLB) is shared state: one language per call.
        self._tokenize_lock = threading.Lock()
        self._registered: str | None = None
        # One module holds both towers: one int8 copy serves both.
        variants: dict[str, Any] = {}
        self.image_precision = TowerPrecision(precision, device, variants)
        self.text_precision = TowerPrecision(precision, device, variants, tower="text")

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
        requested = parse_precision(precision)
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
            weights = (
                (spec.weights or Path()) if spec.kind == "file" else _tag_weights(spec.name, architecture, spec.pretrained or "", overlay)
            )
        preprocess = merge_preprocess_dict(PreprocessCfg(), overlay)
        # create_model sets the size from the built vision tower, which takes it from vision_cfg.
        size = model_cfg["vision_cfg"].get("image_size", 224)
        preprocess["size"] = tuple(size) if isinstance(size, (list, tuple)) else (int(size), int(size))
        return cls(spec, model_cfg, preprocess, Path(weights), dev, precision=requested)

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

    def set_image_size(self, size: int) -> None:
        """Only the model's own input size: open_clip towers are not interpolated here.

        Raises:
            InvalidArgumentError: any other size.
        """
        native = self.preprocess.input_size[0]
        if size != native:
            raise InvalidArgumentError(
                f"--image-size needs a Hugging Face CLIP checkpoint; {self.name} embeds at its own {native} px only"
            )

    def logit_params(self) -> tuple[float, float | None]:
        """``(exp(logit_scale), logit_bias)`` of the open_clip model (bias only for SigLIP-style models)."""
        model = self.model
        bias = getattr(model, "logit_bias", None)
        return float(model.logit_scale.detach().exp().item()), None if bias is None else float(bias.detach().reshape(-1)[0].item())

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

    @property
    def family_name(self) -> None:
        """open_clip models are matched by their weights, not by a family."""
        return None

    @property
    def query_languages(self) -> tuple[str, ...]:
        """The language codes the text tokenizer must be told (NLLB's FLORES-200 codes); ()
        for a tokenizer that reads any language as it is (see :mod:`..languages`)."""
        return language_codes(getattr(self.tokenizer, "tokenizer", None))

    # -- embedding ------------------------------------------------------------------------------

    def embed_texts(self, texts: Sequence[str], batch_size: int = 256, *, language: str | None = None) -> np.ndarray:
        """Encode texts to L2-normalised float32 vectors of shape ``(len(texts), dim)``.

        Texts longer than the model's context are truncated by open_clip's tokenizer.
        ``language``: the texts' FLORES-200 code, for a model whose tokenizer needs one
        (:attr:`query_languages`); ignored by the others.

        Raises:
            InvalidArgumentError: the model needs a language and none (or an unknown one) was given.
        """
        lang = check_language(self.name, self.query_languages, language)
        # The gate's probes are English prompts.
        probe_lang = "eng_Latn" if lang is not None and "eng_Latn" in self.query_languages else lang
        mode = self.text_precision.calibrate(lambda m: self._embed_texts(PROBE_TEXTS, batch_size, m, probe_lang))
        return self._embed_texts(texts, batch_size, mode, lang)

    def _embed_texts(self, texts: Sequence[str], batch_size: int, mode: Mode, language: str | None = None) -> np.ndarray:
        import torch

        out = np.empty((len(texts), self.dim), dtype=np.float32)
        tokenizer, model = self.tokenizer, self.text_precision.module(self.model, mode)
        device = torch.device("cpu") if mode == "int8" else self.device
        with torch.inference_mode(), autocast(mode, device):
            for start in range(0, len(texts), batch_size):
                with self._tokenize_lock:
                    if language is not None:
                        set_language(tokenizer.tokenizer, language)
                    tokens = tokenizer(list(texts[start : start + batch_size]))
                emb = model.encode_text(tokens.to(device))
                out[start : start + len(emb)] = emb.float().cpu().numpy()
        return l2_normalize(out)

    def _embed_pixels(self, pixel_values: torch.Tensor, mode: Mode) -> np.ndarray:
        import torch

        device = torch.device("cpu") if mode == "int8" else self.device
        per_call = self._images_per_call(pixel_values) if device.type == "cpu" else None
        if per_call is not None and len(pixel_values) > per_call:
            return in_calls(pixel_values, per_call, lambda part: self._embed_pixels(part, mode))
        model = self.image_precision.module(self.model, mode)
        with torch.inference_mode(), autocast(mode, device):
            emb = model.encode_image(pixel_values.to(device, torch.float32, non_blocking=True))
            return l2_normalize(emb.float().cpu().numpy())

    def _images_per_call(self, pixel_values: torch.Tensor) -> int | None:
        """Images per CPU forward pass (:mod:`..chunking`) of a ViT tower; None (one call) for a
        tower without a patch grid and MLP width to read (e.g. a ResNet)."""
        visual = self.model.visual
        patch = getattr(visual, "patch_size", None)
        blocks = getattr(getattr(visual, "transformer", None), "resblocks", None)
        fc = getattr(getattr(blocks[0], "mlp", None), "c_fc", None) if blocks else None
        width = getattr(fc, "out_features", None)
        if not isinstance(patch, tuple) or not isinstance(width, int):
            return None
        return images_per_call(grid_tokens(pixel_values, patch), width)


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
