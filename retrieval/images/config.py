"""Image decoding and CLIP preprocessing, shared by the indexer and image queries.

Decoding turns any file PIL can read into an RGB image the way a person would expect:
EXIF orientation applied, transparency composited onto white, 16-bit and float images scaled
to 8 bits rather than clipped, the first frame of animations, and JPEGs decoded at a reduced
DCT scale (draft mode) when the model needs far fewer pixels than the file has.

Preprocessing reproduces the checkpoint's ``CLIPImageProcessor`` (transformers 5, torchvision
backend): resize with torchvision's antialiased bicubic on uint8, center crop (zero padding
when the image is smaller than the crop), rescale and normalise. The configuration comes from
the checkpoint's own image processor settings (``preprocessor_config.json``, or nested in
``processor_config.json`` as transformers 5 saves them; read by
:func:`retrieval.encoders.hf.read_image_processor_config`); nothing is hard-coded to 224 px. open_clip
models map their ``PreprocessCfg`` (shortest / longest / squash resize, crop or pad with a fill
colour, torchvision's rounding) onto the same :class:`PreprocessConfig`.
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
from PIL import Image, ImageOps

from ..errors import ImageDecodeError

if TYPE_CHECKING:
    import torch

# File extensions the indexer looks at (compared lower-case).
IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    {".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"}
)

# PIL's own limit: images above it are refused as decompression bombs (PIL only warns between
# 1x and 2x of it; a long build must not be stalled by a 200-megapixel decode either).
DEFAULT_MAX_PIXELS: int = Image.MAX_IMAGE_PIXELS or 89_478_485

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

    def __post_init__(self) -> None:
        if self.shortest_edge is not None and self.shortest_edge < 1:
            raise ValueError(f"shortest_edge must be >= 1, got {self.shortest_edge}")
        if self.keep_ratio_size is not None and (self.shortest_edge is not None or self.resize_to is not None):
            raise ValueError("keep_ratio_size excludes shortest_edge and resize_to; set those to None")
        if self.shortest_edge is None and self.resize_to is None and self.keep_ratio_size is None and self.crop_size is None:
            raise ValueError("preprocessing needs a resize or a crop to reach a fixed input size")
        for name in ("resize_to", "crop_size", "keep_ratio_size"):
            value = getattr(self, name)
            if value is not None and (len(value) != 2 or min(value) < 1):
                raise ValueError(f"{name} must be (height, width) >= 1, got {value}")
        if self.keep_ratio_fit not in _KEEP_RATIO_FITS:
            raise ValueError(f"keep_ratio_fit must be one of {_KEEP_RATIO_FITS}, got {self.keep_ratio_fit!r}")
        if self.crop_rounding not in _CROP_ROUNDINGS:
            raise ValueError(f"crop_rounding must be one of {_CROP_ROUNDINGS}, got {self.crop_rounding!r}")
        if isinstance(self.pad_fill, bool) or not isinstance(self.pad_fill, int) or not 0 <= self.pad_fill <= 255:
            raise ValueError(f"pad_fill must be an integer 0..255, got {self.pad_fill!r}")
        if self.resample not in _RESAMPLE_NAMES.values():
            raise ValueError(f"unknown resample {self.resample!r}")
        if (self.mean is None) != (self.std is None):
            raise ValueError("mean and std must be given together")
        if self.std is not None and min(self.std) <= 0:
            raise ValueError("std must be > 0")
        if self.alpha != "white":
            raise ValueError(f"unknown alpha policy {self.alpha!r}; only 'white' is supported")

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
        )

    @classmethod
    def from_hf(cls, config: Mapping[str, Any]) -> PreprocessConfig:
        """Build from a checkpoint's ``CLIPImageProcessor`` settings (its keys: ``size``, ``crop_size``, ...).

        ``config`` is what :func:`retrieval.encoders.hf.read_image_processor_config` returns
        as ``settings``, from either checkpoint layout.

        Raises:
            ValueError: a setting we cannot reproduce (e.g. a resize mode other than
                ``shortest_edge`` or ``height``/``width``).
        """
        size = config.get("size", {"shortest_edge": 224})
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
        if config.get("do_center_crop", True):
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
            mean = tuple(float(v) for v in config.get("image_mean", OPENAI_CLIP_MEAN))
            std = tuple(float(v) for v in config.get("image_std", OPENAI_CLIP_STD))
        return cls(
            shortest_edge=shortest_edge,
            resize_to=resize_to,
            crop_size=crop,
            resample=resample,
            rescale_factor=rescale,
            mean=mean,  # type: ignore[arg-type]
            std=std,  # type: ignore[arg-type]
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


def _three(value: Any, name: str) -> tuple[float, float, float]:
    """A per-channel value: a scalar is repeated (as open_clip does), a sequence must have 3."""
    if isinstance(value, (int, float)):
        return (float(value),) * 3
    values = tuple(float(v) for v in value)
    if len(values) == 1:
        values = values * 3
    if len(values) != 3:
        raise ValueError(f"open_clip {name} must have 3 values, got {value!r}")
    return values  # type: ignore[return-value]


@dataclass(frozen=True)
class DecodedImage:
    """An RGB image plus the size of the original after EXIF orientation.

    ``image`` may be smaller than ``width`` x ``height`` when JPEG draft decoding was used.
    """

    image: Image.Image
    width: int
    height: int


def _scale_to_uint8(img: Image.Image) -> Image.Image:
    # PIL's own convert("L") clips 16-bit and float pixels at 255, turning most of a 16-bit
    # photo white; scale the real value range instead.
    arr = np.asarray(img)
    if img.mode == "F":
        arr = arr.astype(np.float64)
        finite = arr[np.isfinite(arr)]
        top = float(finite.max()) if finite.size else 1.0
        scale = 255.0 if top <= 1.0 else (255.0 / 65535.0 if top > 255.0 else 1.0)
        out = np.clip(np.nan_to_num(arr) * scale, 0, 255)
    else:
        arr = arr.astype(np.int64)
        # I;16 is always 16-bit; mode I (32-bit) from PNG/TIFF holds 16-bit samples in practice.
        sixteen = img.mode.startswith("I;16") or int(arr.max(initial=0)) > 255
        out = np.clip(arr, 0, 65535) / 257.0 if sixteen else np.clip(arr, 0, 255)
    return Image.fromarray(np.rint(out).astype(np.uint8), "L")


def to_rgb(img: Image.Image) -> Image.Image:
    """Convert any PIL image to RGB, compositing transparency onto a white background."""
    has_alpha = "A" in img.getbands() or "transparency" in img.info
    if img.mode == "RGB" and not has_alpha:
        return img
    if img.mode in ("I", "F") or img.mode.startswith("I;16"):
        return _scale_to_uint8(img).convert("RGB")
    if has_alpha:
        # Same rule as transformers' convert_to_rgb, so transparent images keep parity too.
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img.convert("RGB")


def _oriented_size(img: Image.Image) -> tuple[int, int]:
    # EXIF orientations 5..8 swap width and height.
    try:
        orientation = img.getexif().get(0x0112, 1)
    except Exception:  # noqa: BLE001 - a broken EXIF block must not fail the decode
        orientation = 1
    w, h = img.size
    return (h, w) if orientation in (5, 6, 7, 8) else (w, h)


@contextlib.contextmanager
def _pixel_limit(max_pixels: int) -> Iterator[None]:
    # PIL checks its module-global limit inside Image.open (warning above it, error above
    # twice it); make that limit ours, so a caller's higher max_pixels is honoured too.
    previous = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = max_pixels
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = previous


def decode_image(
    source: str | bytes | os.PathLike[str] | os.PathLike[bytes] | BinaryIO,
    *,
    min_edge: int | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    name: str | None = None,
) -> DecodedImage:
    """Open and decode one image file to RGB.

    Args:
        source: a path (str or bytes) or a binary file object.
        min_edge: if given, JPEGs are decoded at the smallest DCT scale (1/2, 1/4, 1/8) whose
            shorter side is still >= ``min_edge`` pixels.
        max_pixels: images with more pixels are refused as decompression bombs.
        name: how to name the file in error messages (defaults to the path).

    Returns:
        The RGB image with its original (EXIF-oriented) width and height.

    Raises:
        ImageDecodeError: the file is empty, truncated, not an image, too large or unreadable.
    """
    label = name if name is not None else _label(source)
    try:
        with warnings.catch_warnings(), _pixel_limit(max_pixels):
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source) as img:  # type: ignore[arg-type]
                width, height = _oriented_size(img)
                if width * height > max_pixels:
                    raise ImageDecodeError(
                        label,
                        f"decompression bomb: {width}x{height} pixels exceeds the limit of {max_pixels}",
                    )
                if getattr(img, "n_frames", 1) > 1:
                    img.seek(0)
                if min_edge is not None and img.format == "JPEG":
                    # draft() picks the largest reduction that keeps both sides >= the request.
                    img.draft(img.mode, (min_edge, min_edge))
                img.load()
                oriented = ImageOps.exif_transpose(img)
                rgb = to_rgb(oriented)
                rgb.load()
                if rgb is img:
                    rgb = img.copy()
    except ImageDecodeError:
        raise
    except FileNotFoundError:
        raise ImageDecodeError(label, "file not found") from None
    except PermissionError:
        raise ImageDecodeError(label, "permission denied") from None
    except IsADirectoryError:
        raise ImageDecodeError(label, "is a directory") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # PIL's text ends in ", could be decompression bomb DOS attack."; keep the numbers.
        detail = str(exc).split(", could be")[0].rstrip(".")
        raise ImageDecodeError(label, f"decompression bomb: {detail}") from None
    except Image.UnidentifiedImageError:
        reason = "empty file" if _is_empty(source) else "not an image (unrecognised format)"
        raise ImageDecodeError(label, reason) from None
    except (OSError, SyntaxError, ValueError, EOFError, MemoryError, TypeError, IndexError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "truncated" in text:
            text = "truncated file"
        raise ImageDecodeError(label, f"decode failed: {text}") from None
    return DecodedImage(image=rgb, width=width, height=height)


def _label(source: Any) -> str:
    if isinstance(source, bytes):
        return os.fsdecode(source)
    if isinstance(source, (str, os.PathLike)):
        return os.fsdecode(source)
    return getattr(source, "name", "<stream>")


def _is_empty(source: Any) -> bool:
    try:
        if isinstance(source, (str, bytes, os.PathLike)):
            return os.path.getsize(source) == 0
        if isinstance(source, io.BytesIO):
            return len(source.getbuffer()) == 0
    except OSError:
        return False
    return False


def resize_output_size(height: int, width: int, cfg: PreprocessConfig) -> tuple[int, int]:
    """(height, width) after the resize step, with the reference implementations' rounding."""
    if cfg.shortest_edge is not None:
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = cfg.shortest_edge, int(cfg.shortest_edge * long / short)
        return (new_long, new_short) if width <= height else (new_short, new_long)
    if cfg.resize_to is not None:
        return cfg.resize_to
    if cfg.keep_ratio_size is not None:
        # open_clip's ResizeKeepRatio: one factor, from the shorter or the longer side.
        ratio_h, ratio_w = height / cfg.keep_ratio_size[0], width / cfg.keep_ratio_size[1]
        ratio = max(ratio_h, ratio_w) if cfg.keep_ratio_fit == "longest" else min(ratio_h, ratio_w)
        # At least one pixel: a 1000x1 strip would otherwise resize to nothing.
        return max(1, round(height / ratio)), max(1, round(width / ratio))
    return height, width


