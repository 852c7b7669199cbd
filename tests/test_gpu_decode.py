"""The GPU decode path's logic, run on the CPU: torchvision's decode_jpeg on the device the
model uses, PIL for other formats and for files that decoder refuses, failures skipped."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from imagegen import photo_like
from PIL import Image

from indexer import dataset as D
from indexer.discover import ImageFile
from retrieval.encoders import HFClipEncoder
from retrieval.images import decode_jpegs_on_device, is_jpeg, load_pixels


def _jpeg(img: Image.Image, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gpu") / "p"
    root.mkdir()
    exif = Image.Exif()
    exif[0x0112] = 6
    (root / "a.jpg").write_bytes(_jpeg(photo_like(200, 150, seed=1)))
    (root / "b_rot.jpg").write_bytes(_jpeg(photo_like(200, 100, seed=2), exif=exif.tobytes()))
    photo_like(120, 90, seed=3).save(root / "c.png")
    good = _jpeg(photo_like(160, 120, seed=4))
    (root / "d_truncated.jpg").write_bytes(good[: len(good) // 3])
    (root / "e_garbage.jpg").write_bytes(b"\xff\xd8\xff" + b"\x00" * 64)
    (root / "f_gray.jpg").write_bytes(_jpeg(photo_like(90, 90, seed=5).convert("L")))
    return root


def test_decode_jpeg_matches_pil_and_applies_exif(folder: Path) -> None:
    datas = [(folder / n).read_bytes() for n in ("a.jpg", "b_rot.jpg", "f_gray.jpg")]
    assert all(is_jpeg(d) for d in datas) and not is_jpeg((folder / "c.png").read_bytes())
    out = decode_jpegs_on_device(datas, "cpu")
    assert [tuple(t.shape) for t in out] == [(3, 150, 200), (3, 200, 100), (3, 90, 90)]  # EXIF 6: rotated
    pil = np.asarray(Image.open(folder / "a.jpg").convert("RGB"))
    assert np.abs(out[0].permute(1, 2, 0).numpy().astype(int) - pil.astype(int)).max() <= 2
    # A file the decoder refuses is None (the caller falls back), the others still decode.
    mixed = decode_jpegs_on_device([datas[0], (folder / "e_garbage.jpg").read_bytes()], "cpu")
    assert mixed[0] is not None and mixed[1] is None


def _batch(folder: Path, cfg, device_decode: bool) -> D.Batch:
    files = [ImageFile(n.encode(), 0, 0) for n in sorted(p.name for p in folder.iterdir())]
    ds = D.ImageDataset(folder, files, cfg, device_decode=device_decode)
    return D.collate([ds[i] for i in range(len(ds))])


def test_device_batch_equals_cpu_batch_and_skips_failures(tiny_model: Path, folder: Path) -> None:
    enc = HFClipEncoder.load(str(tiny_model), device="cpu")
    cpu = _batch(folder, enc.preprocess, device_decode=False)
    pending = _batch(folder, enc.preprocess, device_decode=True)
    assert pending.pixels is None and pending.pending is not None
    done = D.finish_on_device(pending, enc.preprocess, torch.device("cpu"))
    assert [it.error is None for it in done.items] == [it.error is None for it in cpu.items]
    assert [(it.width, it.height) for it in done.good] == [(it.width, it.height) for it in cpu.good]
    reasons = {it.index: it.error for it in done.failed}
    assert len(reasons) == 2 and all(reasons.values())
    # Full-size decode + resize vs PIL draft decode + resize: the same embeddings within 1e-3.
    cos = (enc.embed_pixels(done.pixels) * enc.embed_pixels(cpu.pixels)).sum(axis=1)
    assert cos.min() >= 0.999, cos


def test_decoder_failure_falls_back_to_pil(tiny_model: Path, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    enc = HFClipEncoder.load(str(tiny_model), device="cpu")
    monkeypatch.setattr(D, "decode_jpegs_on_device", lambda datas, device: [None] * len(datas))
    done = D.finish_on_device(_batch(folder, enc.preprocess, True), enc.preprocess, torch.device("cpu"))
    ref = torch.stack([load_pixels(folder / n, enc.preprocess)[0] for n in ("a.jpg", "b_rot.jpg", "c.png", "f_gray.jpg")])
    assert torch.equal(done.pixels, ref)  # exactly the CPU path


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_same_size_images_are_preprocessed_together_in_batch_order(
    tiny_model: Path, tmp_path: Path, device: str
) -> None:
    from retrieval.images import preprocess_on_device

    enc = HFClipEncoder.load(str(tiny_model), device="cpu")
    root = tmp_path / "p"
    root.mkdir()
    # Two sizes interleaved, a PNG (CPU path) in between, a broken file: rows stay in file order.
    names = []
    for i, size in enumerate([(160, 120), (120, 160), (160, 120), None, (160, 120), (120, 160)]):
        if size is None:
            photo_like(64, 48, seed=i).save(root / f"{i}.png")
            names.append(f"{i}.png")
        else:
            (root / f"{i}.jpg").write_bytes(_jpeg(photo_like(*size, seed=i)))
            names.append(f"{i}.jpg")
    (root / "9_bad.jpg").write_bytes(b"\xff\xd8\xff" + b"\x00" * 64)
    names.append("9_bad.jpg")
    files = [ImageFile(n.encode(), 0, 0) for n in names]
    ds = D.ImageDataset(root, files, enc.preprocess, device_decode=True)
    done = D.finish_on_device(D.collate([ds[i] for i in range(len(ds))]), enc.preprocess, torch.device(device))
    assert [it.error is None for it in done.items] == [True] * 6 + [False]
    expected = []
    for n in names[:6]:
        data = (root / n).read_bytes()
        if is_jpeg(data):
            (image,) = decode_jpegs_on_device([data], device)
            expected.append(preprocess_on_device(image, enc.preprocess))
        else:
            expected.append(load_pixels(root / n, enc.preprocess)[0].to(device))
    assert done.pixels is not None and done.pixels.device.type == device
    # One stacked resize equals one resize per image (the same kernel, row by row).
    torch.testing.assert_close(done.pixels, torch.stack(expected), rtol=0, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunk", [128, 2])
def test_one_size_batch_is_the_stacked_tensor(
    tiny_model: Path, tmp_path: Path, device: str, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(D, "DEVICE_CHUNK", chunk)  # 2: preprocessed in two calls, concatenated
    enc = HFClipEncoder.load(str(tiny_model), device="cpu")
    root = tmp_path / "p"
    root.mkdir()
    for i in range(3):
        (root / f"{i}.jpg").write_bytes(_jpeg(photo_like(200, 150, seed=i)))
    files = [ImageFile(f"{i}.jpg".encode(), 0, 0) for i in range(3)]
    ds = D.ImageDataset(root, files, enc.preprocess, device_decode=True)
    done = D.finish_on_device(D.collate([ds[i] for i in range(3)]), enc.preprocess, torch.device(device))
    single = [D.finish_on_device(D.collate([ds[i]]), enc.preprocess, torch.device(device)).pixels for i in range(3)]
    assert done.pixels is not None and done.pixels.shape[0] == 3
    torch.testing.assert_close(done.pixels, torch.cat(single), rtol=0, atol=1e-5)


@pytest.mark.parametrize(("device", "workers"), [("cpu", 0), ("cpu", 2)] + [("cuda", 2)] * (len(DEVICES) - 1))
def test_build_with_device_decoding_matches_cpu_build(
    tiny_model: Path, folder: Path, tmp_path: Path, device: str, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU build's pipeline (workers hand JPEG bytes over, a helper thread decodes and
    resizes on the device; other formats come decoded, pinned on CUDA) run end to end, on
    the CPU as the device where there is no GPU."""
    from indexer import build as B
    from indexer import embed as E
    from retrieval import ImageIndex

    cpu = B.build_index(folder, tmp_path / "cpu", model=str(tiny_model), workers=0, device="cpu", precision="fp32", batch_size=4)
    monkeypatch.setattr(E, "decodes_on_device", lambda device_type: True)
    dev = B.build_index(folder, tmp_path / "dev", model=str(tiny_model), workers=workers, device=device, precision="fp32", batch_size=4)
    assert dev.device.startswith(device)
    assert (dev.indexed, dev.skipped) == (cpu.indexed, cpu.skipped) == (4, 2)
    a, b = ImageIndex.open(tmp_path / "cpu"), ImageIndex.open(tmp_path / "dev")
    assert a.metadata.paths() == b.metadata.paths()
    assert [(s.path, s.reason) for s in a.metadata.skipped()] == [(s.path, s.reason) for s in b.metadata.skipped()]
    # Full-size decode + resize against PIL's draft decode: the same vectors within 1e-3.
    assert (a.vectors.embeddings() * b.vectors.embeddings()).sum(axis=1).min() >= 0.999


