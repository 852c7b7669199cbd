"""Both places a Hugging Face CLIP checkpoint keeps its image settings.

The Hub's CLIP checkpoints have a top-level ``preprocessor_config.json``; transformers 5's
``CLIPProcessor.save_pretrained`` writes none and nests the settings under ``image_processor``
in ``processor_config.json``. clipsearch reads both, with transformers' precedence, and its
preprocessing equals ``CLIPImageProcessor``'s either way.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import cli_here
from imagegen import photo_like

from retrieval import ImageIndex
from retrieval.encoders import HFClipEncoder, read_image_processor_config
from retrieval.errors import ModelLoadError
from retrieval.images import PreprocessConfig, pil_to_tensor, preprocess_tensor
from retrieval.tools.random_model import build_clip_tokenizer, make_random_clip

PARITY_ATOL = 1e-5  # as in test_images: the reference rounds in float32
# Settings far from CLIPImageProcessor's defaults (224, bicubic, OpenAI mean/std), so that a
# reader that missed them and fell back to the defaults could not pass.
ODD_SETTINGS: dict[str, Any] = {
    "size": {"shortest_edge": 40},
    "crop_size": {"height": 32, "width": 36},
    "resample": 2,
    "image_mean": [0.25, 0.5, 0.75],
    "image_std": [0.5, 0.25, 0.125],
}
SIZES = [(640, 480), (90, 130), (37, 41)]


@pytest.fixture(scope="module")
def nested_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tiny_model``'s weights (same seed), processor saved by ``CLIPProcessor.save_pretrained``."""
    return make_random_clip(tmp_path_factory.mktemp("nested_clip"), preset="tiny", seed=0, processor_layout="processor")


def _checkpoint(out: Path, weights_from: Path, layout: str, **settings: Any) -> Path:
    """A checkpoint with ``weights_from``'s config and weights, its processor saved in ``layout``."""
    from transformers import CLIPImageProcessor, CLIPProcessor

    out.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(weights_from / name, out / name)
    image_processor = CLIPImageProcessor(**settings)
    tokenizer = build_clip_tokenizer(77)
    if layout == "processor":
        CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(out)
    elif layout == "hub":
        image_processor.save_pretrained(out)
        tokenizer.save_pretrained(out)
    else:
        tokenizer.save_pretrained(out)  # "none": no image settings at all
    return out


def _reference_pixels(directory: Path, img: Any) -> torch.Tensor:
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor.from_pretrained(directory)(images=img, return_tensors="pt").pixel_values[0]


