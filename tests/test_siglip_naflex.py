"""SigLIP 2 NaFlex (``model_type`` ``siglip2``, a tiny random checkpoint built offline): each
image keeps its aspect ratio in a grid of at most ``max_num_patches`` patches; vectors equal
``Siglip2Model.get_image_features`` through its own processor, a mixed-aspect batch equals one
image at a time (so an update equals a rebuild), and the bad inputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from imagegen import photo_like

from retrieval.encoders import HFClipEncoder, load_encoder
from retrieval.errors import InvalidArgumentError, ModelLoadError
from retrieval.images import PreprocessConfig, load_pixels, preprocess_images
from retrieval.images.preprocess_config import naflex_size
from retrieval.index import ImageIndex
from retrieval.tools.random_model import make_random_siglip
from retrieval.tools.zeroshot import ZeroShotClassifier

COS = 0.9999
SIZES = [(120, 80), (64, 64), (50, 140), (333, 211), (20, 300), (301, 7)]


@pytest.fixture(scope="module")
def naflex_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_random_siglip(tmp_path_factory.mktemp("naflex") / "siglip2-naflex", preset="siglip2-naflex-tiny")


@pytest.fixture(scope="module")
def encoder(naflex_dir: Path) -> HFClipEncoder:
    enc = load_encoder(str(naflex_dir), device="cpu")
    assert isinstance(enc, HFClipEncoder)
    return enc


@pytest.fixture(scope="module")
def reference(naflex_dir: Path) -> tuple[object, object]:
    from transformers import AutoProcessor, Siglip2Model

    return Siglip2Model.from_pretrained(naflex_dir).eval(), AutoProcessor.from_pretrained(naflex_dir)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_loads_as_naflex(encoder: HFClipEncoder) -> None:
    assert encoder.family.name == "siglip2" and encoder.family.naflex
    assert encoder.info["model_type"] == "siglip2" and encoder.info["max_num_patches"] == 256
    cfg = encoder.preprocess
    assert cfg.naflex and (cfg.max_num_patches, cfg.patch_size, cfg.resample) == (256, 16, "bilinear")
    assert PreprocessConfig.from_dict(cfg.to_dict()) == cfg  # what a manifest records reads back
    assert "max_num_patches" not in PreprocessConfig().to_dict()  # other models' manifests unchanged


def test_sizes_are_siglip2s(encoder: HFClipEncoder) -> None:
    from transformers.models.siglip2.image_processing_siglip2 import get_image_size_for_max_num_patches

    for h, w in [*SIZES, (4000, 3000), (1, 1), (16, 4096)]:
        assert naflex_size(h, w, 16, 256) == get_image_size_for_max_num_patches(h, w, 16, 256)


def test_mixed_aspect_batch_equals_reference_and_one_at_a_time(encoder: HFClipEncoder, reference: tuple) -> None:
    model, processor = reference
    images = [photo_like(w, h, seed=w + h) for w, h in SIZES]
    with torch.no_grad():
        inputs = processor(images=images, return_tensors="pt")
        ref = _unit(model.get_image_features(**inputs).pooler_output.numpy())
    one_by_one = np.concatenate([encoder.embed_pixels(preprocess_images([im], encoder.preprocess)) for im in images])
    assert (one_by_one * ref).sum(1).min() >= COS
    # Packed, images of different aspects stack into one batch and give the same vectors.
    batch = encoder.embed_pixels(preprocess_images(images, encoder.preprocess))
    assert (batch * ref).sum(1).min() >= COS


def test_text_and_sigmoid_scores_equal_the_reference(encoder: HFClipEncoder, reference: tuple) -> None:
    model, processor = reference
    texts = ["a photo of a cat.", "a photo of a dog.", "фото кота", "猫"]
    images = [photo_like(w, h, seed=3) for w, h in SIZES[:3]]
    with torch.no_grad():
        out = model(**processor(text=texts, images=images, return_tensors="pt"))
    ours = encoder.embed_texts(texts)
    assert (ours * _unit(out.text_embeds.numpy())).sum(1).min() >= COS
    classifier = ZeroShotClassifier.build(encoder, ["x"], ["{}"])  # the logit scale and bias
    scale, bias = classifier.scale, classifier.bias
    assert bias is not None
    image_vectors = encoder.embed_pixels(preprocess_images(images, encoder.preprocess))
    probs = 1 / (1 + np.exp(-(scale * image_vectors @ ours.T + bias)))
    np.testing.assert_allclose(probs, torch.sigmoid(out.logits_per_image).numpy(), atol=1e-4)


def test_index_update_equals_rebuild(naflex_dir: Path, encoder: HFClipEncoder, tmp_path: Path) -> None:
    from indexer import build_index

    photos = tmp_path / "photos"
    photos.mkdir()
    for i, (w, h) in enumerate(SIZES):
        photo_like(w, h, seed=i).save(photos / f"p{i}.png")
    updated = tmp_path / "updated"
    kwargs = {"model": str(naflex_dir), "batch_size": 4, "workers": 0, "device": "cpu", "precision": "fp32"}
    build_index(photos, updated, **kwargs)
    photo_like(90, 200, seed=50).save(photos / "new.png")
    build_index(photos, updated, **kwargs)
    rebuilt = tmp_path / "rebuilt"
    build_index(photos, rebuilt, **{**kwargs, "batch_size": 3})
    a, b = ImageIndex.open(updated, device="cpu"), ImageIndex.open(rebuilt, device="cpu")
    assert a.manifest.model_info["model_type"] == "siglip2"
    order = {p: i for i, p in enumerate(b.metadata.paths())}
    assert (a.vectors.embeddings() * b.vectors.embeddings()[[order[p] for p in a.metadata.paths()]]).sum(1).min() >= COS
    for i, path in enumerate(a.metadata.paths()):
        pixels, _, _ = load_pixels(photos / path, encoder.preprocess)
        assert float(a.vectors.embeddings()[i] @ encoder.embed_pixels(pixels[None])[0]) >= COS
    # Image queries go through the same packing; an indexed image finds itself.
    hits = a.search_image(photos / "p2.png", k=1)
    assert hits[0].path == "p2.png" and hits[0].score == pytest.approx(1.0, abs=1e-4)
    assert len(a.search("猫", k=3)) == 3


def test_naflex_bad_inputs(naflex_dir: Path, encoder: HFClipEncoder, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="--image-size does not apply"):
        load_encoder(str(naflex_dir), device="cpu").set_image_size(384)
    encoder.set_image_size(encoder.native_image_size)  # what a query does with the recorded size: nothing
    bad = tmp_path / "fixed-processor"
    shutil.copytree(naflex_dir, bad)
    data = json.loads((bad / "processor_config.json").read_text())
    data["image_processor"] = {"image_processor_type": "SiglipImageProcessor", "size": {"height": 64, "width": 64}}
    (bad / "processor_config.json").write_text(json.dumps(data))
    with pytest.raises(ModelLoadError, match="needs a NaFlex image processor, but its processor is SiglipImageProcessor"):
        load_encoder(str(bad), device="cpu")
    data["image_processor"] = {"image_processor_type": "Siglip2ImageProcessor", "patch_size": 14, "max_num_patches": 256}
    (bad / "processor_config.json").write_text(json.dumps(data))
    with pytest.raises(ModelLoadError, match="patch_size 14 differs from the model's patch_size 16"):
        load_encoder(str(bad), device="cpu")


@pytest.mark.parametrize("precision", ["int8", "bf16", "auto"])
def test_reduced_precisions_embed_naflex(naflex_dir: Path, reference: tuple, precision: str) -> None:
    # The default build precision is auto: NaFlex's patch embedding is a Linear whose caller reads
    # its weight's dtype, so the int8 tower keeps that one layer in float32.
    model, processor = reference
    images = [photo_like(w, h, seed=w * h) for w, h in SIZES[:3]]
    with torch.no_grad():
        ref = _unit(model.get_image_features(**processor(images=images, return_tensors="pt")).pooler_output.numpy())
    enc = load_encoder(str(naflex_dir), device="cpu", precision=precision)
    got = enc.embed_pixels(preprocess_images(images, enc.preprocess))
    assert got.shape == ref.shape and (got * ref).sum(1).min() >= 0.99