def preprocess_tensor(images: torch.Tensor, cfg: PreprocessConfig) -> torch.Tensor:
    """Resize, center-crop and normalise a batch of RGB image tensors, on any device.

    Built only from differentiable torch operations (antialiased resize, slicing, padding,
    affine normalisation), so float input can sit inside autograd, e.g. to score rendered
    images with CLIP in a training loop; the indexer's GPU path runs it on CUDA.

    Args:
        images: ``(N, 3, H, W)`` or ``(3, H, W)``; uint8 in 0..255 (bit-identical to the
            checkpoint's ``CLIPImageProcessor``) or float in 0..255 (clamped to 0..255 after
            the resize like the reference, but not rounded to integers: from the
            reference's normalised values at most 0.04, about 2.4 grey levels, measured in
            tests/test_preprocess_tensor.py).
        cfg: the checkpoint's preprocessing (``encoder.preprocess``).

    Returns:
        float32 ``pixel_values`` of shape ``(N, 3, h, w)`` (or ``(3, h, w)``); float64 input
        stays float64.

    Raises:
        ValueError: not an RGB image tensor.
    """
    import torch
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as tvF

    if images.ndim not in (3, 4) or images.shape[-3] != 3:
        raise ValueError(f"expected (N, 3, H, W) or (3, H, W) RGB tensors, got shape {tuple(images.shape)}")
    height, width = images.shape[-2:]
    new_size = resize_output_size(int(height), int(width), cfg)
    if new_size != (height, width):
        mode = InterpolationMode(cfg.resample)
        images = tvF.resize(images, list(new_size), interpolation=mode, antialias=True)
        if images.is_floating_point():
            # The reference's uint8 resize saturates bicubic overshoot at 0 and 255; so do we.
            images = images.clamp(0.0, 255.0)
    if cfg.crop_size is not None:
        images = _center_crop(images, cfg.crop_size, rounding=cfg.crop_rounding, fill=cfg.pad_fill)
    dtype = torch.float64 if images.dtype == torch.float64 else torch.float32
    # From uint8 the float tensor is a new one, ours to normalise in place (same arithmetic);
    # float input may be a caller's autograd leaf, so it is not touched.
    own = images.dtype == torch.uint8
    out = images.to(dtype, memory_format=torch.contiguous_format)
    if cfg.mean is not None and cfg.std is not None:
        scale = 1.0 / cfg.rescale_factor if cfg.rescale_factor else 1.0
        mean = torch.tensor(cfg.mean, dtype=torch.float32, device=out.device).to(dtype) * scale
        std = torch.tensor(cfg.std, dtype=torch.float32, device=out.device).to(dtype) * scale
        if own:
            out = out.sub_(mean[:, None, None]).div_(std[:, None, None])
        else:
            out = (out - mean[:, None, None]) / std[:, None, None]
    elif cfg.rescale_factor is not None:
        out = out * cfg.rescale_factor
    return out


