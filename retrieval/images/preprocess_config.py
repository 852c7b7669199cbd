"""How an image becomes a checkpoint's ``pixel_values``: :class:`PreprocessConfig`.

Preprocessing reproduces the checkpoint's ``CLIPImageProcessor`` (transformers 5, torchvision
backend): resize with torchvision's antialiased bicubic on uint8, center crop (zero padding
when the image is smaller than the crop), rescale and normalise. The configuration comes from
the checkpoint's own image processor settings (``preprocessor_config.json``, or nested in
``processor_config.json`` as transformers 5 saves them; read by
:func:`retrieval.encoders.hf.read_image_processor_config`); nothing is hard-coded to 224 px. open_clip
models map their ``PreprocessCfg`` (shortest / longest / squash resize, crop or pad with a fill
colour, torchvision's rounding) onto the same :class:`PreprocessConfig`.

Pure configuration: no PIL, numpy or torch here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..checks import is_int

_RESAMPLE_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


_KEEP_RATIO_FITS = ("shortest", "longest")
_CROP_ROUNDINGS = ("floor", "round")
_OPEN_CLIP_RESIZE_MODES = ("shortest", "longest", "squash")


@dataclass(frozen=True)
class PreprocessConfig:
    """How an RGB image becomes the model's ``pixel_values``.

    The first resize setting that is not None applies: ``shortest_edge``, then ``resize_to``;
    ``keep_ratio_size`` only with both None. With none of them the image is only cropped.

    Attributes:
        shortest_edge: resize so the shorter side has this many pixels (aspect kept, the longer
            side rounded down like transformers and torchvision ``Resize(int)``); or None.
        resize_to: resize to exactly (height, width) instead ("squash"); used when
            ``shortest_edge`` is None.
        keep_ratio_size: (height, width) box for an aspect-keeping resize with one scale factor
            (open_clip's ``ResizeKeepRatio``: sides rounded to nearest); used when both of the
            above are None.
        keep_ratio_fit: ``"shortest"`` scales so the image covers the box (then crop),
            ``"longest"`` so it fits inside the box (then pad).
        crop_size: (height, width) of the center crop, or None for no crop. An image smaller
            than the crop is padded first.
        crop_rounding: where an odd margin puts the extra pixel: ``"floor"`` like transformers'
            ``CLIPImageProcessor``, ``"round"`` like torchvision's ``CenterCrop`` (open_clip).
        pad_fill: 0..255 value of the padding added around images smaller than the crop.
        resample: interpolation name (``"bicubic"``, ``"bilinear"``, ...).
        rescale_factor: multiplier applied to 0..255 values (1/255), or None for no rescale.
        mean, std: per-channel normalisation, or None for no normalisation.
        alpha: how transparency becomes RGB; ``"white"`` composites onto white like the
            reference processor does.
        max_num_patches, patch_size: SigLIP 2 NaFlex ("native flexible") instead of all the
            resize and crop settings: each image is resized, aspect kept, to the largest grid
            of ``patch_size`` patches with at most ``max_num_patches`` of them, and the model
            receives its patches packed (see :func:`.preprocess.pack_patches`).
    """

    shortest_edge: int | None = 224
    resize_to: tuple[int, int] | None = None
    crop_size: tuple[int, int] | None = (224, 224)
    resample: str = "bicubic"
    rescale_factor: float | None = 1 / 255
    mean: tuple[float, float, float] | None = OPENAI_CLIP_MEAN
    std: tuple[float, float, float] | None = OPENAI_CLIP_STD
    alpha: str = "white"
    keep_ratio_size: tuple[int, int] | None = None
    keep_ratio_fit: str = "shortest"
    crop_rounding: str = "floor"
    pad_fill: int = 0
    max_num_patches: int | None = None
    patch_size: int | None = None

    def __post_init__(self) -> None:
        if (self.max_num_patches is None) != (self.patch_size is None):
            raise ValueError("max_num_patches and patch_size must be given together")
        if self.max_num_patches is not None and self.patch_size is not None:
            if not (is_int(self.max_num_patches) and is_int(self.patch_size)) or min(self.max_num_patches, self.patch_size) < 1:
                raise ValueError(f"max_num_patches and patch_size must be >= 1, got {self.max_num_patches}, {self.patch_size}")
            if any(v is not None for v in (self.shortest_edge, self.resize_to, self.crop_size, self.keep_ratio_size)):
                raise ValueError("NaFlex (max_num_patches) excludes the resize and crop settings; set them to None")
        if self.shortest_edge is not None and self.shortest_edge < 1:
            raise ValueError(f"shortest_edge must be >= 1, got {self.shortest_edge}")
        if self.keep_ratio_size is not None and (self.shortest_edge is not None or self.resize_to is not None):
            raise ValueError("keep_ratio_size excludes shortest_edge and resize_to; set those to None")
        sized = any(v is not None for v in (self.shortest_edge, self.resize_to, self.keep_ratio_size, self.crop_size))
        if not self.naflex and not sized:
            raise ValueError("preprocessing needs a resize or a crop to reach a fixed input size")
        for name in ("resize_to", "crop_size", "keep_ratio_size"):
            value = getattr(self, name)
            if value is not None and (len(value) != 2 or min(value) < 1):
                raise ValueError(f"{name} must be (height, width) >= 1, got {value}")
        if self.keep_ratio_fit not in _KEEP_RATIO_FITS:
            raise ValueError(f"keep_ratio_fit must be one of {_KEEP_RATIO_FITS}, got {self.keep_ratio_fit!r}")
        if self.crop_rounding not in _CROP_ROUNDINGS:
            raise ValueError(f"crop_rounding must be one of {_CROP_ROUNDINGS}, got {self.crop_rounding!r}")
        if not is_int(self.pad_fill) or not 0 <= self.pad_fill <= 255:
            raise ValueError(f"pad_fill must be an integer 0..255, got {self.pad_fill!r}")
        if self.resample not in _RESAMPLE_NAMES.values():
            raise ValueError(f"unknown resample {self.resample!r}")
        if (self.mean is None) != (self.std is None):
            raise ValueError("mean and std must be given together")
        if self.std is not None and min(self.std) <= 0:
            raise ValueError("std must be > 0")
        if self.alpha != "white":
            raise ValueError(f"unknown alpha policy {self.alpha!r}; only 'white' is supported")

    def scaled(self, size: int, native: int) -> PreprocessConfig:
        """The same preprocessing for a model input of ``size`` instead of ``native`` pixels:
        every resize and crop dimension scaled by ``size / native`` (CLIP's ``shortest_edge``
        224 and crop 224x224 become 336 and 336x336 for ``size`` 336)."""

        def px(v: int) -> int:
            return max(1, round(v * size / native))

        def box(v: tuple[int, int] | None) -> tuple[int, int] | None:
            return None if v is None else (px(v[0]), px(v[1]))

        return replace(
            self,
            shortest_edge=None if self.shortest_edge is None else px(self.shortest_edge),
            resize_to=box(self.resize_to),
            crop_size=box(self.crop_size),
            keep_ratio_size=box(self.keep_ratio_size),
        )

    @property
    def naflex(self) -> bool:
        """Whether images keep their aspect ratio in a variable patch grid (SigLIP 2 NaFlex)."""
        return self.max_num_patches is not None

    @property
    def input_size(self) -> tuple[int, int]:
        """(height, width) of the tensor the model receives."""
        if self.crop_size is not None:
            return self.crop_size
        if self.shortest_edge is None and self.resize_to is not None:
            return self.resize_to
        raise ValueError("input size depends on the image: aspect-keeping resize without a crop")

    @property
    def min_decode_edge(self) -> int:
        """Smallest side length (pixels) the decoded image needs for a lossless resize step."""
        if self.shortest_edge is not None:
            return self.shortest_edge
        if self.resize_to is not None:
            return max(self.resize_to)
        if self.max_num_patches is not None and self.patch_size is not None:
            # A square image's side; an elongated one's shorter side is smaller still.
            return self.patch_size * math.isqrt(self.max_num_patches)
        if self.keep_ratio_size is not None:
            # Both sides >= the larger box side: the resized image is never larger than that
            # on its shorter side, so draft decoding never makes the resize an upscale.
            return max(self.keep_ratio_size)
        return max(self.input_size)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("resize_to", "crop_size", "mean", "std", "keep_ratio_size"):
            if data[key] is not None:
                data[key] = list(data[key])
        if not self.naflex:
            # Manifests of every other model keep the keys they always had.
            del data["max_num_patches"], data["patch_size"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PreprocessConfig:
        """Rebuild from :meth:`to_dict` output; dicts written before a field existed get its default.

        Raises:
            ValueError: invalid values (see the attribute docs).
        """

        def tup(value: Any) -> Any:
            return tuple(value) if value is not None else None

        return cls(
            shortest_edge=data.get("shortest_edge"),
            resize_to=tup(data.get("resize_to")),
            crop_size=tup(data.get("crop_size")),
            resample=data.get("resample", "bicubic"),
            rescale_factor=data.get("rescale_factor"),
            mean=tup(data.get("mean")),
            std=tup(data.get("std")),
            alpha=data.get("alpha", "white"),
            keep_ratio_size=tup(data.get("keep_ratio_size")),
            keep_ratio_fit=data.get("keep_ratio_fit", "shortest"),
            crop_rounding=data.get("crop_rounding", "floor"),
            pad_fill=data.get("pad_fill", 0),
            max_num_patches=data.get("max_num_patches"),
            patch_size=data.get("patch_size"),
        )

    @classmethod
    def from_hf(cls, config: Mapping[str, Any]) -> PreprocessConfig:
        """Build from a checkpoint's ``CLIPImageProcessor`` or ``SiglipImageProcessor`` settings
        (their keys: ``size``, ``crop_size``, ...; a SigLIP ``size`` of ``height``/``width`` is a
        squash resize, without a crop).

        ``config`` is what :func:`retrieval.encoders.hf.read_image_processor_config` returns
        as ``settings``, from either checkpoint layout.

        Raises:
            ValueError: a setting we cannot reproduce (e.g. a resize mode other than
                ``shortest_edge`` or ``height``/``width``).
        """
        # SiglipImageProcessor squashes to a square with mean/std 0.5 and no crop; its saved
        # settings may leave out what it does not use, so its defaults are not CLIP's.
        siglip = str(config.get("image_processor_type", "")).startswith("Siglip")
        if str(config.get("image_processor_type", "")).startswith("Siglip2") or "max_num_patches" in config:
            return cls._from_naflex(config)
        default_size: dict[str, int] = {"height": 224, "width": 224} if siglip else {"shortest_edge": 224}
        default_mean, default_std = ((0.5, 0.5, 0.5),) * 2 if siglip else (OPENAI_CLIP_MEAN, OPENAI_CLIP_STD)
        size = config.get("size", default_size)
        if isinstance(size, int):
            size = {"shortest_edge": size}
        shortest_edge: int | None = None
        resize_to: tuple[int, int] | None = None
        if config.get("do_resize", True):
            if "shortest_edge" in size and "longest_edge" not in size:
                shortest_edge = int(size["shortest_edge"])
            elif "height" in size and "width" in size:
                resize_to = (int(size["height"]), int(size["width"]))
            else:
                raise ValueError(f"unsupported resize setting size={size!r}")
        crop: tuple[int, int] | None = None
        if config.get("do_center_crop", not siglip):
            crop_size = config.get("crop_size", {"height": 224, "width": 224})
            if isinstance(crop_size, int):
                crop_size = {"height": crop_size, "width": crop_size}
            crop = (int(crop_size["height"]), int(crop_size["width"]))
        resample = _RESAMPLE_NAMES.get(int(config.get("resample", 3)))
        if resample is None:
            raise ValueError(f"unsupported resample {config.get('resample')!r}")
        rescale = float(config.get("rescale_factor", 1 / 255)) if config.get("do_rescale", True) else None
        mean = std = None
        if config.get("do_normalize", True):
            mean = tuple(float(v) for v in config.get("image_mean", default_mean))
            std = tuple(float(v) for v in config.get("image_std", default_std))
        return cls(
            shortest_edge=shortest_edge,
            resize_to=resize_to,
            crop_size=crop,
            resample=resample,
            rescale_factor=rescale,
            mean=mean,  # type: ignore[arg-type]  # tuple() gives tuple[float, ...]; CLIP lists 3
            std=std,  # type: ignore[arg-type]  # tuple() gives tuple[float, ...]; CLIP lists 3
        )

    @classmethod
    def _from_naflex(cls, config: Mapping[str, Any]) -> PreprocessConfig:
        # Siglip2ImageProcessor: its resize size is computed per image; mean/std 0.5, bilinear.
        resample = _RESAMPLE_NAMES.get(int(config.get("resample", 2)))
        if resample is None:
            raise ValueError(f"unsupported resample {config.get('resample')!r}")
        mean = std = None
        if config.get("do_normalize", True):
            mean = tuple(float(v) for v in config.get("image_mean", (0.5, 0.5, 0.5)))
            std = tuple(float(v) for v in config.get("image_std", (0.5, 0.5, 0.5)))
        return cls(
            shortest_edge=None,
            crop_size=None,
            resample=resample,
            rescale_factor=float(config.get("rescale_factor", 1 / 255)) if config.get("do_rescale", True) else None,
            mean=mean,  # type: ignore[arg-type]  # tuple() gives tuple[float, ...]
            std=std,  # type: ignore[arg-type]  # tuple() gives tuple[float, ...]
            max_num_patches=int(config.get("max_num_patches", 256)),
            patch_size=int(config.get("patch_size", 16)),
        )

    @classmethod
    def from_open_clip(cls, config: Mapping[str, Any]) -> PreprocessConfig:
        """Build from an open_clip ``PreprocessCfg`` as a dict (``get_model_preprocess_cfg(model)``).

        Reproduces open_clip's inference transform (``image_transform(..., is_train=False)``):

        - ``shortest``, square size S: ``Resize(S)`` (shorter side S, longer side rounded down),
          then ``CenterCrop(S)``;
        - ``shortest``, size (H, W) not square: ``ResizeKeepRatio((H, W))`` (which open_clip
          always runs bicubic), then ``CenterCrop((H, W))``;
        - ``longest``: ``ResizeKeepRatio((H, W), longest=1)``, then ``CenterCropOrPad`` with
          ``fill_color``;
        - ``squash``: ``Resize((H, W))``, no crop;

        then ``ToTensor`` (x / 255) and ``Normalize(mean, std)``. Crops round like torchvision.

        Raises:
            ValueError: a setting open_clip itself would refuse (mode other than RGB, unknown
                resize mode or interpolation, bad size).
        """
        mode = config.get("mode", "RGB")
        if mode != "RGB":
            raise ValueError(f"unsupported open_clip image mode {mode!r}; only RGB is supported")
        size = config.get("size", 224)
        if isinstance(size, int):
            height = width = size
        elif isinstance(size, Sequence) and not isinstance(size, str) and len(size) in (1, 2):
            height, width = int(size[0]), int(size[-1])
        else:
            raise ValueError(f"unsupported open_clip size {size!r}")
        interpolation = config.get("interpolation") or "bicubic"
        if interpolation not in ("bicubic", "bilinear", "random"):
            raise ValueError(f"unsupported open_clip interpolation {interpolation!r}")
        # 'random' is a training-time option; open_clip's inference transform uses bicubic for it.
        resample = "bilinear" if interpolation == "bilinear" else "bicubic"
        resize_mode = config.get("resize_mode") or "shortest"
        if resize_mode not in _OPEN_CLIP_RESIZE_MODES:
            raise ValueError(f"unsupported open_clip resize_mode {resize_mode!r}")
        mean = _three(config.get("mean") or OPENAI_CLIP_MEAN, "mean")
        std = _three(config.get("std") or OPENAI_CLIP_STD, "std")
        fill = config.get("fill_color", 0) or 0
        common: dict[str, Any] = {"rescale_factor": 1 / 255, "mean": mean, "std": std, "crop_rounding": "round"}
        if resize_mode == "squash":
            return cls(shortest_edge=None, resize_to=(height, width), crop_size=None, resample=resample, **common)
        if resize_mode == "longest":
            return cls(
                shortest_edge=None,
                keep_ratio_size=(height, width),
                keep_ratio_fit="longest",
                crop_size=(height, width),
                resample=resample,
                pad_fill=int(fill),
                **common,
            )
        if height == width:
            return cls(shortest_edge=height, crop_size=(height, width), resample=resample, **common)
        return cls(
            shortest_edge=None,
            keep_ratio_size=(height, width),
            keep_ratio_fit="shortest",
            crop_size=(height, width),
            resample="bicubic",
            **common,
        )


def naflex_size(height: int, width: int, patch_size: int, max_num_patches: int) -> tuple[int, int]:
    """(height, width) a NaFlex image is resized to: Siglip2ImageProcessor's search for the largest
    scale whose sides, each rounded up to a multiple of ``patch_size``, give at most
    ``max_num_patches`` patches (the same binary search, so the same sizes)."""

    def scaled(scale: float, size: int) -> int:
        return int(max(patch_size, math.ceil(size * scale / patch_size) * patch_size))

    eps = 1e-5
    low, high = eps / 10, 100.0
    while high - low >= eps:
        scale = (low + high) / 2
        if (scaled(scale, height) / patch_size) * (scaled(scale, width) / patch_size) <= max_num_patches:
            low = scale
        else:
            high = scale
    return scaled(low, height), scaled(low, width)


def _three(value: Any, name: str) -> tuple[float, float, float]:
    """A per-channel value: a scalar is repeated (as open_clip does), a sequence must have 3."""
    if isinstance(value, (int, float)):
        return (float(value),) * 3
    values = tuple(float(v) for v in value)
    if len(values) == 1:
        values = values * 3
    if len(values) != 3:
        raise ValueError(f"open_clip {name} must have 3 values, got {value!r}")
    return values