def test_clip_processor_save_pretrained_nests_the_image_settings(nested_model: Path) -> None:
    # What transformers 5 writes (checked by experiment with 5.24): the reason for this file.
    names = {p.name for p in nested_model.iterdir()}
    assert "preprocessor_config.json" not in names
    assert {"processor_config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    data = json.loads((nested_model / "processor_config.json").read_text())
    assert data["processor_class"] == "CLIPProcessor"
    nested = data["image_processor"]
    assert nested["image_processor_type"] == "CLIPImageProcessor"
    assert nested["size"] == {"shortest_edge": 64} and nested["crop_size"] == {"height": 64, "width": 64}
    read = read_image_processor_config(nested_model)
    assert read.source == "processor_config.json" and read.settings == nested


def test_nested_checkpoint_loads_with_the_tiny_models_preprocessing(nested_model: Path, tiny_model: Path) -> None:
    nested = HFClipEncoder.load(str(nested_model), device="cpu")
    hub = HFClipEncoder.load(str(tiny_model), device="cpu")
    assert nested.preprocess == hub.preprocess and nested.preprocess.crop_size == (64, 64)
    # Same seed, same weights: the layouts differ only in where the settings are.
    assert nested.fingerprint == hub.fingerprint


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_both_layouts_give_the_reference_preprocessing(tmp_path: Path, tiny_model: Path, size: tuple[int, int]) -> None:
    nested_dir = _checkpoint(tmp_path / "nested", tiny_model, "processor", **ODD_SETTINGS)
    hub_dir = _checkpoint(tmp_path / "hub", tiny_model, "hub", **ODD_SETTINGS)
    assert not (nested_dir / "preprocessor_config.json").exists() and not (hub_dir / "processor_config.json").exists()
    nested = HFClipEncoder.load(str(nested_dir), device="cpu").preprocess
    hub = HFClipEncoder.load(str(hub_dir), device="cpu").preprocess
    assert nested == hub
    assert (nested.shortest_edge, nested.crop_size, nested.resample) == (40, (32, 36), "bilinear")
    img = photo_like(*size, seed=size[0] + size[1])
    ours = preprocess_tensor(pil_to_tensor(img), nested)
    assert tuple(ours.shape) == (3, 32, 36)
    assert torch.equal(ours, preprocess_tensor(pil_to_tensor(img), hub))
    for directory in (nested_dir, hub_dir):
        ref = _reference_pixels(directory, img)
        assert ref.shape == ours.shape and float((ours - ref).abs().max()) <= PARITY_ATOL


def test_both_files_present_follow_transformers_precedence(tmp_path: Path, tiny_model: Path) -> None:
    from transformers import CLIPImageProcessor

    directory = _checkpoint(tmp_path / "both", tiny_model, "processor", **ODD_SETTINGS)
    # A stale top-level file beside it: transformers 5 reads the nested settings first.
    CLIPImageProcessor(size={"shortest_edge": 50}, crop_size={"height": 30, "width": 30}).save_pretrained(directory)
    read = read_image_processor_config(directory)
    assert read.source == "processor_config.json"
    cfg = HFClipEncoder.load(str(directory), device="cpu").preprocess
    assert cfg == PreprocessConfig.from_hf(ODD_SETTINGS)
    img = photo_like(200, 150, seed=4)
    ours = preprocess_tensor(pil_to_tensor(img), cfg)
    ref = _reference_pixels(directory, img)
    assert tuple(ref.shape) == (3, 32, 36) and float((ours - ref).abs().max()) <= PARITY_ATOL


def test_preprocessor_json_of_nested_settings_reads_back_the_same(nested_model: Path, tiny_model: Path) -> None:
    nested = read_image_processor_config(nested_model)
    hub = read_image_processor_config(tiny_model)
    assert hub.source == "preprocessor_config.json"
    assert hub.preprocessor_json() == (tiny_model / "preprocessor_config.json").read_bytes()  # byte for byte
    assert json.loads(nested.preprocessor_json()) == json.loads(hub.raw)


@pytest.mark.parametrize("processor_config", [None, {"processor_class": "CLIPProcessor"}])
def test_no_image_settings_is_a_one_line_error(
    tmp_path: Path, tiny_model: Path, processor_config: dict[str, Any] | None
) -> None:
    directory = _checkpoint(tmp_path / "bare", tiny_model, "none")
    if processor_config is not None:  # a processor file without image settings is not enough
        (directory / "processor_config.json").write_text(json.dumps(processor_config))
    with pytest.raises(ModelLoadError, match="has no preprocessor_config.json"):
        HFClipEncoder.load(str(directory), device="cpu")
    photos = tmp_path / "photos"
    photos.mkdir()
    photo_like(48, 40, seed=1).save(photos / "a.png")
    proc = cli_here(["index", photos, tmp_path / "idx", "--model", directory, "--workers", "0", "--device", "cpu"])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("clipsearch: error: "), proc.stderr
    assert "has no preprocessor_config.json (nor image processor settings in processor_config.json)" in lines[0]
    assert not (tmp_path / "idx" / "manifest.json").exists()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{not json", "unreadable processor_config.json"),
        ('{"image_processor": [1, 2]}', "'image_processor' is not a JSON object"),
    ],
)
def test_damaged_processor_config_is_a_clear_error(tmp_path: Path, tiny_model: Path, content: str, needle: str) -> None:
    # Even beside a good preprocessor_config.json: transformers reads processor_config.json first.
    directory = _checkpoint(tmp_path / "damaged", tiny_model, "hub", **ODD_SETTINGS)
    (directory / "processor_config.json").write_text(content)
    with pytest.raises(ModelLoadError, match=needle) as err:
        HFClipEncoder.load(str(directory), device="cpu")
    assert len(str(err.value).splitlines()) == 1


def test_cli_index_and_search_on_a_nested_checkpoint(tmp_path: Path, nested_model: Path, tiny_model: Path) -> None:
    from indexer import build_index

    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(5):
        photo_like(120 + 10 * i, 90, seed=30 + i).save(photos / f"{i}.png")
    idx = tmp_path / "nested.idx"
    proc = cli_here(["index", photos, idx, "--model", nested_model, "--workers", "0", "--device", "cpu",
                    "--precision", "fp32", "--json"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["indexed"] == 5
    proc = cli_here(["search", idx, "a red square", "-k", "3", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["results"]) == 3
    proc = cli_here(["search", idx, "--image", photos / "2.png", "-k", "1", "--json"])
    assert proc.returncode == 0, proc.stderr
    [hit] = json.loads(proc.stdout)["results"]
    assert hit["path"] == "2.png" and hit["score"] == pytest.approx(1.0, abs=1e-5)
    # The same weights in the Hub layout give the same vectors, bit for bit.
    build_index(photos, tmp_path / "hub.idx", model=str(tiny_model), workers=0, device="cpu", precision="fp32")
    nested_index, hub_index = ImageIndex.open(idx, device="cpu"), ImageIndex.open(tmp_path / "hub.idx", device="cpu")
    assert nested_index.metadata.paths() == hub_index.metadata.paths()
    assert np.array_equal(nested_index.vectors.embeddings(), hub_index.vectors.embeddings())
