"""``retrieval.images.preprocess_numpy``: the numpy preprocessing of torch-free image queries
gives the torch path's pixel values bit for bit (resize, crop, pad, normalisation, decoding),
and refuses what it does not compute."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from imagegen import photo_like

from retrieval.images import PreprocessConfig, load_pixels
from retrieval.images.preprocess import preprocess_tensor, resize
from retrieval.images.preprocess_numpy import load_pixels_array, numpy_preprocessing, preprocess_array, resize_uint8

CONFIGS = {
    "clip": PreprocessConfig(),
    "clip-bilinear": PreprocessConfig(resample="bilinear"),
    "siglip": PreprocessConfig(shortest_edge=None, resize_to=(224, 224), crop_size=None, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
    "open_clip-keep-ratio": PreprocessConfig(shortest_edge=None, keep_ratio_size=(224, 224), keep_ratio_fit="longest",
                                             crop_rounding="round", pad_fill=128),
    "rescale-only": PreprocessConfig(mean=None, std=None, crop_size=(64, 48)),
    "no-rescale": PreprocessConfig(rescale_factor=None, shortest_edge=96, crop_size=(300, 301)),
}
SIZES = [(640, 480), (333, 500), (224, 224), (225, 224), (50, 90), (7, 9), (1000, 750)]


def _torch(image: np.ndarray, cfg: PreprocessConfig) -> np.ndarray:
    return preprocess_tensor(torch.from_numpy(image).permute(2, 0, 1), cfg).numpy()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_pixels_equal_the_torch_paths(name: str) -> None:
    cfg = CONFIGS[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    for width, height in SIZES:
        for image in (np.array(photo_like(width, height, seed=width)), rng.integers(0, 256, (height, width, 3), dtype=np.uint8)):
            got, want = preprocess_array(image, cfg), _torch(image, cfg)
            assert got.dtype == np.float32 and got.shape == want.shape and np.array_equal(got, want), (name, width, height)


@pytest.mark.parametrize("resample", ["bicubic", "bilinear"])
def test_resize_is_torchs_uint8_kernel(resample: str) -> None:
    rng = np.random.default_rng(3)
    ins, outs = [(37, 53), (240, 320), (500, 333), (7, 9), (448, 600)], [(224, 224), (16, 300), (50, 31), (600, 401), (224, 298)]
    for (h, w), size in itertools.product(ins, outs):
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        want = resize(torch.from_numpy(image).permute(2, 0, 1), size, resample).permute(1, 2, 0).numpy()
        if resample == "bilinear" and want.dtype != np.uint8:
            pytest.skip("torch has no native uint8 bilinear kernel on this CPU")
        assert np.array_equal(resize_uint8(image, size, resample), want), (h, w, size)


def test_decoded_files_equal_load_pixels(tmp_path: Path) -> None:
    cfg = CONFIGS["clip"]
    for i, (width, height) in enumerate([(1600, 1200), (300, 200), (90, 50)]):
        img = photo_like(width, height, seed=i)
        for ext in ("jpg", "png"):
            path = tmp_path / f"{i}.{ext}"
            img.save(path)
            want, _, _ = load_pixels(path, cfg)
            assert np.array_equal(load_pixels_array(path, cfg), want.numpy()), path.name


def test_what_it_does_not_compute_is_refused() -> None:
    naflex = PreprocessConfig(shortest_edge=None, crop_size=None, max_num_patches=256, patch_size=16)
    assert not numpy_preprocessing(naflex) and not numpy_preprocessing(PreprocessConfig(resample="lanczos"))
    assert numpy_preprocessing(CONFIGS["clip"])
    with pytest.raises(ValueError, match="numpy preprocessing computes"):
        preprocess_array(np.zeros((8, 8, 3), dtype=np.uint8), PreprocessConfig(resample="nearest"))
    with pytest.raises(ValueError, match="uint8 image"):
        preprocess_array(np.zeros((8, 8, 3), dtype=np.float32), CONFIGS["clip"])
    with pytest.raises(ValueError, match="no numpy kernel"):
        resize_uint8(np.zeros((8, 8, 3), dtype=np.uint8), (4, 4), "box")