def _center_crop(images: torch.Tensor, size: tuple[int, int], rounding: str = "floor", fill: int = 0) -> torch.Tensor:
    from torchvision.transforms.v2 import functional as tvF

    crop_h, crop_w = size
    height, width = images.shape[-2:]
    if crop_w > width or crop_h > height:
        # Pad like the references (transformers and torchvision alike), then crop the center.
        pad = [
            (crop_w - width) // 2 if crop_w > width else 0,
            (crop_h - height) // 2 if crop_h > height else 0,
            (crop_w - width + 1) // 2 if crop_w > width else 0,
            (crop_h - height + 1) // 2 if crop_h > height else 0,
        ]
        images = tvF.pad(images, pad, fill=fill)
        height, width = images.shape[-2:]
    if rounding == "round":
        # torchvision's CenterCrop: round half to even, so an odd margin of 3 puts 2 on top.
        top, left = int(round((height - crop_h) / 2.0)), int(round((width - crop_w) / 2.0))
    else:
        top, left = int((height - crop_h) / 2.0), int((width - crop_w) / 2.0)
    return images[..., top : top + crop_h, left : left + crop_w]


def pil_to_tensor(img: Image.Image) -> torch.Tensor:
    """RGB PIL image -> uint8 tensor (3, H, W) sharing no memory with PIL.

    Its memory stays height x width x channel (a permuted view, no copy): torch's uint8
    antialiased resize ran 2.8x faster on that layout than on a contiguous (3, H, W) copy
    (320x240 -> 298x224: 0.16 against 0.45 ms), with identical output.
    """
    import torch

    arr = np.array(img, dtype=np.uint8, copy=True)
    return torch.from_numpy(arr).permute(2, 0, 1)


