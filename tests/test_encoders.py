"""Parity of our encoders with the reference transformers CLIPModel + CLIPProcessor."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import normalised
from imagegen import photo_like, transparent_photo_like
from PIL import Image

from retrieval.encoders import HFClipEncoder, checkpoint_fingerprint, load_encoder, resolve_device
from retrieval.errors import InvalidArgumentError, ModelLoadError
from retrieval.images import load_pixels

TEXTS = [
    "a dog on a beach",
    "A PHOTO of a Cat!!  ",
    "日本語 café 🐱",
    "two  spaces\tand a tab",
    "word " * 120,  # longer than 77 tokens: truncated like the reference
    "x",
]


def _features(out: object) -> torch.Tensor:
    # transformers 5 returns a model output whose pooler_output is the projected feature.
    return out.pooler_output if hasattr(out, "pooler_output") else out  # type: ignore[attr-defined,return-value]  # out is typed object


@pytest.fixture(scope="module")
def reference(tiny_model: Path):
    from transformers import CLIPModel, CLIPProcessor

    return CLIPModel.from_pretrained(tiny_model).eval(), CLIPProcessor.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def encoder(tiny_model: Path) -> HFClipEncoder:
    return HFClipEncoder.load(str(tiny_model), device="cpu")


def test_config_comes_from_checkpoint(encoder: HFClipEncoder, tiny_model: Path) -> None:
    assert encoder.dim == 48
    assert encoder.preprocess.crop_size == (64, 64)
    assert encoder.preprocess.shortest_edge == 64
    assert encoder.max_text_length == 77
    assert encoder.name == str(tiny_model.resolve())


def test_text_parity_with_reference(encoder: HFClipEncoder, reference) -> None:
    model, proc = reference
    with torch.no_grad():
        batch = proc(text=TEXTS, padding=True, truncation=True, return_tensors="pt")
        ref = normalised(_features(model.get_text_features(**batch)))
    ours = encoder.embed_texts(TEXTS)
    cos = (ours * ref).sum(axis=1)
    assert cos.min() >= 0.99999, cos
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_padded_batch_equals_one_at_a_time(encoder: HFClipEncoder) -> None:
    batched = encoder.embed_texts(TEXTS)
    single = np.concatenate([encoder.embed_texts([t]) for t in TEXTS])
    assert np.abs(batched - single).max() < 1e-5


def test_truncation_to_model_length(encoder: HFClipEncoder) -> None:
    ids = encoder.tokenize(["word " * 200])["input_ids"]
    assert ids.shape[1] == 77
    assert int(ids[0, -1]) == 49407  # still ends with <|endoftext|>, where pooling happens


@pytest.mark.parametrize("size", [(640, 480), (480, 640), (300, 200), (1000, 30)])
@pytest.mark.parametrize("draft", [False, True])
def test_image_parity_with_reference(encoder: HFClipEncoder, reference, tmp_path: Path, size, draft: bool) -> None:
    model, proc = reference
    path = tmp_path / "photo.jpg"
    photo_like(*size, seed=sum(size)).save(path, quality=90)
    with torch.no_grad():
        ref = normalised(_features(model.get_image_features(**proc(images=Image.open(path), return_tensors="pt"))))
    pixels, width, height = load_pixels(path, encoder.preprocess, draft=draft)
    ours = encoder.embed_pixels(pixels[None])
    assert (width, height) == size
    cos = float((ours * ref).sum())
    assert cos >= (0.9999 if draft else 0.999999), cos


def test_transparent_png_matches_reference(encoder: HFClipEncoder, reference, tmp_path: Path) -> None:
    # The reference composites transparency on white, and so do we: parity holds for RGBA too.
    model, proc = reference
    path = tmp_path / "t.png"
    transparent_photo_like(120, 90, seed=3).save(path)
    with torch.no_grad():
        ref = normalised(_features(model.get_image_features(**proc(images=Image.open(path), return_tensors="pt"))))
    pixels, _, _ = load_pixels(path, encoder.preprocess)
    assert float((encoder.embed_pixels(pixels[None]) * ref).sum()) >= 0.99999


def test_vision_tower_only_loaded_for_images(tiny_model: Path) -> None:
    enc = HFClipEncoder.load(str(tiny_model), device="cpu")
    enc.embed_texts(["hello"])
    assert enc._vision_model is None and enc._text_model is not None


def test_fingerprint_tracks_weights(tiny_model: Path, other_model: Path, tmp_path: Path) -> None:
    a = checkpoint_fingerprint(tiny_model)
    assert a.startswith("sha256:") and a == checkpoint_fingerprint(tiny_model)
    assert a != checkpoint_fingerprint(other_model)
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model, copy)
    assert checkpoint_fingerprint(copy) == a  # same weights elsewhere: same fingerprint


def test_unknown_hub_model_says_to_pass_a_local_directory() -> None:
    with pytest.raises(ModelLoadError, match="local checkpoint directory"):
        load_encoder("no-such-org/no-such-clip-model", device="cpu")


def test_missing_local_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_encoder(str(tmp_path / "nope"), device="cpu")


def test_directory_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="config.json"):
        load_encoder(str(tmp_path), device="cpu")


def test_non_clip_config_is_refused(tmp_path: Path, tiny_model: Path) -> None:
    shutil.copytree(tiny_model, tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["model_type"] = "bert"
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError):
        load_encoder(str(tmp_path / "m"), device="cpu")


def test_missing_tower_weights_are_an_error(tmp_path: Path, tiny_model: Path) -> None:
    # A checkpoint without vision weights must not silently embed with random parameters.
    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny_model, tmp_path / "m")
    weights = load_file(tmp_path / "m" / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith("vision_model.")}, tmp_path / "m" / "model.safetensors")
    enc = HFClipEncoder.load(str(tmp_path / "m"), device="cpu")
    enc.embed_texts(["text still works"])
    with pytest.raises(ModelLoadError, match="missing"):
        enc.embed_pixels(torch.zeros(1, 3, 64, 64))


def test_device_resolution() -> None:
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(InvalidArgumentError):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(InvalidArgumentError, match="CUDA"):
            resolve_device("cuda")
