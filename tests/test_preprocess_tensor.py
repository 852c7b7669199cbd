"""``retrieval.preprocess_tensor``: the differentiable, tensor-only preprocessing (CPU tests)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from imagegen import photo_like

from retrieval import preprocess_tensor
from retrieval.images import PreprocessConfig

# Float input is clamped to 0..255 after the resize like the reference's uint8 pipeline, but not
# rounded (and uint8 resizes with fixed-point weights): normalised values differ by at most this
# (measured 0.036, about 2.4 grey levels, on photo-like images up to 1024 px for 224 px).
FLOAT_ATOL = 0.04


@pytest.fixture(scope="module")
def processor(tiny_model: Path):
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def cfg(tiny_model: Path) -> PreprocessConfig:
    from retrieval.encoders import HFClipEncoder

    return HFClipEncoder.load(str(tiny_model), device="cpu").preprocess


@pytest.mark.parametrize("size", [(640, 480), (300, 200), (50, 90)])
def test_matches_clip_image_processor(processor, cfg: PreprocessConfig, size) -> None:
    img = photo_like(*size, seed=sum(size))
    ref = processor(images=img, return_tensors="pt")["pixel_values"][0]
    as_uint8 = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)
    # uint8 input: bit-identical to the reference.
    assert torch.equal(preprocess_tensor(as_uint8, cfg), ref)
    # float input (what autograd needs): within the stated tolerance.
    out = preprocess_tensor(as_uint8.float()[None], cfg)[0]
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert float((out - ref).abs().max()) <= FLOAT_ATOL


def test_gradients_flow(cfg: PreprocessConfig) -> None:
    small = PreprocessConfig(shortest_edge=5, crop_size=(4, 4), mean=cfg.mean, std=cfg.std)
    x = (torch.rand(1, 3, 9, 7, dtype=torch.float64) * 255).requires_grad_()
    out = preprocess_tensor(x, small)
    assert out.dtype == torch.float64 and out.shape == (1, 3, 4, 4)
    assert torch.autograd.gradcheck(lambda t: preprocess_tensor(t, small), (x,), eps=1e-3, atol=1e-4)
    # A loss on the pixels reaches every input pixel that the crop keeps in view.
    (g,) = torch.autograd.grad(out.square().sum(), x)
    assert torch.isfinite(g).all() and g.abs().sum() > 0


def test_rejects_non_rgb(cfg: PreprocessConfig) -> None:
    with pytest.raises(ValueError, match="RGB"):
        preprocess_tensor(torch.zeros(1, 4, 8, 8), cfg)


@pytest.mark.parametrize("resample", ["bicubic", "bilinear", "nearest"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.float64, torch.float16])
def test_resize_is_torchvisions_bit_for_bit_without_importing_it(resample: str, dtype: torch.dtype) -> None:
    """``resize`` calls torch as torchvision's v2 resize does: same values, dtype and strides, for
    a channels-last image, a contiguous one and a batch, up and down in each direction."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as tvF

    from retrieval.images.preprocess import resize

    gen = torch.Generator().manual_seed(7)
    for (h, w), size in [((37, 53), (224, 224)), ((240, 320), (16, 300)), ((500, 333), (50, 31)), ((7, 9), (600, 401))]:
        base = torch.randint(0, 256, (h, w, 3), generator=gen, dtype=torch.uint8).to(dtype)
        hwc = base.permute(2, 0, 1)
        for images in (hwc, hwc.contiguous(), torch.stack([hwc, hwc.flip(-1)])):
            want = tvF.resize(images, list(size), interpolation=InterpolationMode(resample), antialias=True)
            got = resize(images, size, resample)
            assert got.dtype == want.dtype and got.stride() == want.stride() and torch.equal(got, want), (h, w, size)


def test_resize_refuses_what_torch_cannot_run_on_tensors() -> None:
    from retrieval.images.preprocess import resize

    with pytest.raises(ValueError, match="lanczos"):
        resize(torch.zeros((3, 8, 8), dtype=torch.uint8), (4, 4), "lanczos")


def test_crop_padding_is_torchvisions(cfg: PreprocessConfig) -> None:
    from torchvision.transforms.v2 import functional as tvF

    from retrieval.images.preprocess import _center_crop

    x = torch.randint(0, 256, (2, 3, 30, 41), dtype=torch.uint8)
    for fill in (0, 128):
        want = tvF.pad(x, [11, 17, 12, 17], fill=fill)  # left, top, right, bottom: 64 x 64
        assert torch.equal(_center_crop(x, (64, 64), fill=fill), want)
