"""Tests of image decoding and CLIP preprocessing (the ``retrieval/images/`` package)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import PIL.Image
import pytest
import torch
from PIL import Image

from retrieval.errors import ImageDecodeError
from retrieval.images import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    PreprocessConfig,
    decode_image,
    load_pixels,
    pil_to_tensor,
    preprocess_images,
    preprocess_tensor,
    resize_output_size,
    to_rgb,
)

try:
    from imagegen import GIF_FRAME_COLORS, Collection, _bomb_png, encode_image, photo_like
except ImportError:  # pragma: no cover
    from tests.imagegen import GIF_FRAME_COLORS, Collection, _bomb_png, encode_image, photo_like  # type: ignore[no-redef]  # same names, tests package

# Preprocessing must be the same ops as the reference processor: float32 rounding only.
PARITY_ATOL = 1e-5


def _reopen(img: Image.Image, fmt: str = "PNG", **kwargs: Any) -> Image.Image:
    out = Image.open(io.BytesIO(encode_image(img, fmt, **kwargs)))
    out.load()
    return out


def _arr(img: Image.Image) -> np.ndarray:
    return np.asarray(img).astype(np.int64)


# ====================================================================== decode_image


def test_decode_every_good_file(collection: Collection) -> None:
    assert collection.good
    for rel, size in collection.good.items():
        d = decode_image(collection.root / rel)
        assert d.image.mode == "RGB", rel
        assert (d.width, d.height) == size, rel
        assert d.image.size == size, rel


def test_decode_bytes_path_and_stream(collection: Collection) -> None:
    raw = os.fsencode(collection.root) + b"/intl/latin1_caf\xe9.jpg"
    d = decode_image(raw)
    assert (d.width, d.height) == (90, 120)
    with open(collection.root / "photos/a.jpg", "rb") as fh:
        d2 = decode_image(fh)
    assert (d2.width, d2.height) == (640, 480) and d2.image.mode == "RGB"


def test_decode_collection_transparency_and_16bit(collection: Collection) -> None:
    rgba = _arr(decode_image(collection.root / "formats/rgba.png").image)
    assert (rgba[:, :60] == 255).all()  # fully transparent band -> white
    pal = _arr(decode_image(collection.root / "formats/palette_trns.png").image)
    assert (pal[0:31, 0:41] == 255).all()  # transparent palette index -> white
    g16 = _arr(decode_image(collection.root / "formats/gray16.png").image)
    # Gradient over 0..65535 scaled to 0..255, not clipped (clipping would make it ~all white).
    assert g16[0, 0].tolist() == [0, 0, 0]
    assert g16[-1, -1].tolist() == [255, 255, 255]
    assert 110 < g16.mean() < 145
    assert (g16[..., 0] == g16[..., 1]).all() and (g16[..., 0] == g16[..., 2]).all()


def _half_red_half_blue_jpeg(orientation: int) -> bytes:
    img = Image.new("RGB", (200, 100), (255, 0, 0))
    img.paste((0, 0, 255), (100, 0, 200, 100))  # left half red, right half blue
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode_image(img, "JPEG", quality=95, exif=exif.tobytes())


def _is_red(px: tuple[int, ...]) -> bool:
    return px[0] > 200 and px[1] < 50 and px[2] < 50


def _is_blue(px: tuple[int, ...]) -> bool:
    return px[0] < 50 and px[1] < 50 and px[2] > 200


def test_exif_orientation_6_rotates_pixels(tmp_path: Path) -> None:
    # Orientation 6 = "rotate 90 degrees clockwise to display" (exif_transpose uses
    # Transpose.ROTATE_270, i.e. 270 counter-clockwise): the stored left edge becomes the top.
    # Stored 200x100 [red | blue]  ->  shown 100x200, red on top, blue below.
    p = tmp_path / "o6.jpg"
    p.write_bytes(_half_red_half_blue_jpeg(6))
    d = decode_image(p)
    assert (d.width, d.height) == (100, 200)
    assert d.image.size == (100, 200)
    im = d.image
    for x in (10, 50, 90):
        assert _is_red(im.getpixel((x, 20))) and _is_red(im.getpixel((x, 80)))
        assert _is_blue(im.getpixel((x, 120))) and _is_blue(im.getpixel((x, 180)))


def test_exif_orientation_3_rotates_180(tmp_path: Path) -> None:
    p = tmp_path / "o3.jpg"
    p.write_bytes(_half_red_half_blue_jpeg(3))
    d = decode_image(p)
    assert (d.width, d.height) == (200, 100)
    assert _is_blue(d.image.getpixel((20, 50))) and _is_red(d.image.getpixel((180, 50)))


def test_exif_orientation_with_draft(tmp_path: Path) -> None:
    p = tmp_path / "o6.jpg"
    p.write_bytes(_half_red_half_blue_jpeg(6))
    d = decode_image(p, min_edge=50)  # stored 200x100 -> draft 1/2 = 100x50 -> shown 50x100
    assert (d.width, d.height) == (100, 200)
    assert d.image.size == (50, 100)
    assert _is_red(d.image.getpixel((25, 10))) and _is_blue(d.image.getpixel((25, 90)))


@pytest.mark.parametrize("rel", ["formats/animated.gif", "formats/animated.webp"])
def test_animated_first_frame(collection: Collection, rel: str) -> None:
    if rel not in collection.good:
        pytest.skip(f"{rel} not written (no animated WebP writer)")
    d = decode_image(collection.root / rel)
    assert d.image.size == (64, 48)
    # The bottom-right corner is never covered by the frame's white ellipse.
    px = np.array(d.image.getpixel((63, 47)))
    assert np.abs(px - np.array(GIF_FRAME_COLORS[0])).max() <= 8, px


_BROKEN_WORDS = {
    "empty": "empty",
    "truncated": "truncated",
    "not-an-image": "not an image",
    "bomb": "decompression bomb",
    "unreadable": "permission denied",
}


def test_broken_files_raise(collection: Collection) -> None:
    assert {"empty", "truncated", "not-an-image", "bomb"} <= set(collection.broken.values())
    for rel, category in collection.broken.items():
        with pytest.raises(ImageDecodeError) as exc:
            decode_image(collection.root / rel)
        assert _BROKEN_WORDS[category] in exc.value.reason, (rel, exc.value.reason)
        assert exc.value.path == str(collection.root / rel)
        assert rel.split("/")[-1] in str(exc.value)


def test_decode_name_used_in_errors(collection: Collection) -> None:
    with pytest.raises(ImageDecodeError) as exc:
        decode_image(collection.root / "broken/empty.jpg", name="broken/empty.jpg")
    assert exc.value.path == "broken/empty.jpg"


def test_decode_empty_stream() -> None:
    with pytest.raises(ImageDecodeError) as exc:
        decode_image(io.BytesIO(b""))
    assert "empty" in exc.value.reason


def test_decode_missing_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ImageDecodeError) as exc:
        decode_image(tmp_path / "missing.jpg")
    assert "not found" in exc.value.reason
    with pytest.raises(ImageDecodeError) as exc:
        decode_image(tmp_path)
    assert "directory" in exc.value.reason


def test_decode_permission_denied(collection: Collection, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests may run as root, who can read mode-000 files: simulate the error instead.
    def deny(fp: Any, *args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied", str(fp))

    monkeypatch.setattr(PIL.Image, "open", deny)
    with pytest.raises(ImageDecodeError) as exc:
        decode_image(collection.root / "photos/a.jpg")
    assert exc.value.reason == "permission denied"


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read mode-000 files")
def test_decode_really_unreadable(tmp_path: Path) -> None:  # pragma: no cover - root in CI
    p = tmp_path / "locked.jpg"
    p.write_bytes(encode_image(Image.new("RGB", (8, 8)), "JPEG"))
    p.chmod(0)
    with pytest.raises(ImageDecodeError) as exc:
        decode_image(p)
    assert exc.value.reason == "permission denied"


def test_max_pixels_refuses(collection: Collection) -> None:
    with pytest.raises(ImageDecodeError) as exc:
        decode_image(collection.root / "photos/a.jpg", max_pixels=640 * 480 - 1)
    assert "decompression bomb" in exc.value.reason
    # Exactly at the limit is fine.
    d = decode_image(collection.root / "photos/a.jpg", max_pixels=640 * 480)
    assert (d.width, d.height) == (640, 480)


def test_pil_bomb_warning_range_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Between 1x and 2x of PIL's limit PIL only warns; the default limit must still refuse.
    p = tmp_path / "warn.png"
    p.write_bytes(_bomb_png(150, 100))
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", 10_000)
    with pytest.raises(ImageDecodeError) as exc:
        decode_image(p, max_pixels=10_000)
    assert "decompression bomb" in exc.value.reason


@pytest.mark.parametrize("size", [(150, 100), (300, 100)], ids=["pil-warns", "pil-errors"])
def test_max_pixels_above_pil_limit_is_honoured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> None:
    # A caller's max_pixels above PIL's own limit is honoured (PIL's check in Image.open must
    # not fire first). Simulated with a small PIL limit to stay fast.
    p = tmp_path / "big.png"
    p.write_bytes(_bomb_png(*size))
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", 10_000)
    d = decode_image(p, max_pixels=1_000_000)
    assert (d.width, d.height) == size


# ---------------------------------------------------------------------- JPEG draft


@pytest.fixture(scope="module")
def photo_jpeg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("draft") / "photo.jpg"
    p.write_bytes(encode_image(photo_like(640, 480, 42), "JPEG", quality=90))
    return p


def test_jpeg_draft_reduces_decode(photo_jpeg: Path) -> None:
    # PIL's draft picks the largest DCT scale keeping both sides >= 64:
    # 480/4 = 120 >= 64 but 480/8 = 60 < 64 -> 1/4 -> 160x120.
    d = decode_image(photo_jpeg, min_edge=64)
    assert d.image.size == (160, 120)
    assert 64 <= min(d.image.size) < 128
    assert (d.width, d.height) == (640, 480)
    assert d.image.mode == "RGB"


@pytest.mark.parametrize(
    "min_edge, size", [(None, (640, 480)), (480, (640, 480)), (200, (320, 240)), (120, (160, 120)), (1, (80, 60))]
)
def test_jpeg_draft_scales(photo_jpeg: Path, min_edge: int | None, size: tuple[int, int]) -> None:
    d = decode_image(photo_jpeg, min_edge=min_edge)
    assert d.image.size == size
    assert (d.width, d.height) == (640, 480)


def test_jpeg_draft_image_close_to_full_decode(photo_jpeg: Path) -> None:
    small = _arr(decode_image(photo_jpeg, min_edge=64).image)
    full = decode_image(photo_jpeg).image.resize((160, 120), Image.Resampling.BOX)
    assert np.abs(small - _arr(full)).mean() < 4


def test_png_min_edge_does_nothing(tmp_path: Path) -> None:
    p = tmp_path / "photo.png"
    p.write_bytes(encode_image(photo_like(640, 480, 42), "PNG"))
    d = decode_image(p, min_edge=64)
    assert d.image.size == (640, 480)
    assert (d.width, d.height) == (640, 480)


# ====================================================================== to_rgb


def test_to_rgb_rgb_passthrough() -> None:
    img = photo_like(32, 24, 1)
    out = to_rgb(img)
    assert out.mode == "RGB"
    assert np.array_equal(_arr(out), _arr(img))


def test_to_rgb_rgba_fully_transparent_is_white() -> None:
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (10, 12, 4), dtype=np.uint8)
    arr[..., 3] = 0
    out = _arr(to_rgb(Image.fromarray(arr, "RGBA")))
    assert (out == 255).all()


def test_to_rgb_rgba_opaque_keeps_colour_and_half_alpha_blends() -> None:
    arr = np.zeros((2, 3, 4), np.uint8)
    arr[0] = [[10, 20, 30, 255], [0, 0, 0, 128], [200, 100, 50, 128]]
    arr[1] = [[255, 0, 0, 64], [0, 255, 0, 0], [1, 2, 3, 255]]
    out = _arr(to_rgb(Image.fromarray(arr, "RGBA")))
    rgb = arr[..., :3].astype(np.float64)
    a = arr[..., 3:].astype(np.float64) / 255.0
    expected = rgb * a + 255.0 * (1.0 - a)
    assert np.abs(out - expected).max() <= 1
    assert out[0, 0].tolist() == [10, 20, 30]
    assert abs(out[0, 1, 0] - 127) <= 1  # black at alpha 128 over white


def test_to_rgb_palette_with_transparent_index() -> None:
    pal = Image.new("P", (6, 4), 0)
    pal.putpalette([0, 0, 0, 200, 10, 10, 10, 200, 10] + [0] * (256 * 3 - 9))
    pal.paste(1, (0, 0, 3, 4))
    pal.paste(2, (3, 0, 6, 2))
    img = _reopen(pal, "PNG", transparency=0)
    assert img.mode == "P" and "transparency" in img.info
    out = _arr(to_rgb(img))
    assert (out[0:4, 0:3] == [200, 10, 10]).all()
    assert (out[0:2, 3:6] == [10, 200, 10]).all()
    assert (out[2:4, 3:6] == 255).all()  # index 0 is transparent -> white


def test_to_rgb_la() -> None:
    arr = np.array([[[0, 0], [0, 255], [100, 128], [255, 0]]], np.uint8)
    out = _arr(to_rgb(Image.fromarray(arr, "LA")))
    assert out.shape == (1, 4, 3)
    assert out[0, 0].tolist() == [255, 255, 255]
    assert out[0, 1].tolist() == [0, 0, 0]
    expected = 100 * 128 / 255 + 255 * (1 - 128 / 255)
    assert np.abs(out[0, 2] - expected).max() <= 1
    assert out[0, 3].tolist() == [255, 255, 255]


def test_to_rgb_l_replicated() -> None:
    arr = np.arange(0, 256, dtype=np.uint8).reshape(16, 16)
    out = _arr(to_rgb(Image.fromarray(arr, "L")))
    for c in range(3):
        assert np.array_equal(out[..., c], arr)


def _i16(values: list[int]) -> Image.Image:
    a = np.array([values], dtype="<u2")
    return Image.frombytes("I;16", (len(values), 1), a.tobytes())


def test_to_rgb_i16_scaled_not_clipped() -> None:
    img = _i16([0, 257, 1000, 32896, 65535])
    assert img.mode == "I;16"
    out = _arr(to_rgb(img))
    assert out.shape == (1, 5, 3)
    gray = out[0, :, 0]
    assert gray[0] == 0 and gray[4] == 255
    assert gray[1] == 1
    assert abs(int(gray[3]) - 128) <= 1
    assert gray[2] in (3, 4)
    assert (out[..., 0] == out[..., 1]).all() and (out[..., 0] == out[..., 2]).all()


def test_to_rgb_i16_png_round_trip() -> None:
    ramp = np.linspace(0, 65535, 64).astype("<u2").reshape(1, 64)
    img = _reopen(Image.frombytes("I;16", (64, 1), ramp.tobytes()))
    assert img.mode in ("I;16", "I")
    gray = _arr(to_rgb(img))[0, :, 0]
    assert gray[0] == 0 and gray[-1] == 255
    assert np.all(np.diff(gray) >= 0)
    assert (gray < 255).sum() > 60  # not clipped


def test_to_rgb_mode_i() -> None:
    img = Image.fromarray(np.array([[0, 257, 32896, 65535]], dtype=np.int32))
    assert img.mode == "I"
    gray = _arr(to_rgb(img))[0, :, 0]
    assert gray[0] == 0 and gray[1] == 1 and abs(int(gray[2]) - 128) <= 1 and gray[3] == 255


def test_to_rgb_mode_f_unit_range() -> None:
    img = Image.fromarray(np.array([[0.0, 0.25, 0.5, 1.0]], dtype=np.float32))
    assert img.mode == "F"
    gray = _arr(to_rgb(img))[0, :, 0]
    assert gray.tolist()[0] == 0 and gray[3] == 255
    assert abs(int(gray[1]) - 64) <= 1 and abs(int(gray[2]) - 128) <= 1


def test_to_rgb_mode_1() -> None:
    arr = np.array([[0, 255, 0], [255, 255, 0]], np.uint8)
    img = Image.fromarray(arr, "L").convert("1", dither=Image.Dither.NONE)
    out = _arr(to_rgb(img))
    assert np.array_equal(out[..., 0], arr)
    assert np.array_equal(out, _arr(img.convert("RGB")))


def test_to_rgb_cmyk_matches_pil() -> None:
    cmyk = photo_like(40, 30, 3).convert("CMYK")
    assert np.array_equal(_arr(to_rgb(cmyk)), _arr(cmyk.convert("RGB")))


def test_to_rgb_rgb_with_transparency_key_is_white() -> None:
    # An RGB PNG with a tRNS colour key: those pixels become white, as in the reference.
    img = Image.new("RGB", (4, 2), (0, 0, 0))
    img.putpixel((0, 0), (10, 20, 30))
    img = _reopen(img, "PNG", transparency=(0, 0, 0))
    assert img.mode == "RGB" and img.info.get("transparency") == (0, 0, 0)
    out = _arr(to_rgb(img))
    assert out[0, 0].tolist() == [10, 20, 30]
    assert (out.reshape(-1, 3)[1:] == 255).all()


# ====================================================================== PreprocessConfig


def test_from_hf_default_clip_dict() -> None:
    from transformers import CLIPImageProcessor

    cfg = PreprocessConfig.from_hf(CLIPImageProcessor().to_dict())
    assert cfg == PreprocessConfig()
    assert cfg.shortest_edge == 224 and cfg.crop_size == (224, 224)
    assert cfg.resample == "bicubic"
    assert cfg.mean == OPENAI_CLIP_MEAN and cfg.std == OPENAI_CLIP_STD
    assert cfg.rescale_factor == pytest.approx(1 / 255)
    assert cfg.input_size == (224, 224)
    assert PreprocessConfig.from_hf({}) == PreprocessConfig()


def test_from_hf_tiny_model(tiny_model: Path) -> None:
    cfg = PreprocessConfig.from_hf(json.loads((tiny_model / "preprocessor_config.json").read_text()))
    assert cfg.shortest_edge == 64 and cfg.crop_size == (64, 64) and cfg.input_size == (64, 64)
    assert cfg.min_decode_edge == 64


def test_from_hf_int_sizes() -> None:
    cfg = PreprocessConfig.from_hf({"size": 96, "crop_size": 80})
    assert cfg.shortest_edge == 96 and cfg.crop_size == (80, 80)


def test_from_hf_height_width_resize() -> None:
    cfg = PreprocessConfig.from_hf({"size": {"height": 32, "width": 48}, "crop_size": {"height": 32, "width": 32}})
    assert cfg.shortest_edge is None
    assert cfg.resize_to == (32, 48)
    assert cfg.crop_size == (32, 32)
    assert cfg.input_size == (32, 32)
    assert cfg.min_decode_edge == 48


def test_from_hf_no_center_crop() -> None:
    cfg = PreprocessConfig.from_hf({"size": {"height": 32, "width": 48}, "do_center_crop": False})
    assert cfg.resize_to == (32, 48) and cfg.crop_size is None
    assert cfg.input_size == (32, 48)
    # shortest_edge without crop: valid, but the input size depends on the image.
    cfg2 = PreprocessConfig.from_hf({"size": {"shortest_edge": 32}, "do_center_crop": False})
    with pytest.raises(ValueError):
        _ = cfg2.input_size


def test_from_hf_flags() -> None:
    cfg = PreprocessConfig.from_hf({"do_normalize": False, "resample": 2, "do_resize": False})
    assert cfg.mean is None and cfg.std is None
    assert cfg.resample == "bilinear"
    assert cfg.shortest_edge is None and cfg.resize_to is None
    assert PreprocessConfig.from_hf({"do_rescale": False}).rescale_factor is None


@pytest.mark.parametrize(
    "config",
    [
        {"size": {"longest_edge": 10}},
        {"size": {"shortest_edge": 10, "longest_edge": 20}},
        {"size": {"max_height": 10, "max_width": 10}},
        {"resample": 99},
        {"do_resize": False, "do_center_crop": False},
    ],
)
def test_from_hf_unsupported(config: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        PreprocessConfig.from_hf(config)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"crop_size": (0, 10)},
        {"crop_size": (10,)},
        {"crop_size": (1, 2, 3)},
        {"resize_to": (0, 5)},
        {"shortest_edge": 0},
        {"mean": OPENAI_CLIP_MEAN, "std": None},
        {"mean": None, "std": OPENAI_CLIP_STD},
        {"std": (0.2, 0.0, 0.3)},
        {"resample": "sinc"},
        {"alpha": "black"},
        {"shortest_edge": None, "resize_to": None, "crop_size": None},
    ],
)
def test_preprocess_config_validation(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        PreprocessConfig(**kwargs)


@pytest.mark.parametrize(
    "cfg",
    [
        PreprocessConfig(),
        PreprocessConfig(shortest_edge=None, resize_to=(32, 48), crop_size=None, resample="bilinear"),
        PreprocessConfig(shortest_edge=64, crop_size=(64, 64), rescale_factor=None, mean=None, std=None),
    ],
)
def test_preprocess_config_dict_round_trip(cfg: PreprocessConfig) -> None:
    data = cfg.to_dict()
    assert PreprocessConfig.from_dict(data) == cfg
    assert PreprocessConfig.from_dict(json.loads(json.dumps(data))) == cfg


def test_resize_output_size() -> None:
    cfg = PreprocessConfig(shortest_edge=64, crop_size=(64, 64))
    assert resize_output_size(480, 640, cfg) == (64, 85)
    assert resize_output_size(640, 480, cfg) == (85, 64)
    assert resize_output_size(30, 1000, cfg) == (64, 2133)
    assert resize_output_size(50, 50, cfg) == (64, 64)
    cfg2 = PreprocessConfig(shortest_edge=None, resize_to=(32, 48), crop_size=None)
    assert resize_output_size(480, 640, cfg2) == (32, 48)


# ====================================================================== parity with transformers


@pytest.fixture(scope="module")
def hf_processor(tiny_model: Path) -> Any:
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def tiny_cfg(tiny_model: Path) -> PreprocessConfig:
    return PreprocessConfig.from_hf(json.loads((tiny_model / "preprocessor_config.json").read_text()))


def _reference(processor: Any, img: Image.Image) -> torch.Tensor:
    return processor(images=img, return_tensors="pt").pixel_values[0]


def _max_diff(ours: torch.Tensor, ref: torch.Tensor) -> float:
    assert ours.shape == ref.shape, (tuple(ours.shape), tuple(ref.shape))
    assert ours.dtype == torch.float32
    return float((ours - ref).abs().max())


PARITY_SIZES = [(640, 480), (480, 640), (100, 150), (64, 64), (1000, 30), (50, 40)]


@pytest.mark.parametrize("size", PARITY_SIZES, ids=[f"{w}x{h}" for w, h in PARITY_SIZES])
def test_parity_tiny_model(hf_processor: Any, tiny_cfg: PreprocessConfig, size: tuple[int, int]) -> None:
    img = photo_like(*size, seed=size[0] * 7 + size[1])
    ours = preprocess_tensor(pil_to_tensor(img), tiny_cfg)
    ref = _reference(hf_processor, img)
    assert tuple(ours.shape) == (3, 64, 64)
    assert _max_diff(ours, ref) <= PARITY_ATOL


def test_parity_batch_matches_single(hf_processor: Any, tiny_cfg: PreprocessConfig) -> None:
    imgs = [photo_like(96, 80, 1), photo_like(96, 80, 2)]
    batch = preprocess_tensor(torch.stack([pil_to_tensor(i) for i in imgs]), tiny_cfg)
    assert tuple(batch.shape) == (2, 3, 64, 64)
    for i, img in enumerate(imgs):
        assert _max_diff(batch[i], _reference(hf_processor, img)) <= PARITY_ATOL
    mixed = preprocess_images([imgs[0], imgs[1].convert("RGBA")], tiny_cfg)
    assert torch.equal(mixed, batch)


def test_parity_default_224() -> None:
    from transformers import CLIPImageProcessor

    proc = CLIPImageProcessor()
    cfg = PreprocessConfig.from_hf(proc.to_dict())
    img = photo_like(640, 480, 5)
    ours = preprocess_tensor(pil_to_tensor(img), cfg)
    assert tuple(ours.shape) == (3, 224, 224)
    assert _max_diff(ours, _reference(proc, img)) <= PARITY_ATOL


@pytest.mark.parametrize(
    "hf_kwargs, size",
    [
        # resize to 32x48, then crop 64x64 -> zero padding on both axes
        ({"size": {"height": 32, "width": 48}, "crop_size": {"height": 64, "width": 64}}, (100, 70)),
        # no resize: a 50x40 image (smaller than the crop) is zero-padded to 64x64
        ({"do_resize": False, "crop_size": {"height": 64, "width": 64}}, (50, 40)),
        # odd padding amounts, one axis padded, the other cropped
        ({"do_resize": False, "crop_size": {"height": 33, "width": 20}}, (41, 18)),
        # bilinear, no crop
        ({"size": {"height": 40, "width": 30}, "do_center_crop": False, "resample": 2}, (123, 77)),
    ],
    ids=["resize-then-pad", "pad-only", "pad-odd", "bilinear-nocrop"],
)
def test_parity_padding_and_other_configs(hf_kwargs: dict[str, Any], size: tuple[int, int]) -> None:
    from transformers import CLIPImageProcessor

    proc = CLIPImageProcessor(**hf_kwargs)
    cfg = PreprocessConfig.from_hf(proc.to_dict())
    img = photo_like(*size, seed=11)
    ours = preprocess_tensor(pil_to_tensor(img), cfg)
    assert _max_diff(ours, _reference(proc, img)) <= PARITY_ATOL


def test_parity_rgba(hf_processor: Any, tiny_cfg: PreprocessConfig) -> None:
    rng = np.random.default_rng(3)
    rgb = np.asarray(photo_like(120, 90, 9))
    alpha = rng.integers(0, 256, (90, 120), dtype=np.uint8)
    alpha[:, :30] = 0
    alpha[:, 30:60] = 255
    rgba = Image.fromarray(np.dstack([rgb, alpha]), "RGBA")
    ours = preprocess_tensor(pil_to_tensor(to_rgb(rgba)), tiny_cfg)
    assert _max_diff(ours, _reference(hf_processor, rgba)) <= PARITY_ATOL


@pytest.mark.parametrize("rel", ["formats/palette_trns.png", "formats/gray_LA.png", "formats/gray_L.png"])
def test_parity_collection_files(
    collection: Collection, hf_processor: Any, tiny_cfg: PreprocessConfig, rel: str
) -> None:
    # Files whose mode the reference processor converts itself (no 16-bit / EXIF / draft).
    pixels, w, h = load_pixels(collection.root / rel, tiny_cfg, draft=False)
    assert (w, h) == collection.good[rel]
    with Image.open(collection.root / rel) as img:
        img.load()
        ref = _reference(hf_processor, img)
    assert _max_diff(pixels, ref) <= PARITY_ATOL


def test_load_pixels_draft(photo_jpeg: Path, tiny_cfg: PreprocessConfig) -> None:
    pixels, w, h = load_pixels(photo_jpeg, tiny_cfg)
    assert tuple(pixels.shape) == (3, 64, 64) and (w, h) == (640, 480)
    full, _, _ = load_pixels(photo_jpeg, tiny_cfg, draft=False)
    # Draft decoding changes pixels only slightly after the downscale to 64 px.
    assert float((pixels - full).abs().mean()) < 0.1


# ====================================================================== differentiability


@pytest.mark.parametrize("resample", ["bilinear", "bicubic"])
def test_preprocess_tensor_gradcheck(resample: str) -> None:
    cfg = PreprocessConfig(shortest_edge=8, crop_size=(8, 8), resample=resample)
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(1, 3, 20, 24, generator=gen, dtype=torch.float64) * 255).requires_grad_(True)
    out = preprocess_tensor(x, cfg)
    assert out.shape == (1, 3, 8, 8) and out.requires_grad
    # The output is float32 by contract, so finite differences need a large step; the map is
    # linear in the input, so a step of 1 grey level is exact up to float32 rounding.
    assert torch.autograd.gradcheck(
        lambda t: preprocess_tensor(t, cfg).double(), (x,), eps=1.0, atol=1e-4, rtol=1e-3
    )


def test_preprocess_tensor_shape_errors() -> None:
    cfg = PreprocessConfig(shortest_edge=8, crop_size=(8, 8))
    with pytest.raises(ValueError):
        preprocess_tensor(torch.zeros(4, 10, 10, dtype=torch.uint8), cfg)
    with pytest.raises(ValueError):
        preprocess_tensor(torch.zeros(10, 10, dtype=torch.uint8), cfg)
