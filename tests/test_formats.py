"""Photo formats on real photographs: HEIC/HEIF, AVIF, camera RAW (DNG), JPEG orientations, PNG
with alpha; what the indexer stores for them, and the files it cannot decode.

The photos are scikit-image's bundled ones (``tests/photos.py``), written out by the tests.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_here
from helpers import assert_one_line_error
from photos import PHOTOS, encoded, exif_bytes, oriented_as, photo, png_with_alpha, save, write_dng
from PIL import Image, ImageOps

from retrieval.errors import ImageDecodeError
from retrieval.images import IMAGE_EXTENSIONS, RAW_EXTENSIONS, decode_image, formats
from retrieval.request import SearchRequest

pytest.importorskip("pillow_heif")
pytest.importorskip("rawpy")


def _pixels(img: Image.Image) -> np.ndarray:
    return np.asarray(img.convert("RGB"), dtype=np.int16)


def test_extensions_are_listed_whatever_is_installed() -> None:
    for ext in (".heic", ".heif", ".avif", ".dng", ".cr2", ".cr3", ".nef", ".arw", ".raf", ".orf", ".rw2"):
        assert ext in IMAGE_EXTENSIONS, ext
    assert formats.kind_of("x.JPG", b"") is None
    assert formats.kind_of("x.NEF", b"") == "raw"
    # HEIF and AVIF are known by their ftyp brand, whatever the name says.
    assert formats.kind_of("upload", b"\x00\x00\x00\x18ftypheic") == "heif"
    assert formats.kind_of("x.jpg", b"\x00\x00\x00\x18ftypavif") == "avif"


@pytest.mark.parametrize("name", PHOTOS)
def test_lossless_heic_decodes_to_the_same_pixels(name: str) -> None:
    img = photo(name)
    data = encoded(img, "HEIF", quality=-1, chroma=444, matrix_coefficients=0)
    decoded = decode_image(io.BytesIO(data), name=f"{name}.heic")
    assert decoded.image.size == img.size == (decoded.width, decoded.height)
    assert np.array_equal(_pixels(decoded.image), _pixels(img))


def test_avif_decodes_close_to_the_photo() -> None:
    img = photo("astronaut.png")
    decoded = decode_image(io.BytesIO(encoded(img, "AVIF", quality=100, subsampling="4:4:4")), name="a.avif")
    assert decoded.image.size == img.size
    assert np.abs(_pixels(decoded.image) - _pixels(img)).max() <= 4


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_is_honoured(orientation: int) -> None:
    img = photo("rocket.jpg", max_side=96)
    stored = oriented_as(img, orientation)
    data = encoded(stored, "JPEG", quality=98, exif=exif_bytes(orientation=orientation))
    decoded = decode_image(io.BytesIO(data), name="r.jpg")
    assert decoded.image.size == img.size == (decoded.width, decoded.height)
    assert np.abs(_pixels(decoded.image) - _pixels(img)).mean() < 4


@pytest.mark.parametrize("fmt", ["HEIF", "AVIF"])
def test_heic_and_avif_orientation_is_honoured(fmt: str) -> None:
    img = photo("chelsea.png", max_side=96)
    # The camera stored the pixels turned, and said so: decoding shows them upright.
    stored = oriented_as(img, 6)
    kwargs = {"quality": -1, "chroma": 444, "matrix_coefficients": 0} if fmt == "HEIF" else {"quality": 100, "subsampling": "4:4:4"}
    data = encoded(stored, fmt, exif=exif_bytes(orientation=6), **kwargs)
    decoded = decode_image(io.BytesIO(data), name="x")
    assert decoded.image.size == img.size
    assert np.abs(_pixels(decoded.image) - _pixels(img)).mean() < 4


def test_png_with_alpha_is_composited_on_white() -> None:
    img = png_with_alpha(photo("coffee.png", max_side=64))
    decoded = decode_image(io.BytesIO(encoded(img, "PNG")), name="c.png")
    left = _pixels(decoded.image)[:, : img.width // 4]
    assert (left == 255).all()


def test_dng_preview_when_large_enough_else_demosaic(tmp_path: Path) -> None:
    img = photo("chelsea.png")
    dng = write_dng(tmp_path / "cat.dng", img, preview=True, taken="2020:01:02 03:04:05")
    small = decode_image(dng, min_edge=64)
    assert small.meta.raw_source == "preview"
    assert np.array_equal(_pixels(small.image), _pixels(img)[: img.height // 2 * 2, : img.width // 2 * 2])
    assert small.meta.camera == "TestMake Test DNG" and small.meta.taken_us is not None
    # The preview is smaller than the model needs: the sensor data is demosaiced instead.
    large = decode_image(dng, min_edge=img.height + 1)
    assert large.meta.raw_source == "demosaic"
    # Without a preview, always the sensor data (with the camera's white balance).
    bare = decode_image(write_dng(tmp_path / "bare.dng", img, preview=False), min_edge=64)
    assert bare.meta.raw_source == "demosaic" and bare.image.size == (img.width // 2 * 2, img.height // 2 * 2)
    # Demosaiced colours follow the photo's (LibRaw scales brightness its own way).
    got, want = _pixels(bare.image).reshape(-1, 3).astype(float), _pixels(img)[: bare.height, : bare.width].reshape(-1, 3)
    assert np.corrcoef(got[:, 1], want[:, 1])[0, 1] > 0.9


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_raw_orientation_is_honoured_for_preview_and_demosaic(tmp_path: Path, orientation: int) -> None:
    img = photo("rocket.jpg", max_side=96)
    img = img.crop((0, 0, img.width // 2 * 2, img.height // 2 * 2))
    dng = write_dng(tmp_path / "r.dng", oriented_as(img, orientation), preview=True, orientation=orientation)
    preview = decode_image(dng, min_edge=16)
    assert preview.meta.raw_source == "preview" and preview.image.size == img.size
    assert np.abs(_pixels(preview.image) - _pixels(img)).mean() < 1
    demosaic = decode_image(dng)
    assert demosaic.meta.raw_source == "demosaic" and demosaic.image.size == img.size


def test_bad_files_are_one_reason_each(tmp_path: Path) -> None:
    img = photo("coffee.png", max_side=96)
    heic = encoded(img, "HEIF", quality=60)
    (tmp_path / "cut.heic").write_bytes(heic[: len(heic) // 3])
    with pytest.raises(ImageDecodeError, match="damaged or truncated HEIF file"):
        decode_image(tmp_path / "cut.heic")
    write_dng(tmp_path / "empty.dng", img, preview=False, data=False)
    with pytest.raises(ImageDecodeError, match="RAW decode failed"):
        decode_image(tmp_path / "empty.dng", min_edge=64)
    (tmp_path / "text.nef").write_bytes(b"not a raw file at all" * 10)
    with pytest.raises(ImageDecodeError, match="RAW decode failed"):
        decode_image(tmp_path / "text.nef")
    (tmp_path / "zero.cr3").write_bytes(b"")
    with pytest.raises(ImageDecodeError, match="empty file"):
        decode_image(tmp_path / "zero.cr3")


def test_a_missing_decoder_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    img = photo("coffee.png", max_side=64)
    heic = save(img, tmp_path / "a.heic", "HEIF", quality=80)
    dng = write_dng(tmp_path / "a.dng", img, preview=True)
    monkeypatch.setitem(sys.modules, "pillow_heif", None)
    monkeypatch.setitem(sys.modules, "rawpy", None)
    monkeypatch.setattr(formats, "_heif_registered", False)
    with pytest.raises(ImageDecodeError) as heif_error:
        decode_image(heic)
    assert heif_error.value.reason == "HEIC needs pillow-heif: pip install 'clipsearch[heic]'"
    with pytest.raises(ImageDecodeError) as raw_error:
        decode_image(dng)
    assert raw_error.value.reason == "camera RAW needs rawpy: pip install 'clipsearch[raw]'"
    monkeypatch.setattr("PIL.features.check", lambda name: False)
    with pytest.raises(ImageDecodeError, match="AVIF needs Pillow"):
        decode_image(io.BytesIO(encoded(img, "AVIF")), name="a.avif")


def test_lossless_heic_embeds_as_the_png(tmp_path: Path, tiny_model: Path) -> None:
    import torch

    from retrieval.encoders import load_encoder
    from retrieval.images import load_pixels

    enc = load_encoder(str(tiny_model), device="cpu")
    for name in ("astronaut.png", "motorcycle_left.png"):
        img = photo(name)
        png = save(img, tmp_path / "p.png", "PNG")
        heic = save(img, tmp_path / "p.heic", "HEIF", quality=-1, chroma=444, matrix_coefficients=0)
        avif = save(img, tmp_path / "p.avif", "AVIF", quality=100, subsampling="4:4:4")
        vectors = enc.embed_pixels(torch.stack([load_pixels(p, enc.preprocess)[0] for p in (png, heic, avif)]))
        assert float(vectors[0] @ vectors[1]) >= 0.999, name
        assert float(vectors[0] @ vectors[2]) >= 0.999, name


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A phone-and-camera folder: the same photos as HEIC, AVIF, JPEG, DNG, plus broken files."""
    root = tmp_path_factory.mktemp("library") / "photos"
    root.mkdir()
    cat, rocket, coffee = photo("chelsea.png"), photo("rocket.jpg"), photo("coffee.png")
    save(cat, root / "cat.heic", "HEIF", quality=-1, chroma=444, matrix_coefficients=0,
         exif=exif_bytes("2023:07:14 18:30:00", "+02:00", "Apple", "iPhone 13", ((48, 51, 29.0), "N", (2, 17, 40.0), "E")))
    save(cat, root / "cat.jpg", "JPEG", quality=95, exif=exif_bytes("2021:01:02 03:04:05", make="Canon", model="Canon EOS R5"))
    save(rocket, root / "rocket.avif", "AVIF", quality=90)
    save(png_with_alpha(coffee), root / "coffee.png", "PNG")
    (root / "raw").mkdir()
    write_dng(root / "raw" / "coffee.dng", coffee, preview=True, taken="2019:06:01 12:00:00")
    write_dng(root / "raw" / "sensor.dng", rocket, preview=False)
    heic = (root / "cat.heic").read_bytes()
    (root / "cut.heic").write_bytes(heic[: len(heic) // 4])
    write_dng(root / "raw" / "broken.dng", coffee, preview=False, data=False)
    return root


@pytest.fixture(scope="module")
def library_index(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, library: Path) -> Path:
    out = tmp_path_factory.mktemp("library_idx") / "lib.idx"
    proc = cli_here(["index", library, out, "--model", tiny_model, "--workers", "1", "--batch-size", "4", "--device", "cpu",
                    "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.slow
def test_index_holds_every_format_and_skips_with_reasons(library_index: Path) -> None:
    from retrieval.index import ImageIndex

    index = ImageIndex.open(library_index)
    rows = {r["path"]: r for r in index.rows(range(index.count), columns=("path", "camera", "raw_source", "width", "height"))}
    assert set(rows) == {"cat.heic", "cat.jpg", "rocket.avif", "coffee.png", "raw/coffee.dng", "raw/sensor.dng"}
    assert rows["raw/coffee.dng"]["raw_source"] == "preview"  # 160 px preview >= the tiny model's 64 px
    assert rows["raw/sensor.dng"]["raw_source"] == "demosaic"
    assert rows["cat.heic"]["raw_source"] is None and rows["cat.heic"]["camera"] == "Apple iPhone 13"
    assert rows["cat.jpg"]["camera"] == "Canon EOS R5"
    skipped = {s.path: s.reason for s in index.metadata.skipped()}
    assert set(skipped) == {"cut.heic", "raw/broken.dng"}
    assert skipped["cut.heic"].startswith("damaged or truncated HEIF file")
    assert skipped["raw/broken.dng"].startswith("RAW decode failed")
    # The same picture as HEIC and JPEG: both indexed, and they find each other.
    ids = {r["path"]: i for i, r in enumerate(index.rows(range(index.count), columns=("path",)))}
    similar = index.search(SearchRequest(similar_to=ids["cat.heic"], k=2))
    assert [h.path for h in similar] == ["cat.heic", "cat.jpg"] and similar[1].score > 0.99


@pytest.mark.slow
def test_update_treats_new_formats_like_any_other(tmp_path: Path, tiny_model: Path, library: Path) -> None:
    import shutil

    from retrieval.index import ImageIndex

    photos = tmp_path / "p"
    shutil.copytree(library, photos)
    out = tmp_path / "lib.idx"
    assert cli_here(["index", photos, out, "--model", tiny_model, "--workers", "0", "--no-progress"]).returncode == 0
    (photos / "cat.heic").unlink()
    save(photo("astronaut.png"), photos / "new.heic", "HEIF", quality=70)
    # The broken HEIC is repaired: the update indexes it and drops its skip record.
    save(photo("coffee.png"), photos / "cut.heic", "HEIF", quality=70)
    proc = cli_here(["index", photos, out, "--model", tiny_model, "--workers", "0", "--no-progress", "--json"])
    assert proc.returncode == 0, proc.stderr
    index = ImageIndex.open(out)
    assert "new.heic" in index.metadata.paths() and "cut.heic" in index.metadata.paths() and "cat.heic" not in index.metadata.paths()
    assert {s.path for s in index.metadata.skipped()} == {"raw/broken.dng"}


def test_exif_transpose_is_what_decode_applies() -> None:
    # The JPEG reference: decode_image gives what PIL's exif_transpose gives.
    img = photo("astronaut.png", max_side=80)
    data = encoded(oriented_as(img, 8), "JPEG", quality=95, exif=exif_bytes(orientation=8))
    want = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    assert np.array_equal(_pixels(decode_image(io.BytesIO(data), name="x.jpg").image), _pixels(want))


@pytest.mark.slow
def test_cli_index_of_only_broken_files_keeps_going(tmp_path: Path, tiny_model: Path) -> None:
    photos = tmp_path / "p"
    photos.mkdir()
    heic = encoded(photo("coffee.png", max_side=64), "HEIF", quality=50)
    (photos / "cut.heic").write_bytes(heic[:100])
    (photos / "x.cr2").write_bytes(b"II*\x00garbage")
    good = save(photo("rocket.jpg", max_side=64), photos / "ok.avif", "AVIF")
    assert good.exists()
    proc = cli_here(["index", photos, tmp_path / "i", "--model", tiny_model, "--workers", "0", "--no-progress", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert '"indexed": 1' in proc.stdout and '"skipped": 2' in proc.stdout
    bad = cli_here(["search", tmp_path / "i", "rocket", "--min-score", "1.5"])
    assert_one_line_error(bad.returncode, bad.stderr, "min_score", "[-1, 1]")
    assert RAW_EXTENSIONS <= IMAGE_EXTENSIONS


def test_bench_formats_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import bench_formats

    assert bench_formats.main(["--size", "240", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.splitlines()[0])
    rows = {r["format"]: r for r in result["results"]}
    assert list(rows) == ["JPEG", "HEIC", "AVIF", "RAW preview", "RAW demosaic"]
    assert rows["RAW preview"]["raw_source"] == "preview" and rows["RAW demosaic"]["raw_source"] == "demosaic"
    assert all(r["images_per_s"] > 0 for r in rows.values()) and rows["JPEG"]["vs_jpeg"] == 1.0
    assert "vs JPEG" in out and result["machine"]["cpu"]