def load_pixels(
    source: str | bytes | os.PathLike[str] | BinaryIO,
    cfg: PreprocessConfig,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    draft: bool = True,
    name: str | None = None,
) -> tuple[torch.Tensor, int, int]:
    """Decode and preprocess one image: returns ``(pixel_values (3,h,w), width, height)``.

    Raises:
        ImageDecodeError: see :func:`decode_image`.
    """
    decoded = decode_image(
        source, min_edge=cfg.min_decode_edge if draft else None, max_pixels=max_pixels, name=name
    )
    image = reduce_for_resize(decoded.image, cfg.min_decode_edge) if draft else decoded.image
    pixels = preprocess_tensor(pil_to_tensor(image), cfg)
    return pixels, decoded.width, decoded.height


# Reduced images keep at least this many times the resize target on their shorter side, so the
# antialiased resize still does the last (and decisive) step: PIL's own ``reducing_gap`` idea.
REDUCING_GAP = 2


def reduce_for_resize(img: Image.Image, min_edge: int) -> Image.Image:
    """Box-reduce a large image by an integer factor before the resize (draft mode only).

    ``Image.reduce`` averages k x k blocks in one cheap pass; a 4000x3000 PNG bound for 224 px
    then resizes from 666x500 instead of from 12 megapixels. The result keeps at least
    ``REDUCING_GAP`` times ``min_edge`` on its shorter side; images already that small (JPEGs
    after draft decoding, nearly always) are returned as they are.
    """
    factor = min(img.size) // (REDUCING_GAP * min_edge)
    return img.reduce(factor) if factor >= 2 else img


