"""JPEG decoding on the model's device (nvJPEG on CUDA) for the indexer's GPU path.

Files this path cannot take (not JPEG, truncated, an unsupported variant) go back to the PIL
decoder in :mod:`.decode`, which decides as on the CPU.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .preprocess import preprocess_tensor
from .preprocess_config import PreprocessConfig

if TYPE_CHECKING:
    import torch


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
            return list(out)
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
