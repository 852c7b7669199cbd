"""Embedding above the model's native resolution (``--image-size``): parity with the reference
``get_image_features(..., interpolate_pos_encoding=True)`` at that size, recorded in the index,
respected by image queries and updates, and refused where it cannot work."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import cli_here
from imagegen import write_photos
from PIL import Image

from indexer import build_index
from retrieval.encoders import HFClipEncoder
from retrieval.errors import InvalidArgumentError
from retrieval.images import PreprocessConfig, load_pixels
from retrieval.index import ImageIndex


def _photo_size(i: int) -> tuple[int, int]:
    return 120 + 9 * i, 90 + 5 * i


_photos = partial(write_photos, size=_photo_size, name="p{:02d}.jpg", seed=300, quality=92)


def test_embeddings_equal_the_reference_with_interpolated_position_embeddings(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import CLIPImageProcessor, CLIPModel

    photos = sorted(_photos(tmp_path / "p", 4).iterdir())
    enc = HFClipEncoder.load(str(tiny_model), device="cpu")
    assert enc.native_image_size == 64
    enc.set_image_size(96)
    assert enc.preprocess.crop_size == (96, 96) and enc.preprocess.shortest_edge == 96
    ours = enc.embed_pixels(torch.stack([load_pixels(p, enc.preprocess, draft=False)[0] for p in photos]))
    model = CLIPModel.from_pretrained(tiny_model).eval()
    proc = CLIPImageProcessor.from_pretrained(tiny_model, size={"shortest_edge": 96}, crop_size={"height": 96, "width": 96})
    images = [Image.open(p).convert("RGB") for p in photos]
    with torch.no_grad():
        out = model.get_image_features(pixel_values=proc(images=images, return_tensors="pt")["pixel_values"], interpolate_pos_encoding=True)
    ref = (out.pooler_output if hasattr(out, "pooler_output") else out).numpy()
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    assert (ours * ref).sum(axis=1).min() >= 0.9999
    # The native size is not the same embedding: the flag really changes what is computed.
    native = HFClipEncoder.load(str(tiny_model), device="cpu")
    at_64 = native.embed_pixels(torch.stack([load_pixels(p, native.preprocess, draft=False)[0] for p in photos]))
    assert (at_64 * ours).sum(axis=1).max() < 0.9999


def test_bad_sizes_are_refused(tiny_model: Path) -> None:
    enc = HFClipEncoder.load(str(tiny_model), device="cpu")
    for bad in (100, 8, 0, -16, 96.0, True):
        with pytest.raises(InvalidArgumentError, match="multiple of .* patch size 16"):
            enc.set_image_size(bad)  # type: ignore[arg-type]
    from indexer import BuildConfig

    with pytest.raises(InvalidArgumentError, match="image size must be an integer"):
        BuildConfig(image_size=0)


def test_the_index_records_the_size_and_updates_and_queries_keep_it(tiny_model: Path, tmp_path: Path) -> None:
    photos = _photos(tmp_path / "photos", 3)
    idx = tmp_path / "idx"
    build_index(photos, idx, model=str(tiny_model), workers=0, device="cpu", image_size=96, precision="fp32")
    index = ImageIndex.open(idx, device="cpu")
    assert index.manifest.model_info["embed_image_size"] == 96
    assert tuple(PreprocessConfig.from_dict(index.manifest.preprocess).crop_size) == (96, 96)
    # An indexed image finds itself at score 1: the query is embedded at the index's size.
    first = index.files.path(0)
    assert index.search_image(first, k=1)[0].score == pytest.approx(1.0, abs=1e-5)

    _photos(photos, 1, start=3)
    build_index(photos, idx, model=str(tiny_model), workers=0, device="cpu")  # no size: the recorded one
    updated = ImageIndex.open(idx, device="cpu")
    assert updated.manifest.model_info["embed_image_size"] == 96 and updated.count == 4
    enc = HFClipEncoder.load(str(tiny_model), device="cpu")
    enc.set_image_size(96)
    new_id = updated.metadata.paths().index("p03.jpg")
    expected = enc.embed_pixels(load_pixels(photos / "p03.jpg", enc.preprocess)[0][None])[0]
    assert float(updated.vectors.embeddings()[new_id] @ expected) >= 0.99999

    with pytest.raises(InvalidArgumentError, match="embedded at 96 px; pass --rebuild"):
        build_index(photos, idx, model=str(tiny_model), workers=0, device="cpu", image_size=64)
    build_index(photos, idx, model=str(tiny_model), workers=0, device="cpu", image_size=64, rebuild=True)
    assert ImageIndex.open(idx).manifest.model_info["embed_image_size"] == 64


@pytest.mark.slow
def test_cli_image_size(tiny_model: Path, tmp_path: Path) -> None:
    photos = _photos(tmp_path / "photos", 2)
    out = cli_here(["index", photos, tmp_path / "idx", "--model", tiny_model, "--image-size", "128", "--json", "--no-progress"])
    assert out.returncode == 0, out.stderr
    info = json.loads(cli_here(["info", tmp_path / "idx", "--json"]).stdout)
    assert info["model_info"]["embed_image_size"] == 128 and info["preprocess"]["crop_size"] == [128, 128]
    bad = cli_here(["index", photos, tmp_path / "other", "--model", tiny_model, "--image-size", "100"])
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "multiple of" in bad.stderr, bad.stderr
    assert not (tmp_path / "other").exists()
