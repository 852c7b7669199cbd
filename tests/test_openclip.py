"""open_clip models as a second encoder backend: names, preprocessing and embedding parity with
open_clip itself, the index contract and model-mismatch checks, offline errors.

Every model here is a tiny open_clip architecture with random weights, built offline from a
custom model config and saved with ``torch.save(model.state_dict(), path)``.
"""

from __future__ import annotations

import io
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import cli_here, run_cli
from helpers import normalised
from imagegen import photo_like, transparent_photo_like
from PIL import Image

from retrieval import ImageIndex
from retrieval.encoders import OpenClipEncoder, load_encoder
from retrieval.encoders.openclip import parse_spec
from retrieval.errors import InvalidArgumentError, ModelLoadError, ModelMismatchError
from retrieval.images import PreprocessConfig, load_pixels, pil_to_tensor, preprocess_tensor, to_rgb

open_clip = pytest.importorskip("open_clip")

# The brief's tiny architecture: ViT width 64 / 2 layers / patch 16 / 64 px; text width 32 /
# 2 layers / 2 heads / 77 tokens / CLIP vocabulary; 48-d embeddings.
TINY_CFG: dict[str, Any] = {
    "embed_dim": 48,
    "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "patch_size": 16, "head_width": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}
# Registered in this process only, to build reference models; the CLI gets the JSON file.
TINY_NAME = "clipsearch-test-tiny"

TEXTS = ["a dog on a beach", "A PHOTO of a Cat!!  ", "日本語 café 🐱", "two  spaces\tand a tab", "word " * 120, "x"]

# SigLIP's preprocessing (open_clip's _slpcfg): squash to the input size, no crop, mean/std 0.5.
SIGLIP_PREPROCESS = {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "interpolation": "bicubic", "resize_mode": "squash"}


def _save_random(name: str, path: Path, seed: int) -> Path:
    torch.manual_seed(seed)
    model = open_clip.create_model(name, pretrained=None)
    torch.save(model.state_dict(), path)
    return path


@pytest.fixture(scope="module")
def tiny_oc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny architecture as a JSON file, its weights (seed 0) and other weights (seed 1)."""
    root = tmp_path_factory.mktemp("open_clip")
    arch = root / f"{TINY_NAME}.json"
    arch.write_text(json.dumps(TINY_CFG))
    open_clip.add_model_config(arch)
    return {
        "arch": arch,
        "weights": _save_random(TINY_NAME, root / "tiny.pt", seed=0),
        "other": _save_random(TINY_NAME, root / "other.pt", seed=1),
        "root": root,
    }


@pytest.fixture(scope="module")
def tiny_spec(tiny_oc: dict[str, Path]) -> str:
    return f"open_clip:{tiny_oc['arch']}@{tiny_oc['weights']}"


@pytest.fixture(scope="module")
def encoder(tiny_spec: str) -> OpenClipEncoder:
    enc = load_encoder(tiny_spec, device="cpu")
    assert isinstance(enc, OpenClipEncoder)
    return enc


@pytest.fixture(scope="module")
def reference(tiny_oc: dict[str, Path]):
    """open_clip's own model, preprocess and tokenizer for the same weights."""
    model, _, preprocess = open_clip.create_model_and_transforms(TINY_NAME, pretrained=str(tiny_oc["weights"]))
    return model.eval(), preprocess, open_clip.get_tokenizer(TINY_NAME)


@pytest.fixture(scope="module")
def siglip_dir(tmp_path_factory: pytest.TempPathFactory, tiny_oc: dict[str, Path]) -> Path:
    """An open_clip directory (``local-dir:``) shaped like SigLIP: squash resize, mean/std 0.5,
    non-causal text tower pooled at the last token, 64 tokens, and a Hugging Face tokenizer
    (SigLIP's own needs the Hub, so the offline CLIP BPE stands in, loaded the same way)."""
    from retrieval.tools.random_model import build_clip_tokenizer

    directory = tmp_path_factory.mktemp("siglip_like")
    text_cfg = {
        **TINY_CFG["text_cfg"],
        "context_length": 64,
        "hf_tokenizer_name": "local",
        "tokenizer_kwargs": {"clean": "canonicalize"},
        "no_causal_mask": True,
        "pool_type": "last",
        "proj_bias": True,
    }
    model_cfg = {**TINY_CFG, "custom_text": True, "init_logit_bias": -10, "text_cfg": text_cfg}
    (directory / "open_clip_config.json").write_text(
        json.dumps({"model_cfg": model_cfg, "preprocess_cfg": SIGLIP_PREPROCESS})
    )
    build_clip_tokenizer(64).save_pretrained(directory)
    torch.manual_seed(2)
    model = open_clip.create_model(f"local-dir:{directory}", load_weights=False)
    torch.save(model.state_dict(), directory / "open_clip_pytorch_model.bin")
    return directory


# ====================================================================== names


def test_canonical_names(tiny_oc: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tiny_oc["root"])
    weights = tiny_oc["weights"].resolve()
    assert parse_spec("open_clip:ViT-B-32/laion2b-S34B-b79k").name == "open_clip:ViT-B-32/laion2b_s34b_b79k"
    assert parse_spec("open_clip:ViT-B-32@tiny.pt").name == f"open_clip:ViT-B-32@{weights}"
    assert parse_spec("open_clip:ViT-B-16-SigLIP/webli@./tiny.pt").name == f"open_clip:ViT-B-16-SigLIP/webli@{weights}"
    assert parse_spec(f"open_clip:{TINY_NAME}.json@tiny.pt").name == f"open_clip:{tiny_oc['arch'].resolve()}@{weights}"
    assert parse_spec("open_clip:hf-hub:timm/ViT-B-16-SigLIP").name == "open_clip:hf-hub:timm/ViT-B-16-SigLIP"
    spec = parse_spec("open_clip:ViT-B-32/openai")
    assert (spec.kind, spec.architecture, spec.pretrained) == ("tag", "ViT-B-32", "openai")


@pytest.mark.parametrize(
    ("name", "error", "needle"),
    [
        ("open_clip:", InvalidArgumentError, "names no model"),
        ("open_clip:ViT-B-32", InvalidArgumentError, "laion2b_s34b_b79k"),  # lists the tags
        ("open_clip:hf-hub:justone", InvalidArgumentError, "ORG/NAME"),
        ("open_clip:ViT-B-32@/no/such/weights.pt", ModelLoadError, "does not exist"),
        ("open_clip:local-dir:/no/such/dir", ModelLoadError, "does not exist"),
        ("open_clip:ViT-B-99/laion2b", ModelLoadError, "list_models"),
        ("open_clip:ViT-B-32/no_such_tag", ModelLoadError, "laion2b_s34b_b79k"),
    ],
)
def test_bad_names(name: str, error: type[Exception], needle: str) -> None:
    with pytest.raises(error, match=needle):
        load_encoder(name, device="cpu")


def test_unknown_architecture_suggests_close_names() -> None:
    with pytest.raises(ModelLoadError, match="ViT-B-32"):
        load_encoder("open_clip:ViT-B32/openai", device="cpu")


def test_uncached_weights_fail_fast_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    # conftest sets HF_HUB_OFFLINE=1 (and this machine has no network anyway). "Fast" checked
    # by construction, not with a stopwatch: no host name is resolved, no connection is tried
    # and nothing sleeps to retry (huggingface_hub's retries wait between attempts).
    import socket
    import threading

    attempts: list[str] = []
    sleep, me = time.sleep, threading.get_ident()

    def no_network(kind: str) -> Any:
        def refuse(*args: object, **kwargs: object) -> Any:
            attempts.append(kind)
            raise OSError(f"test: no {kind}")

        return refuse

    def recording_sleep(seconds: float) -> None:
        if threading.get_ident() == me:
            attempts.append(f"sleep {seconds}")
        sleep(seconds)

    monkeypatch.setattr(socket, "getaddrinfo", no_network("getaddrinfo"))
    monkeypatch.setattr(socket.socket, "connect", no_network("connect"))
    monkeypatch.setattr(time, "sleep", recording_sleep)
    for name in ("open_clip:ViT-B-32/laion2b_s34b_b79k", "open_clip:hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K"):
        with pytest.raises(ModelLoadError, match="local checkpoint") as err:
            load_encoder(name, device="cpu")
        assert "cannot be reached" in str(err.value)
    assert attempts == []


def test_weights_of_another_architecture_are_refused(tiny_oc: dict[str, Path]) -> None:
    enc = load_encoder(f"open_clip:ViT-B-32@{tiny_oc['weights']}", device="cpu")
    with pytest.raises(ModelLoadError, match="cannot load"):
        enc.embed_texts(["x"])


# ====================================================================== preprocessing


def test_preprocess_comes_from_open_clip(encoder: OpenClipEncoder, reference) -> None:
    assert encoder.backend == "open_clip" and encoder.dim == 48 and encoder.max_text_length == 77
    cfg = encoder.preprocess
    assert (cfg.shortest_edge, cfg.crop_size, cfg.resample, cfg.crop_rounding) == (64, (64, 64), "bicubic", "round")
    model, _, _ = reference
    assert PreprocessConfig.from_open_clip(open_clip.get_model_preprocess_cfg(model)) == cfg


OPEN_CLIP_CFGS = {
    "openai": {"size": 64},
    "siglip": {"size": (64, 64), **SIGLIP_PREPROCESS},
    "longest": {"size": 64, "resize_mode": "longest"},
    "longest-fill-bilinear": {"size": (48, 64), "resize_mode": "longest", "fill_color": 128, "interpolation": "bilinear"},
    "shortest-not-square": {"size": (64, 48)},
    "mobileclip": {"size": 64, "mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0), "interpolation": "bilinear"},
}


@pytest.mark.parametrize("cfg_name", sorted(OPEN_CLIP_CFGS))
def test_preprocess_matches_open_clip_transform(cfg_name: str) -> None:
    """Every open_clip resize mode: same geometry (size, crop offsets, padding), pixels within
    the rounding of torchvision's antialiased tensor resize vs PIL's."""
    from open_clip.transform import PreprocessCfg, image_transform_v2

    raw = OPEN_CLIP_CFGS[cfg_name]
    transform = image_transform_v2(PreprocessCfg(**raw), is_train=False)
    cfg = PreprocessConfig.from_open_clip(raw)
    std = torch.tensor(transform.transforms[-1].std)[:, None, None] * 255
    for size in [(640, 480), (480, 640), (301, 97), (65, 63), (40, 30), (1, 1)]:
        img = photo_like(*size, seed=sum(size))
        ref = transform(img)
        ours = preprocess_tensor(pil_to_tensor(img), cfg)
        assert ours.shape == ref.shape, (size, ours.shape, ref.shape)
        diff = ((ours - ref) * std).abs()  # in 0..255 grey levels
        assert float(diff.max()) <= 2.01 and float(diff.mean()) < 0.05, (size, float(diff.max()), float(diff.mean()))


def test_preprocess_dict_round_trip_and_old_dicts() -> None:
    for raw in OPEN_CLIP_CFGS.values():
        cfg = PreprocessConfig.from_open_clip(raw)
        assert PreprocessConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    # A manifest without the open_clip fields (an older format's) still reads, as the HF default.
    old = {"shortest_edge": 224, "resize_to": None, "crop_size": [224, 224], "resample": "bicubic",
           "rescale_factor": 1 / 255, "mean": list(PreprocessConfig().mean), "std": list(PreprocessConfig().std),
           "alpha": "white", "jpeg_draft": True}
    assert PreprocessConfig.from_dict(old) == PreprocessConfig()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"keep_ratio_size": (64, 64)},  # shortest_edge (default 224) would win: refused
        {"shortest_edge": None, "keep_ratio_size": (0, 64)},
        {"shortest_edge": None, "keep_ratio_size": (64, 64), "keep_ratio_fit": "cover"},
        {"crop_rounding": "ceil"},
        {"pad_fill": 256},
        {"pad_fill": 1.5},
    ],
)
def test_new_preprocess_fields_are_validated(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        PreprocessConfig(**kwargs)


@pytest.mark.parametrize(
    "raw", [{"mode": "L"}, {"resize_mode": "fit"}, {"interpolation": "lanczos"}, {"size": (1, 2, 3)}]
)
def test_unsupported_open_clip_preprocess(raw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        PreprocessConfig.from_open_clip(raw)


# ====================================================================== embedding parity


def test_text_parity_with_open_clip(encoder: OpenClipEncoder, reference) -> None:
    model, _, tokenizer = reference
    with torch.no_grad():
        ref = normalised(model.encode_text(tokenizer(TEXTS)))
    ours = encoder.embed_texts(TEXTS)
    assert (ours * ref).sum(axis=1).min() >= 0.99999
    single = np.concatenate([encoder.embed_texts([t]) for t in TEXTS])
    assert np.abs(ours - single).max() < 1e-5


@pytest.mark.parametrize("size", [(640, 480), (480, 640), (300, 200), (1000, 30), (50, 40)])
@pytest.mark.parametrize("draft", [False, True])
def test_image_parity_with_open_clip(encoder: OpenClipEncoder, reference, tmp_path: Path, size, draft: bool) -> None:
    model, preprocess, _ = reference
    path = tmp_path / "photo.jpg"
    photo_like(*size, seed=sum(size)).save(path, quality=90)
    with torch.no_grad():
        ref = normalised(model.encode_image(preprocess(Image.open(path))[None]))
    pixels, width, height = load_pixels(path, encoder.preprocess, draft=draft)
    assert (width, height) == size
    cos = float((encoder.embed_pixels(pixels[None]) * ref).sum())
    assert cos >= 0.9999, cos


def test_cpu_batches_run_in_calls_sized_by_the_patch_grid(encoder: OpenClipEncoder, monkeypatch: pytest.MonkeyPatch) -> None:
    from retrieval.encoders import chunking
    from retrieval.encoders.openclip import encoder as oc_encoder

    visual = encoder.model.visual
    pixels = torch.rand(5, 3, *visual.image_size)
    tokens = (visual.image_size[0] // visual.patch_size[0]) * (visual.image_size[1] // visual.patch_size[1]) + 1
    width = visual.transformer.resblocks[0].mlp.c_fc.out_features
    assert encoder._images_per_call(pixels) == chunking.images_per_call(tokens, width)
    whole = encoder.embed_pixels(pixels)
    # Two images' activations per call: 5 images in calls of 2, 2 and 1, vectors as in one call
    # (fp32: the batch size moves only the last bits, as in open_clip).
    monkeypatch.setattr(oc_encoder, "images_per_call", lambda t, w: 2)
    sizes: list[int] = []
    model = encoder.model
    real = model.encode_image
    monkeypatch.setattr(model, "encode_image", lambda x, **kw: (sizes.append(len(x)), real(x, **kw))[1])
    np.testing.assert_allclose(encoder.embed_pixels(pixels), whole, rtol=0, atol=1e-6)
    assert sizes == [2, 2, 1]


def test_transparent_png_is_composited_on_white(encoder: OpenClipEncoder, reference, tmp_path: Path) -> None:
    # open_clip's preprocess ends in convert("RGB"), which drops alpha and shows whatever colour
    # the transparent pixels hold; we composite transparency onto white for every backend (what
    # a viewer shows, and the same policy as the HF path). Parity holds against open_clip given
    # that composited image; against open_clip on the raw RGBA file it does not, by design.
    model, preprocess, _ = reference
    path = tmp_path / "t.png"
    transparent_photo_like(120, 90, seed=3).save(path)
    pixels, _, _ = load_pixels(path, encoder.preprocess)
    ours = encoder.embed_pixels(pixels[None])
    with torch.no_grad():
        on_white = normalised(model.encode_image(preprocess(to_rgb(Image.open(path)))[None]))
        dropped = normalised(model.encode_image(preprocess(Image.open(path))[None]))
    assert float((ours * on_white).sum()) >= 0.9999
    assert float((ours * dropped).sum()) < float((ours * on_white).sum())


def test_siglip_like_directory_parity(siglip_dir: Path, tmp_path: Path) -> None:
    enc = load_encoder(f"open_clip:local-dir:{siglip_dir}", device="cpu")
    assert enc.name == f"open_clip:local-dir:{siglip_dir.resolve()}"
    cfg = enc.preprocess
    assert (cfg.shortest_edge, cfg.resize_to, cfg.crop_size) == (None, (64, 64), None)
    assert cfg.mean == (0.5, 0.5, 0.5) and cfg.std == (0.5, 0.5, 0.5)
    assert enc.max_text_length == 64
    model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{siglip_dir}")
    model.eval()
    tokenizer = open_clip.get_tokenizer(f"local-dir:{siglip_dir}")
    assert type(tokenizer).__name__ == "HFTokenizer" and type(enc.tokenizer).__name__ == "HFTokenizer"
    with torch.no_grad():
        ref_text = normalised(model.encode_text(tokenizer(TEXTS)))
    assert (enc.embed_texts(TEXTS) * ref_text).sum(axis=1).min() >= 0.99999
    for size in [(640, 480), (97, 301)]:
        path = tmp_path / f"{size}.jpg"
        photo_like(*size, seed=7).save(path, quality=90)
        with torch.no_grad():
            ref = normalised(model.encode_image(preprocess(Image.open(path))[None]))
        pixels, _, _ = load_pixels(path, enc.preprocess, draft=False)
        assert float((enc.embed_pixels(pixels[None]) * ref).sum()) >= 0.9999


def test_hub_repository_loads_from_the_cache(tiny_oc: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``open_clip:hf-hub:ORG/NAME`` offline, from a Hugging Face cache laid out like a download."""
    from huggingface_hub import constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--test-org--tiny-oc"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (snapshot / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_CFG, "preprocess_cfg": SIGLIP_PREPROCESS}))
    shutil.copy(tiny_oc["weights"], snapshot / "open_clip_pytorch_model.bin")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    enc = load_encoder("open_clip:hf-hub:test-org/tiny-oc", device="cpu")
    assert enc.name == "open_clip:hf-hub:test-org/tiny-oc"
    assert enc.preprocess.resize_to == (64, 64) and enc.preprocess.mean == (0.5, 0.5, 0.5)
    model, _, preprocess = open_clip.create_model_and_transforms("hf-hub:test-org/tiny-oc")
    model.eval()
    tokenizer = open_clip.get_tokenizer("hf-hub:test-org/tiny-oc")
    with torch.no_grad():
        ref_text = normalised(model.encode_text(tokenizer(TEXTS)))
    assert (enc.embed_texts(TEXTS) * ref_text).sum(axis=1).min() >= 0.99999
    path = tmp_path / "p.jpg"
    photo_like(300, 200, seed=5).save(path, quality=90)
    with torch.no_grad():
        ref = normalised(model.encode_image(preprocess(Image.open(path))[None]))
    pixels, _, _ = load_pixels(path, enc.preprocess, draft=False)
    assert float((enc.embed_pixels(pixels[None]) * ref).sum()) >= 0.9999


def test_text_query_does_not_run_the_vision_tower(tiny_spec: str) -> None:
    enc = load_encoder(tiny_spec, device="cpu")
    assert enc._model is None  # loading resolved names, sizes and preprocessing only
    calls: list[int] = []
    enc.model.visual.register_forward_hook(lambda *_: calls.append(1))
    enc.embed_texts(["hello"])
    assert calls == []


# ====================================================================== identity


def test_fingerprint_tracks_weights_and_architecture(tiny_oc: dict[str, Path], encoder: OpenClipEncoder, tmp_path: Path) -> None:
    assert encoder.fingerprint.startswith("sha256:")
    copy = tmp_path / "copy.pt"
    shutil.copy(tiny_oc["weights"], copy)
    assert load_encoder(f"open_clip:{tiny_oc['arch']}@{copy}", device="cpu").fingerprint == encoder.fingerprint
    assert load_encoder(f"open_clip:{tiny_oc['arch']}@{tiny_oc['other']}", device="cpu").fingerprint != encoder.fingerprint
    # Same weights, QuickGELU activations: other embeddings, so another model.
    quick = tmp_path / "quick.json"
    quick.write_text(json.dumps({**TINY_CFG, "quick_gelu": True}))
    assert load_encoder(f"open_clip:{quick}@{tiny_oc['weights']}", device="cpu").fingerprint != encoder.fingerprint


# ====================================================================== index and CLI


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("oc_photos")
    for i, size in enumerate([(320, 240), (200, 300), (64, 64), (500, 120)]):
        photo_like(*size, seed=i).save(root / f"{i}.jpg", quality=90)
    (root / "broken.jpg").write_bytes(b"not a jpeg")
    return root


@pytest.fixture(scope="module")
def cli_index(tmp_path_factory: pytest.TempPathFactory, photos: Path, tiny_spec: str) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("oc_cli") / "photos.idx"
    proc = cli_here(["index", photos, out, "--model", tiny_spec, "--workers", "1", "--device", "cpu", "--json"])
    assert proc.returncode == 0, proc.stderr
    return out, json.loads(proc.stdout)


@pytest.mark.slow
def test_cli_index_and_search(cli_index, encoder: OpenClipEncoder, photos: Path) -> None:
    out, summary = cli_index
    assert (summary["indexed"], summary["skipped"], summary["dim"]) == (4, 1, 48)
    assert summary["model"] == encoder.name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["backend"] == "open_clip" and manifest["model"] == encoder.name
    assert manifest["model_fingerprint"] == encoder.fingerprint
    assert PreprocessConfig.from_dict(manifest["preprocess"]) == encoder.preprocess
    info = manifest["model_info"]
    assert ImageIndex.open(out).info()["model_info"] == info
    assert info["architecture_file"] == str(parse_spec(encoder.name).arch_file)
    assert info["weights_sha256"] and info["preprocess_cfg"]["resize_mode"] == "shortest"
    # Stored vectors are the encoder's own, in the mode auto chose on this CPU (int8 with VNNI,
    # bf16 first with AMX, fp32 below AVX2): each photo finds itself.
    index = ImageIndex.open(out, device="cpu")
    same_mode = load_encoder(encoder.name, device="cpu", precision=info["precision"])
    for name in ("0.jpg", "3.jpg"):
        # Decoded as the build decoded (decode auto: drafted only where its gate passed).
        pixels, _, _ = load_pixels(photos / name, encoder.preprocess, draft=manifest["preprocess"]["jpeg_draft"])
        hit = index.search_vectors(same_mode.embed_pixels(pixels[None]), k=1)[0][0]
        assert hit.path == name and hit.score == pytest.approx(1.0, abs=1e-5)
    proc = run_cli(["search", out, "a dog on a beach", "-k", "3", "--json", "--device", "cpu"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == ""
    results = json.loads(proc.stdout)["results"]
    api = index.search("a dog on a beach", k=3)
    assert [r["id"] for r in results] == [h.id for h in api]
    top = index.search_image(photos / "1.jpg", k=1)[0]
    assert top.path == "1.jpg" and top.score == pytest.approx(1.0, abs=1e-4)


def test_hf_model_cannot_search_open_clip_index(cli_index, tiny_model: Path, encoder: OpenClipEncoder) -> None:
    # Same dim (48), other backend: refused, naming both (the CLI prints this message as is).
    out, _ = cli_index
    with pytest.raises(ModelMismatchError, match="mismatch") as err:
        ImageIndex.open(out, model=str(tiny_model), device="cpu").search("a cat")
    assert encoder.name in str(err.value) and str(tiny_model.resolve()) in str(err.value)


def test_other_weights_are_refused_same_weights_accepted(cli_index, tiny_oc: dict[str, Path], tmp_path: Path) -> None:
    out, _ = cli_index
    other = f"open_clip:{tiny_oc['arch']}@{tiny_oc['other']}"
    with pytest.raises(ModelMismatchError) as err:
        ImageIndex.open(out, model=other, device="cpu").search("a cat")
    assert str(tiny_oc["weights"]) in str(err.value) and str(tiny_oc["other"]) in str(err.value)
    copy = tmp_path / "elsewhere.pt"
    shutil.copy(tiny_oc["weights"], copy)
    assert ImageIndex.open(out, model=f"open_clip:{tiny_oc['arch']}@{copy}", device="cpu").search("a cat", k=1)


def test_hf_index_refuses_open_clip_query(tmp_path: Path, photos: Path, tiny_model: Path, tiny_spec: str) -> None:
    from indexer import build_index

    build_index(photos, tmp_path / "hf.idx", model=str(tiny_model), workers=0, device="cpu")
    with pytest.raises(ModelMismatchError) as err:
        ImageIndex.open(tmp_path / "hf.idx", model=tiny_spec, device="cpu").search("a cat")
    assert str(tiny_model.resolve()) in str(err.value) and tiny_spec.split("@")[0] in str(err.value)


def test_update_and_rebuild_without_model_keep_the_open_clip_model(tmp_path: Path, photos: Path, tiny_spec: str,
                                                                   encoder: OpenClipEncoder) -> None:
    """Without model= an open_clip index keeps its backend and its name (architecture, tag,
    weights) on update and rebuild: its recorded name loads the same model."""
    from indexer import build_index

    out = tmp_path / "oc.idx"
    build_index(photos, out, model=tiny_spec, workers=0, device="cpu")
    update = build_index(photos, out, workers=0, device="cpu")
    assert (update.model, update.unchanged) == (encoder.name, 4)
    rebuilt = build_index(photos, out, workers=0, device="cpu", rebuild=True)
    assert (rebuilt.model, rebuilt.added) == (encoder.name, 4)
    manifest = ImageIndex.open(out).manifest
    assert (manifest.model, manifest.backend, manifest.model_fingerprint) == (encoder.name, "open_clip", encoder.fingerprint)


def test_int8_open_clip_is_close_to_fp32_and_batch_invariant(tiny_spec: str, encoder: OpenClipEncoder, photos: Path) -> None:
    from retrieval.encoders import precision as P
    from retrieval.encoders.int8 import Int8Linear, Int8PatchEmbedding, Int8SelfAttention, quantize_int8

    enc = load_encoder(tiny_spec, device="cpu", precision="int8")
    names = sorted(p.name for p in photos.iterdir() if p.name != "broken.jpg")
    pixels = torch.stack([load_pixels(photos / n, enc.preprocess)[0] for n in names])
    vectors = enc.embed_pixels(pixels)
    result = P.gate("int8", encoder.embed_pixels(pixels), vectors)
    assert result.passed and result.min_cosine > 0.999, result
    # Every int8 product sees the same codes in any batch; only open_clip's final projection
    # (x @ proj, float32) rounds with the batch size, as in fp32.
    np.testing.assert_allclose(enc.embed_pixels(pixels[2:3]), vectors[2:3], rtol=0, atol=1e-6)
    texts = ["a dog", "two  spaces\tand a tab"]
    together = enc.embed_texts(texts)
    np.testing.assert_allclose(enc.embed_texts(texts[1:]), together[1:], rtol=0, atol=1e-6)
    assert (encoder.embed_texts(texts) * together).sum(axis=1).min() > 0.999
    # open_clip's own module: patch convolution, attention and MLPs convert; quick-GELU MLPs
    # are folded; the causal mask of the text tower is honoured.
    model = open_clip.create_model(TINY_NAME, pretrained=None, force_quick_gelu=True).eval()
    q = quantize_int8(model)
    block = q.visual.transformer.resblocks[0]
    assert isinstance(q.visual.conv1, Int8PatchEmbedding) and isinstance(block.mlp.c_fc, Int8Linear)
    assert isinstance(block.attn, Int8SelfAttention) and type(block.mlp.gelu).__name__ == "_SiluInPlace"
    x = torch.randn(3, 3, 64, 64)
    tokens = open_clip.get_tokenizer(TINY_NAME)(["a dog on a beach", "x", "a much longer caption about a red car"])
    with torch.inference_mode():
        for ref, out in ((model.encode_image(x), q.encode_image(x)), (model.encode_text(tokens), q.encode_text(tokens))):
            cos = torch.nn.functional.cosine_similarity(ref, out)
            assert cos.min() > 0.999, cos
        # Attention weights or cross-attention go to the original fp32 module.
        h = torch.randn(2, 5, 64)
        _, weights = block.attn(h, h, h, need_weights=True)
        assert weights is not None and weights.shape == (2, 5, 5)


# ====================================================================== zero-shot


def test_zero_shot_classifier_equals_open_clips(encoder: OpenClipEncoder, reference) -> None:
    from open_clip.zero_shot_metadata import SIMPLE_IMAGENET_TEMPLATES

    from retrieval.tools.zeroshot import SIMPLE_TEMPLATES, ZeroShotClassifier

    model, preprocess, tokenizer = reference
    labels = ["dog", "cat", "red car"]
    ours = ZeroShotClassifier.build(encoder, labels, SIMPLE_TEMPLATES)
    with torch.no_grad():
        theirs = open_clip.build_zero_shot_classifier(model, tokenizer, labels, SIMPLE_IMAGENET_TEMPLATES, device="cpu")
        image = preprocess(photo_like(80, 64, seed=5)).unsqueeze(0)
        feats = model.encode_image(image, normalize=True)
        probs = (model.logit_scale.exp() * feats @ theirs).softmax(dim=-1)[0].numpy()
    assert np.allclose(ours.weights, theirs.T.numpy(), atol=1e-5)
    assert ours.bias is None and ours.scale == pytest.approx(float(model.logit_scale.detach().exp()), rel=1e-6)
    pixels = load_pixels(_png(photo_like(80, 64, seed=5)), encoder.preprocess)[0][None]
    assert np.allclose(ours.scores(encoder.embed_pixels(pixels))[0], probs, atol=1e-4)


def test_siglip_like_scores_are_sigmoids_with_the_logit_bias(siglip_dir: Path) -> None:
    from retrieval.tools.zeroshot import ZeroShotClassifier

    enc = load_encoder(f"open_clip:local-dir:{siglip_dir}", device="cpu")
    model, _, _ = open_clip.create_model_and_transforms(f"local-dir:{siglip_dir}")
    scale, bias = enc.logit_params()
    assert bias == pytest.approx(float(model.logit_bias.detach())) and scale == pytest.approx(float(model.logit_scale.detach().exp()))
    clf = ZeroShotClassifier.build(enc, ["a", "b"], ["{}"])
    image = np.eye(48, dtype=np.float32)[:1]
    expected = 1 / (1 + np.exp(-(scale * image.astype(np.float64) @ clf.weights.T.astype(np.float64) + bias)))
    assert clf.multi_label and np.allclose(clf.scores(image), expected, atol=1e-6)


def _png(img: Image.Image) -> io.BytesIO:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    buf.seek(0)
    return buf


def test_image_size_is_refused_for_open_clip_models(encoder: OpenClipEncoder) -> None:
    encoder.set_image_size(64)  # its own size: nothing to do
    with pytest.raises(InvalidArgumentError, match="needs a Hugging Face CLIP checkpoint"):
        encoder.set_image_size(96)