def preprocess_images(images: Sequence[Image.Image], cfg: PreprocessConfig) -> torch.Tensor:
    """Preprocess already-open PIL images into a ``(N, 3, h, w)`` batch."""
    import torch

    return torch.stack([preprocess_tensor(pil_to_tensor(to_rgb(img)), cfg) for img in images])


JPEG_MAGIC = b"\xff\xd8\xff"


def is_jpeg(data: bytes) -> bool:
    """Whether ``data`` starts like a JPEG file (SOI marker)."""
    return data[:3] == JPEG_MAGIC


def jpeg_has_end(data: bytes) -> bool:
    """Whether a JPEG's end-of-image marker is in its last bytes (not a truncated file).

    nvJPEG decodes a truncated JPEG without complaint (the missing rows come out grey) where
    PIL refuses it; a file without its end marker goes to PIL, which decides as on the CPU.
    Entropy-coded data cannot hold ``FF D9`` (every ``FF`` there is followed by ``00`` or a
    restart marker), so it is found only as the end marker; trailing bytes beyond 32 also send
    the file to PIL, which is slower but decodes it the same way.
    """
    return b"\xff\xd9" in data[-32:]


def probe_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, name: str | None = None) -> tuple[int, int]:
    """(width, height) after EXIF orientation from the header alone, with the bomb check.

    Raises:
        ImageDecodeError: not an image, or more than ``max_pixels`` pixels.
    """
    label = name if name is not None else "<bytes>"
    try:
        with warnings.catch_warnings(), _pixel_limit(max_pixels):
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                width, height = _oriented_size(img)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        detail = str(exc).split(", could be")[0].rstrip(".")
        raise ImageDecodeError(label, f"decompression bomb: {detail}") from None
    except Image.UnidentifiedImageError:
        raise ImageDecodeError(label, "empty file" if not data else "not an image (unrecognised format)") from None
    except (OSError, SyntaxError, ValueError, EOFError, TypeError, IndexError) as exc:
        raise ImageDecodeError(label, f"decode failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    if width * height > max_pixels:
        raise ImageDecodeError(label, f"decompression bomb: {width}x{height} pixels exceeds the limit of {max_pixels}")
    return width, height


def decode_jpegs_on_device(datas: Sequence[bytes], device: torch.device | str) -> list[torch.Tensor | None]:
    """Decode JPEG files with ``torchvision.io.decode_jpeg`` on ``device`` (nvJPEG on CUDA).

    Returns one ``(3, H, W)`` uint8 RGB tensor per file, EXIF orientation applied, or None for
    a file this decoder could not handle (the caller decodes it on the CPU with PIL instead).
    A batch is decoded in one call; if that fails, each file is tried alone.
    """
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    if not datas:
        return []
    raw = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas]

    def one(t: torch.Tensor) -> torch.Tensor | None:
        try:
            return decode_jpeg(t, mode=ImageReadMode.RGB, device=device, apply_exif_orientation=True)
        except Exception:  # noqa: BLE001 - unsupported variants (CMYK, progressive on some GPUs, ...)
            return None

    with warnings.catch_warnings():
        # torchvision 0.29 announces a move to torchcodec; decode_jpeg still works.
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            out = decode_jpeg(raw, mode=ImageReadMode.RGB, device=device, apply_exif_orientation=True)
            return list(out)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - one bad file fails the batch call: retry one by one
            return [one(t) for t in raw]


def preprocess_on_device(image: torch.Tensor, cfg: PreprocessConfig) -> torch.Tensor:
    """:func:`preprocess_tensor` for decoded uint8 images, ``(3, H, W)`` or a stacked
    ``(N, 3, H, W)`` batch of one size, on their device.

    On the CPU uint8 keeps bit parity with the reference; on CUDA the resize runs in float32
    (antialiased bicubic on uint8 is a CPU kernel), which differs by less than one grey level.
    """
    if image.device.type != "cpu":
        image = image.float()
    return preprocess_tensor(image, cfg)
