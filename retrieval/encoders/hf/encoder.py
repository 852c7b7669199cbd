"""``HFClipEncoder``: a Hugging Face checkpoint's towers, the backend beside :mod:`retrieval.encoders.openclip.encoder`.

CLIP or SigLIP, loaded lazily, normalised vectors out.

Each tower loads on first use: a text search needs only the text tower (for CLIP
``CLIPTextModelWithProjection``) and never pays for the vision tower, the indexer only the
vision tower. What differs between families (tower classes, text padding, scores) is data in
:mod:`.family`; the code path is one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import InvalidArgumentError, ModelLoadError
from ...images import PreprocessConfig
from ...images.preprocess import unpack_patches
from ..base import l2_normalize, quiet_transformers, resolve_device
from ..chooser import runtime_modes
from ..chunking import grid_tokens, images_per_call, in_calls
from ..image_choice import ImageRuntime
from ..precision import PROBE_TEXTS, Mode, PixelPrecisionMixin, Precision, TowerPrecision, autocast, parse_precision
from ..runtime.export import cached_vision_export
from .checkpoint import checkpoint_fingerprint, read_model_type, read_scalar, resolve_checkpoint
from .family import FAMILIES, Family, check_processor, family_of
from .processor import ImageProcessorConfig, read_image_processor_config
from .query_text import warn_truncated

if TYPE_CHECKING:
    import torch

DEFAULT_MODEL = "openai/clip-vit-base-patch32"


class HFClipEncoder(PixelPrecisionMixin):
    """A Hugging Face checkpoint of a supported family (:mod:`.family`), towers loaded lazily.

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
        family: Family | None = None,
    ) -> None:
        self.name = name
        self.family: Family = family or FAMILIES["clip"]
        self.directory = directory
        self.config = config
        self.preprocess = preprocess
        # What ``preprocess`` was read from (None when built by hand), e.g. for finetune's export.
        self.image_processor = image_processor
        self.device = device
        self.dim = self.family.dim(config)
        self.max_text_length = int(config.text_config.max_position_embeddings)
        self._fingerprint: str | None = None
        self._text_model: Any = None
        self._vision_model: Any = None
        self._tokenizer: Any = None
        self._logit_params: tuple[float, float | None] | None = None
        # The checkpoint's own input size; set_image_size embeds at another one.
        # NaFlex models have no fixed size: the patch grid's side for a square image.
        self.native_image_size = (
            preprocess.min_decode_edge if self.family.naflex else int(config.vision_config.image_size)
        )
        self.embed_image_size = self.native_image_size
        self._native_preprocess = preprocess
        # Separate modules, separate int8 copies: each tower resolves its own mode.
        self.image_precision = TowerPrecision(precision, device)
        self.text_precision = TowerPrecision(precision, device, tower="text")
        # Per mode a runtime may run, which runs the image tower (torch, OpenVINO, ONNX Runtime).
        self.image_runtimes = self._make_runtimes()

    @classmethod
    def load(cls, model: str = DEFAULT_MODEL, device: str = "auto", precision: str = "fp32") -> HFClipEncoder:
        """Open a CLIP or SigLIP checkpoint by hub id or local directory (weights load on first use).

        Args:
            model: hub id such as ``openai/clip-vit-base-patch32`` or a checkpoint directory.
            device: ``auto`` (CUDA when available), ``cpu`` or ``cuda[:N]``.
            precision: ``fp32``, ``bf16``, ``fp16``, ``int8`` or ``auto``, for both towers
                (see :mod:`retrieval.encoders.precision`).

        Raises:
            ModelLoadError: the checkpoint cannot be found, is of an unsupported family (the
                message names the supported ones), or its image processor disagrees with the
                model (input size, patch size).
            InvalidArgumentError: bad device or precision.
        """
        requested = parse_precision(precision)
        dev = resolve_device(device)
        name, directory = resolve_checkpoint(model)
        family = family_of(read_model_type(directory, name), name)
        try:
            from transformers import AutoConfig

            with quiet_transformers():
                config = AutoConfig.from_pretrained(directory)
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"{name} is not a readable {family.label} checkpoint: {str(exc).splitlines()[0]}") from exc
        processor = read_image_processor_config(directory, name)
        try:
            preprocess = PreprocessConfig.from_hf(processor.settings)
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{name}: unreadable image processor settings in {processor.source}: {exc}") from exc
        check_processor(family, config, processor.settings, preprocess, name)
        return cls(name, directory, config, preprocess, dev, precision=requested, image_processor=processor, family=family)

    @property
    def info(self) -> dict[str, Any]:
        """What the index manifest records about the model (``model_info``)."""
        vision = self.config.vision_config
        return {
            "backend": self.backend,
            "checkpoint": self.name,
            # The family: a query model of another family is refused by it (QueryEncoders).
            "model_type": self.family.name,
            "image_size": self.native_image_size,
            "patch_size": int(vision.patch_size),
            "context_length": self.max_text_length,
            "embed_dim": self.dim,
            "embed_image_size": self.embed_image_size,
            **({"max_num_patches": self.preprocess.max_num_patches} if self.family.naflex else {}),
            **self.image_precision.manifest_info(),
            # After the precision's keys: a runtime's int8 tower states its own activation bits.
            **(chosen.info() if (chosen := self._image_runtime(self.image_precision.mode)) else {}),
        }

    @property
    def family_name(self) -> str:
        return self.family.name

    @property
    def query_languages(self) -> tuple[str, ...]:
        """None to name: a Hugging Face CLIP or SigLIP tokenizer reads any text as it is."""
        return ()

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
            InvalidArgumentError: not a positive multiple of the patch size, or another size
                than its own for a NaFlex model (which sizes each image by its patch budget).
        """
        if self.family.naflex:
            if size != self.native_image_size:
                raise InvalidArgumentError(
                    f"{self.name} is a {self.family.label} model: it sizes each image to at most "
                    f"{self.preprocess.max_num_patches} patches, so --image-size does not apply"
                )
            return
        patch = int(self.config.vision_config.patch_size)
        if isinstance(size, bool) or not isinstance(size, int) or size < patch or size % patch:
            raise InvalidArgumentError(
                f"image size must be a multiple of {self.name}'s patch size {patch} "
                f"(its own size is {self.native_image_size}), got {size!r}"
            )
        self.preprocess = self._native_preprocess.scaled(size, self.native_image_size)
        if size != self.embed_image_size:
            before, self.image_runtimes = self.image_runtimes, self._make_runtimes(size)
            for mode, runtime in self.image_runtimes.items():
                runtime.follow(before[mode].recorded)
        self.embed_image_size = size

    def logit_params(self) -> tuple[float, float | None]:
        """``(exp(logit_scale), logit_bias)`` of the full checkpoint: the bias is None for CLIP
        (softmax over labels), a float for SigLIP (an independent sigmoid per label).

        Read from the weight files alone (the towers do not hold them); a checkpoint without
        them gets the initial values ``from_pretrained`` would give the full model.
        """
        if self._logit_params is None:
            default = float(getattr(self.config, "logit_scale_init_value", self.family.default_logit_scale))
            scale = math.exp(read_scalar(self.directory, "logit_scale", default))
            bias = None
            if self.family.default_logit_bias is not None:
                bias = read_scalar(self.directory, "logit_bias", self.family.default_logit_bias)
            self._logit_params = (scale, bias)
        return self._logit_params

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
            self._text_model = self._load_tower(self.family.text_class)
        return self._text_model

    @property
    def vision_model(self) -> Any:
        if self._vision_model is None:
            self._vision_model = self._load_tower(self.family.vision_class)
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
        """Tokenize like the reference processor: the text as given (the tokenizer does its own
        normalisation), padded as the family needs (CLIP to the longest, SigLIP to the window),
        truncated to the model's window with a notice (:func:`.text.warn_truncated`)."""
        texts = list(texts)
        warn_truncated(self.tokenizer, texts, self.max_text_length, self.name)
        return self.tokenizer(
            texts,
            padding=self.family.text_padding,
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
                # What the tokenizer returns goes in, as the reference processor passes it: a
                # SigLIP tokenizer without an attention mask gives the tower none.
                inputs = {k: batch[k].to(device) for k in ("input_ids", "attention_mask") if k in batch}
                emb = getattr(model(**inputs), self.family.text_output)
                out[start : start + len(emb)] = emb.float().cpu().numpy()
        return l2_normalize(out)

    def calibrate_images(self, pixel_values: torch.Tensor) -> Mode:
        """Resolve an ``auto`` image precision on this sample now, and for fp32, bf16 and int8
        the runtime (its checks run on the sample); returns the mode."""
        mode = super().calibrate_images(pixel_values)
        self._runtime_tower(pixel_values, mode)
        return mode

    def follow_image_runtime(self, recorded: str | None, precision: str | None = None) -> None:
        """Ask first for the runtime an index's vectors came from, for the mode they were made in
        (``precision``; None: every mode); the other modes keep the usual order."""
        for mode, runtime in self.image_runtimes.items():
            runtime.follow(recorded if precision in (None, mode) else None)

    def image_runtime_pending(self) -> bool:
        runtime = self._image_runtime(self.image_precision.mode)
        return runtime is not None and runtime.pending

    def image_runtime_name(self) -> str:
        chosen = self._image_runtime(self.image_precision.mode)
        return (chosen.name if chosen is not None else None) or "torch"

    def _auto_passes_over(self, mode: Mode, sample: torch.Tensor) -> str | None:
        """A mode torch may not run here (bf16 on the CPU, :mod:`..chooser`'s table) only where
        another runtime runs it with vectors independent of the batch (OpenVINO with AMX): its
        choice is made now, on the sample."""
        refused = super()._auto_passes_over(mode, sample)
        if refused is None or self._runtime_tower(sample, mode) is not None:
            return None
        runtime = self._image_runtime(mode)
        why = runtime.note if runtime is not None and runtime.note else "no runtime runs it here"
        return f"{refused}, and {why}"

    def _image_runtime(self, mode: str | None) -> ImageRuntime | None:
        """The choice of runtime for ``mode``'s image tower; None for a mode only torch runs (fp16)."""
        return self.image_runtimes.get(mode or "")

    def _make_runtimes(self, size: int | None = None) -> dict[str, ImageRuntime]:
        size = size or self.native_image_size
        vision = self.config.vision_config
        # One activation scale per row and model width (its MLP's width is a multiple of it).
        group = math.gcd(int(vision.hidden_size), int(vision.intermediate_size))

        def export() -> Path:
            return cached_vision_export(
                lambda: self.vision_model, self.family.image_output, self.fingerprint, size, self.name,
                interpolate=size != self.native_image_size,
            )

        applies = self.device.type == "cpu" and not self.family.naflex
        return {mode: ImageRuntime(self.name, export, applies, mode, group) for mode in runtime_modes("image")}

    def _images_per_call(self, pixel_values: torch.Tensor) -> int:
        """Images per CPU forward pass (:mod:`..chunking`): tokens from the input's patch grid
        (NaFlex: its packed patch count), width the MLP's."""
        vision = self.config.vision_config
        patch = int(vision.patch_size)
        tokens = int(pixel_values.shape[-2]) if self.family.naflex else grid_tokens(pixel_values, (patch, patch))
        return images_per_call(tokens, int(vision.intermediate_size))

    def _runtime_tower(self, pixel_values: torch.Tensor, mode: Mode) -> Any:
        """The runtime's tower for ``mode``, chosen now on ``pixel_values`` if not yet; None: torch.

        fp32 only once it is the resolved mode: auto's calibration compares reduced modes with
        torch's fp32 (and need not export a tower it may not use). bf16 and int8 also while auto
        calibrates, so that the gate judges the tower that will run.
        """
        runtime = self._image_runtime(mode)
        if runtime is None or (mode == "fp32" and self.image_precision.mode != "fp32"):
            return None
        tower = runtime.tower(pixel_values, lambda sample: self._embed_torch(sample, mode))
        if tower is not None:
            # torch's towers served the checks only: their memory goes back (loaded again from
            # the checkpoint should torch be asked to embed again, e.g. for another index).
            self.image_precision.variants.pop("int8", None)
            self._vision_model = None
        return tower

    def _embed_pixels(self, pixel_values: torch.Tensor, mode: Mode) -> np.ndarray:
        tower = self._runtime_tower(pixel_values, mode)
        if tower is not None:
            return tower(pixel_values)
        return self._embed_torch(pixel_values, mode)

    def _embed_torch(self, pixel_values: torch.Tensor, mode: Mode) -> np.ndarray:
        import torch

        device = torch.device("cpu") if mode == "int8" else self.device
        if device.type == "cpu":
            per_call = self._images_per_call(pixel_values)
            if len(pixel_values) > per_call:
                return in_calls(pixel_values, per_call, lambda part: self._embed_torch(part, mode))
        model = self.image_precision.module(self.vision_model, mode)
        with torch.inference_mode(), autocast(mode, device):
            if self.family.naflex:
                values, mask, shapes = unpack_patches(pixel_values.to(device, torch.float32, non_blocking=True))
                out = model(pixel_values=values, pixel_attention_mask=mask, spatial_shapes=shapes)
                return l2_normalize(getattr(out, self.family.image_output).float().cpu().numpy())
            # Another input size than the checkpoint's (set_image_size, or an index embedded at
            # one) needs the position embeddings interpolated to the patch grid.
            other_size = tuple(pixel_values.shape[-2:]) != (self.native_image_size, self.native_image_size)
            emb = model(
                pixel_values=pixel_values.to(device, torch.float32, non_blocking=True), interpolate_pos_encoding=other_size
            )
            emb = getattr(emb, self.family.image_output)
            return l2_normalize(emb.float().cpu().numpy())