def test_device_decoding_error_ends_the_build_with_it(
    tiny_model: Path, folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from indexer import build as B
    from indexer import embed as E

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(E, "decodes_on_device", lambda device_type: True)
    monkeypatch.setattr(E, "finish_on_device", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        B.build_index(folder, tmp_path / "dev", model=str(tiny_model), workers=0, device="cpu", batch_size=4)


def test_batch_pin_memory_pins_every_pixel_tensor() -> None:
    class FakeTensor:
        def __init__(self, pinned: bool = False) -> None:
            self.pinned = pinned

        def pin_memory(self) -> FakeTensor:
            return FakeTensor(True)

    item = D.Item(0, FakeTensor(), 1, 1, None, 0.0)  # type: ignore[arg-type]  # FakeTensor as a Tensor
    jpeg = D.Item(1, None, 1, 1, None, 0.0, data=b"\xff\xd8\xff")
    pinned = D.Batch(FakeTensor(), [item], 0.0, pending=[item, jpeg]).pin_memory()  # type: ignore[arg-type]  # FakeTensor as a Tensor
    assert pinned.pixels.pinned and pinned.pending[0].pixels.pinned and pinned.pending[1] is jpeg
    assert not item.pixels.pinned  # the original batch is untouched


def test_defaults_by_device() -> None:
    from indexer.build import default_batch_size, default_workers

    assert (default_batch_size("cpu"), default_batch_size("cuda")) == (64, 512)
    assert default_workers("cpu") == 0 and 1 <= default_workers("cuda") <= 8


def test_truncated_jpeg_goes_to_pil_which_skips_it(tiny_model: Path, folder: Path, tmp_path: Path) -> None:
    """nvJPEG decodes a truncated JPEG (grey rows) where PIL refuses it: without its end
    marker a file is decoded by PIL in the worker, so CPU and GPU builds skip the same files."""
    from retrieval.images import jpeg_has_end

    enc = HFClipEncoder.load(str(tiny_model), device="cpu")
    good = (folder / "a.jpg").read_bytes()
    assert jpeg_has_end(good) and not jpeg_has_end((folder / "d_truncated.jpg").read_bytes())
    root = tmp_path / "p"
    root.mkdir()
    (root / "0_trunc.jpg").write_bytes(good[: len(good) - 100])
    (root / "1_junk_after_end.jpg").write_bytes(good + b"\x00" * 100)  # valid, end marker not last
    (root / "2_good.jpg").write_bytes(good)
    files = [ImageFile(n.encode(), 0, 0) for n in sorted(p.name for p in root.iterdir())]
    ds = D.ImageDataset(root, files, enc.preprocess, device_decode=True)
    trunc, junk, ok = (ds[i] for i in range(3))
    assert trunc.data is None and trunc.pixels is None and "truncated" in (trunc.error or "")
    assert junk.data is None and junk.pixels is not None and junk.error is None  # decoded by PIL
    assert ok.data == good and ok.pixels is None  # left for the device
