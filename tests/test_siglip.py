"""SigLIP checkpoints (SigLIP 2 FixRes layout, tiny and random, built offline) through the same
encoder as CLIP: parity with ``SiglipModel`` and its own processor, sigmoid scores, the family
recorded and checked, and the bad inputs (other families, a disagreeing processor, a query
longer than the window, finetune). NaFlex: test_siglip_naflex.py."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from imagegen import photo_like
from PIL import Image

from retrieval.encoders import HFClipEncoder, load_encoder
from retrieval.encoders.numpy_text import text_path
from retrieval.errors import FinetuneError, ModelLoadError, ModelMismatchError
from retrieval.images import load_pixels, preprocess_images
from retrieval.index import ImageIndex
from retrieval.tools.random_model import make_random_siglip
from retrieval.tools.zeroshot import ZeroShotClassifier

TEXTS = ["a photo of a cat", "猫的照片", "фотография кошки", "صورة قطة", "🐱 и 🐶", "Straße café naïve", "a dog"]
COS = 0.9999


@pytest.fixture(scope="module")
def siglip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_random_siglip(tmp_path_factory.mktemp("siglip") / "siglip2", seed=0)


@pytest.fixture(scope="module")
def encoder(siglip_dir: Path) -> HFClipEncoder:
    enc = load_encoder(str(siglip_dir), device="cpu")
    assert isinstance(enc, HFClipEncoder)
    return enc


@pytest.fixture(scope="module")
def reference(siglip_dir: Path) -> tuple[object, object]:
    from transformers import AutoProcessor, SiglipModel

    return SiglipModel.from_pretrained(siglip_dir).eval(), AutoProcessor.from_pretrained(siglip_dir)


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("siglip_photos") / "photos"
    root.mkdir()
    for i, (w, h) in enumerate([(120, 80), (64, 64), (50, 140), (300, 200), (97, 61), (80, 120)]):
        photo_like(w, h, seed=70 + i).save(root / f"p{i}.png")
    return root


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_loads_as_siglip_and_records_the_family(encoder: HFClipEncoder) -> None:
    assert encoder.family.name == "siglip" and encoder.dim == 32 and encoder.max_text_length == 64
    info = encoder.info
    assert info["model_type"] == "siglip" and info["context_length"] == 64
    # The SigLIP processor: a squash resize to the square, mean/std 0.5, no crop.
    cfg = encoder.preprocess
    assert (cfg.shortest_edge, cfg.resize_to, cfg.crop_size) == (None, (64, 64), None)
    assert cfg.mean == (0.5, 0.5, 0.5) and cfg.std == (0.5, 0.5, 0.5)
    assert encoder.logit_params() == pytest.approx((10.0, -10.0))


def test_image_vectors_equal_get_image_features_through_its_processor(encoder: HFClipEncoder, reference: tuple) -> None:
    model, processor = reference
    images = [photo_like(w, h, seed=w + h) for w, h in [(120, 80), (64, 64), (50, 140), (333, 211)]]
    ours = encoder.embed_pixels(preprocess_images(images, encoder.preprocess))
    with torch.no_grad():
        ref = model.get_image_features(**processor(images=images, return_tensors="pt")).pooler_output.numpy()
    assert (ours * _unit(ref)).sum(1).min() >= COS
    one_by_one = np.concatenate([encoder.embed_pixels(preprocess_images([im], encoder.preprocess)) for im in images])
    assert (one_by_one * ours).sum(1).min() >= COS


def test_text_vectors_equal_get_text_features_padded_to_the_window(encoder: HFClipEncoder, reference: tuple) -> None:
    model, processor = reference
    ours = encoder.embed_texts(TEXTS)
    with torch.no_grad():
        inputs = processor(text=TEXTS, padding="max_length", max_length=64, truncation=True, return_tensors="pt")
        assert inputs["input_ids"].shape == (len(TEXTS), 64)
        ref = model.get_text_features(**inputs).pooler_output.numpy()
    assert (ours * _unit(ref)).sum(1).min() >= COS
    one_by_one = np.concatenate([encoder.embed_texts([t]) for t in TEXTS])
    assert (one_by_one * ours).sum(1).min() >= COS
    # The text reaches the tokenizer unchanged: each script gives its own vector.
    assert len({tuple(np.round(v, 5)) for v in ours}) == len(TEXTS)


def test_zero_shot_scores_are_siglips_independent_sigmoids(encoder: HFClipEncoder, reference: tuple) -> None:
    model, processor = reference
    labels = ["cat", "dog", "car"]
    images = [photo_like(90, 70, seed=s) for s in range(3)]
    classifier = ZeroShotClassifier.build(encoder, labels, ["a photo of a {}."])
    assert classifier.multi_label
    ours = classifier.scores(encoder.embed_pixels(preprocess_images(images, encoder.preprocess)))
    prompts = [f"a photo of a {label}." for label in labels]
    with torch.no_grad():
        out = model(**processor(text=prompts, images=images, padding="max_length", max_length=64, return_tensors="pt"))
        ref = torch.sigmoid(out.logits_per_image).numpy()
    np.testing.assert_allclose(ours, ref, atol=1e-4)


def test_a_query_longer_than_the_window_is_truncated_with_a_notice(encoder: HFClipEncoder, caplog: pytest.LogCaptureFixture) -> None:
    long = "cat " * 200
    with caplog.at_level(logging.WARNING, logger="retrieval.encoders.hf"):
        got = encoder.embed_texts([long])
    assert "longer than" in caplog.text and "window of 64" in caplog.text and "truncated" in caplog.text
    cut = encoder.tokenizer.decode(encoder.tokenizer(long, truncation=True, max_length=64)["input_ids"])
    np.testing.assert_allclose(got, encoder.embed_texts([cut]), atol=1e-5)


def test_numpy_text_tower_refuses_siglip_so_text_runs_in_torch(siglip_dir: Path) -> None:
    path = text_path(str(siglip_dir))
    assert path.path == "torch" and "siglip" in path.reason and "CLIP" in path.reason


def _edit_json(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_unsupported_families_are_refused_naming_the_supported_ones(siglip_dir: Path, tmp_path: Path) -> None:
    for model_type, expected in [("bert", "'bert' checkpoint"), ("align", "'align' checkpoint")]:
        bad = tmp_path / model_type
        shutil.copytree(siglip_dir, bad)
        _edit_json(bad / "config.json", model_type=model_type)
        with pytest.raises(ModelLoadError, match=expected) as err:
            load_encoder(str(bad), device="cpu")
        assert "clip (CLIP)" in str(err.value) and "siglip (SigLIP" in str(err.value) and "siglip2 (SigLIP 2 NaFlex)" in str(err.value)


def test_a_processor_disagreeing_with_the_model_names_both_values(siglip_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "size"
    shutil.copytree(siglip_dir, bad)
    data = json.loads((bad / "processor_config.json").read_text())
    data["image_processor"]["size"] = {"height": 48, "width": 48}
    (bad / "processor_config.json").write_text(json.dumps(data))
    with pytest.raises(ModelLoadError, match="makes 48x48 inputs but the model's image_size is 64"):
        load_encoder(str(bad), device="cpu")
    data["image_processor"]["size"] = {"height": 64, "width": 64}
    data["image_processor"]["patch_size"] = 14
    (bad / "processor_config.json").write_text(json.dumps(data))
    with pytest.raises(ModelLoadError, match="patch_size 14 differs from the model's patch_size 16"):
        load_encoder(str(bad), device="cpu")


def test_finetune_refuses_siglip_with_the_reason(siglip_dir: Path) -> None:
    from indexer.training.model import load_model

    with pytest.raises(FinetuneError, match="sigmoid loss is not implemented"):
        load_model(str(siglip_dir), "cpu", "siglip2")


def test_index_search_and_query_family_check(
    siglip_dir: Path, encoder: HFClipEncoder, photos: Path, tmp_path: Path, tiny_model: Path
) -> None:
    from indexer import build_index

    out = tmp_path / "idx"
    build_index(photos, out, model=str(siglip_dir), batch_size=4, workers=0, device="cpu", precision="fp32")
    index = ImageIndex.open(out, device="cpu", precision="fp32")  # exact scores to compare
    assert index.manifest.model_info["model_type"] == "siglip"
    paths = index.metadata.paths()
    stored = index.vectors.embeddings()
    # Stored vectors equal the encoder on the same files, however they were batched.
    for i, path in enumerate(paths):
        pixels, _, _ = load_pixels(photos / path, encoder.preprocess)
        assert float(stored[i] @ encoder.embed_pixels(pixels[None])[0]) >= COS
    # Search ranks by cosine, for a query in any script.
    for query in TEXTS[:5]:
        hits = index.search(query, k=len(paths), mode="vector")
        expected = stored @ encoder.embed_texts([query])[0]
        assert [h.score for h in hits] == pytest.approx(sorted(expected, reverse=True), abs=1e-5)
    assert index.encoders.text_path().path == "torch"
    # A CLIP query model is refused by its family, before anything is compared.
    other = ImageIndex.open(out, device="cpu", model=str(tiny_model))
    with pytest.raises(ModelMismatchError, match="built with a siglip model.*is a clip model"):
        other.search("a cat")


def test_rgba_and_grey_images_embed_like_the_reference(encoder: HFClipEncoder, reference: tuple, tmp_path: Path) -> None:
    model, processor = reference
    rgba = photo_like(100, 60, seed=9).convert("RGBA")
    rgba.putalpha(128)
    grey = photo_like(70, 90, seed=10).convert("L")
    for img in (rgba, grey):
        path = tmp_path / f"{img.mode}.png"
        img.save(path)
        pixels, _, _ = load_pixels(path, encoder.preprocess)
        ours = encoder.embed_pixels(pixels[None])
        with Image.open(path) as im:
            flat = im.convert("RGBA")
            white = Image.new("RGBA", flat.size, (255, 255, 255, 255))
            rgb = Image.alpha_composite(white, flat).convert("RGB")
        with torch.no_grad():
            ref = model.get_image_features(**processor(images=[rgb], return_tensors="pt")).pooler_output.numpy()
        assert float((ours * _unit(ref)).sum()) >= COS


def test_reduced_precisions_and_another_image_size_cover_siglip(siglip_dir: Path, encoder: HFClipEncoder) -> None:
    images = [photo_like(w, h, seed=w) for w, h in [(120, 80), (64, 90)]]
    exact_images = encoder.embed_pixels(preprocess_images(images, encoder.preprocess))
    exact_texts = encoder.embed_texts(TEXTS)
    for precision in ("int8", "bf16"):
        reduced = load_encoder(str(siglip_dir), device="cpu", precision=precision)
        assert (reduced.embed_pixels(preprocess_images(images, reduced.preprocess)) * exact_images).sum(1).min() > 0.98
        assert (reduced.embed_texts(TEXTS) * exact_texts).sum(1).min() > 0.98
    # --image-size: the squash resize scaled, the positions interpolated, as get_image_features does.
    from transformers import SiglipModel

    bigger = load_encoder(str(siglip_dir), device="cpu")
    bigger.set_image_size(96)
    assert bigger.preprocess.resize_to == (96, 96)
    pixels = preprocess_images(images, bigger.preprocess)
    with torch.no_grad():
        ref = SiglipModel.from_pretrained(siglip_dir).eval().get_image_features(pixel_values=pixels, interpolate_pos_encoding=True)
    assert (bigger.embed_pixels(pixels) * _unit(ref.pooler_output.numpy())).sum(1).min() >= COS


def test_random_model_cli_writes_a_siglip_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from retrieval.tools.random_model import main

    assert main([str(tmp_path / "s"), "--preset", "siglip-tiny", "--seed", "3"]) == 0
    assert json.loads((tmp_path / "s" / "config.json").read_text())["model_type"] == "siglip"
    assert main([str(tmp_path / "n"), "--preset", "siglip2-naflex-tiny"]) == 0
    assert json.loads((tmp_path / "n" / "config.json").read_text())["model_type"] == "siglip2"
    assert main([str(tmp_path / "x"), "--preset", "siglip-huge"]) == 2
    assert "siglip-tiny" in capsys.readouterr().err
