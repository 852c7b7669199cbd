"""Deterministic on-disk image collections for testing an image indexer.

This module depends only on Pillow and numpy (nothing from the project), so it
can be used from any test or benchmark.  Everything it writes is
deterministic: every image is drawn from its own seeded numpy RNG and encoded
with fixed encoder settings, so two runs on the same machine (same Pillow /
libjpeg / zlib / libwebp builds) produce byte-identical files.

Public API
----------
* :func:`photo_like` -- a photo-looking RGB image (gradients, shapes, noise).
* :func:`make_collection` -- a tree exercising every case an indexer meets:
  good images in many formats/modes, EXIF rotation, Unicode and non-UTF-8
  names, broken files, a decompression bomb, junk files, dangling links, a
  FIFO, a directory named like an image, directory symlinks (one of them a
  loop) and a file symlink.
* :func:`make_jpegs` -- N photo-like JPEGs for benchmarks.
* :func:`write_photos` -- numbered photo-like JPEGs of chosen sizes, for tests.
* :func:`encode_image` -- an image's bytes in any Pillow format.

Symlink policy encoded in :class:`Collection`
---------------------------------------------
``good`` lists only images reachable through *real* paths, i.e. what an indexer
that does **not** follow directory symlinks must find.  Directory symlinks are
listed in ``symlinked_dirs`` (``nested/loop -> ..`` is a loop back to the root,
``alias -> real_dir`` duplicates ``real_dir``); file symlinks are listed in
``file_symlinks`` (``link_to_photo.jpg -> photos/a.jpg``).  Neither kind
appears in ``good``, ``broken`` or ``ignored``: tests decide the policy.
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

__all__ = [
    "Collection",
    "photo_like",
    "make_collection",
    "make_jpegs",
    "write_photos",
    "encode_image",
    "BOMB_SIZE",
    "GIF_FRAME_COLORS",
]

#: Declared (width, height) of ``broken/bomb.png``: 400 M pixels, more than
#: twice Pillow's default ``Image.MAX_IMAGE_PIXELS`` (~89.5 M), so
#: ``Image.open`` raises :class:`PIL.Image.DecompressionBombError`.
BOMB_SIZE: tuple[int, int] = (20000, 20000)

#: RGB colours of the three frames of ``formats/animated.gif`` (and of
#: ``formats/animated.webp``).  The first frame is the one an indexer embeds.
GIF_FRAME_COLORS: tuple[tuple[int, int, int], ...] = (
    (220, 30, 30),
    (30, 200, 30),
    (30, 30, 220),
)

_JPEG_QUALITY = 85


@dataclass(frozen=True)
class Collection:
    """Description of a tree written by :func:`make_collection`.

    All paths are relative to ``root``, use ``/`` as separator and are ``str``
    exactly as :func:`os.fsdecode` yields them (so the non-UTF-8 name contains
    a surrogate escape, e.g. ``"intl/latin1_caf\\udce9.jpg"``).

    Attributes:
        root: Directory the collection was written into.
        good: Decodable images -> (width, height) *after* EXIF orientation is
            applied (``ImageOps.exif_transpose``).  Only real paths: nothing
            reached through a symlink is listed.
        broken: Files an indexer must reject (and survive) -> category, one of
            ``"empty"``, ``"truncated"``, ``"not-an-image"``, ``"bomb"``,
            ``"unreadable"``.
        ignored: Entries an indexer must skip without even trying to decode:
            non-image extensions, junk, a dangling symlink, a FIFO, and a
            directory whose name ends in ``.jpg``.
        symlinked_dirs: Symlinks to directories (including a loop to an
            ancestor).  Images under them are *not* in ``good``.
        file_symlinks: Symlinks to good image files (not in ``good``).
        modes: For each ``good`` path, the mode Pillow reports right after
            ``Image.open`` (before any conversion).
        animated: For each multi-frame ``good`` path, its frame count.
    """

    root: Path
    good: dict[str, tuple[int, int]]
    broken: dict[str, str]
    ignored: list[str]
    symlinked_dirs: list[str] = field(default_factory=list)
    file_symlinks: list[str] = field(default_factory=list)
    modes: dict[str, str] = field(default_factory=dict)
    animated: dict[str, int] = field(default_factory=dict)


# --------------------------------------------------------------------------
# image synthesis
# --------------------------------------------------------------------------


def photo_like(width: int, height: int, seed: int) -> Image.Image:
    """Return a deterministic RGB image that looks (and compresses) like a photo.

    The picture is a smooth two-colour gradient with a low-frequency wave,
    a few blurred ellipses/rectangles and mild Gaussian sensor-like noise.

    Args:
        width: Image width in pixels (>= 1).
        height: Image height in pixels (>= 1).
        seed: Seed of the numpy RNG; same seed -> same pixels.
    """
    if width < 1 or height < 1:
        raise ValueError(f"invalid size {width}x{height}")
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    xn = x / max(width - 1, 1)
    yn = y / max(height - 1, 1)

    # Smooth background: blend two colours along a random direction + a wave.
    c0 = rng.uniform(20, 235, 3).astype(np.float32)
    c1 = rng.uniform(20, 235, 3).astype(np.float32)
    angle = rng.uniform(0, 2 * np.pi)
    t = np.cos(angle) * xn + np.sin(angle) * yn
    t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    fx, fy, phase = rng.uniform(0.5, 2.5), rng.uniform(0.5, 2.5), rng.uniform(0, 2 * np.pi)
    wave = 0.15 * np.sin(2 * np.pi * (fx * xn + fy * yn) + phase)
    t = np.clip(t + wave, 0.0, 1.0)[..., None]
    base = c0 * (1 - t) + c1 * t
    img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8), "RGB")

    # A few shapes, softened so edges look optical rather than synthetic.
    shapes = img.copy()  # blurred edges blend into the background, not black
    mask = Image.new("L", (width, height), 0)
    draw_s, draw_m = ImageDraw.Draw(shapes), ImageDraw.Draw(mask)
    scale = min(width, height)
    for _ in range(int(rng.integers(3, 7))):
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        rx = rng.uniform(0.08, 0.35) * scale
        ry = rng.uniform(0.08, 0.35) * scale
        box = (cx - rx, cy - ry, cx + rx, cy + ry)
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        if rng.random() < 0.6:
            draw_s.ellipse(box, fill=colour)
            draw_m.ellipse(box, fill=255)
        else:
            draw_s.rectangle(box, fill=colour)
            draw_m.rectangle(box, fill=255)
    radius = max(scale / 150.0, 0.5)
    mask = mask.filter(ImageFilter.GaussianBlur(radius))
    img = Image.composite(shapes, img, mask)

    # Soft lighting falloff (vignette-like) from a random light position, then
    # mild sensor-like noise.
    arr = np.asarray(img, dtype=np.float32)
    lx, ly = rng.uniform(0.2, 0.8), rng.uniform(0.2, 0.8)
    dist = np.sqrt((xn - lx) ** 2 + (yn - ly) ** 2)
    arr *= (1.0 - 0.35 * np.clip(dist, 0.0, 1.0) ** 1.5)[..., None]
    arr += rng.normal(0.0, 3.0, arr.shape).astype(np.float32)
    return Image.fromarray(np.clip(arr + 0.5, 0, 255).astype(np.uint8), "RGB")


def write_caption_pairs(root: Path, captions: list[str]) -> Path:
    """One photo-like PNG per caption under ``root/img`` and ``root/pairs.jsonl`` naming them
    (paths relative to it); returns the pairs file."""
    import json

    (root / "img").mkdir(parents=True)
    lines = []
    for i, caption in enumerate(captions):
        photo_like(80, 64, seed=100 + i).save(root / "img" / f"{i}.png")
        lines.append(json.dumps({"path": f"img/{i}.png", "caption": caption}))
    pairs = root / "pairs.jsonl"
    pairs.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return pairs


def _jpeg_bytes(img: Image.Image, **kwargs: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=_JPEG_QUALITY, **kwargs)
    return buf.getvalue()


def encode_image(img: Image.Image, fmt: str, **kwargs: object) -> bytes:
    """``img`` saved in format ``fmt`` (Pillow's save options as keywords), as bytes."""
    buf = io.BytesIO()
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


def _write(path: Path | bytes, data: bytes) -> None:
    """Write ``data`` to a str/Path or a raw bytes path, creating parents."""
    if isinstance(path, bytes):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def _bomb_png(width: int, height: int) -> bytes:
    """A valid 1-bit grayscale PNG of ``width`` x ``height`` zero pixels.

    Written chunk by chunk with streamed zlib so neither memory nor time grows
    with the declared pixel count beyond a few tens of milliseconds; the
    result is a few tens of KB.
    """
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1-bit gray
    row = bytes(1 + (width + 7) // 8)  # filter byte 0 + packed zero pixels
    rows_per_chunk = 256
    block = row * rows_per_chunk
    comp = zlib.compressobj(9)
    parts: list[bytes] = []
    full, rest = divmod(height, rows_per_chunk)
    for _ in range(full):
        parts.append(comp.compress(block))
    parts.append(comp.compress(row * rest))
    parts.append(comp.flush())
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", b"".join(parts))
        + _png_chunk(b"IEND", b"")
    )


def _gray16(width: int, height: int) -> Image.Image:
    """16-bit grayscale gradient whose values span exactly 0..65535."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    t = (x / (width - 1) + y / (height - 1)) / 2.0
    arr = np.round(t * 65535.0).astype(np.uint16)
    try:
        return Image.fromarray(arr, "I;16")
    except (ValueError, TypeError):
        # Pillow 13 rejects an explicit "I;16" mode for uint16 arrays
        # ("Invalid mode for data type") although it infers I;16 by itself.
        return Image.frombytes("I;16", (width, height), arr.astype("<u2").tobytes())


def _frames(size: tuple[int, int], seed: int) -> list[Image.Image]:
    """Three RGB frames of distinct colours (see ``GIF_FRAME_COLORS``)."""
    rng = np.random.default_rng(seed)
    frames = []
    w, h = size
    for colour in GIF_FRAME_COLORS:
        im = Image.new("RGB", size, colour)
        x0, y0 = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
        ImageDraw.Draw(im).ellipse((x0, y0, x0 + w // 3, y0 + h // 3), fill=(250, 250, 250))
        frames.append(im)
    return frames


# --------------------------------------------------------------------------
# collection
# --------------------------------------------------------------------------


def transparent_photo_like(width: int, height: int, seed: int) -> Image.Image:
    """An RGBA photo-like image: opaque in a central box, half transparent at the left edge,
    fully transparent elsewhere (for parity tests of the alpha policy)."""
    rgba = photo_like(width, height, seed=seed).convert("RGBA")
    alpha = np.zeros((height, width), np.uint8)
    alpha[height * 2 // 9 : height * 7 // 9, width // 4 : width * 5 // 6] = 255
    alpha[:, : width // 12] = 128
    rgba.putalpha(Image.fromarray(alpha))
    return rgba


def make_collection(root: Path, *, with_unreadable: bool = True) -> Collection:
    """Write the test image collection under ``root`` and describe it.

    ``root`` is created if needed; it should be empty.  The layout is::

        photos/a.jpg                         640x480 JPEG
        photos/panorama.jpg                  1000x30 JPEG (extreme aspect)
        photos/2023/d.Jpeg                   64x64
        photos/2023/summer/b.JPG             320x240
        photos/2023/summer/beach/c.jpeg      100x150
        exif/rotated_6.jpg                   stored 200x100, Orientation=6 -> 100x200
        exif/rotated_3.jpg                   stored 200x100, Orientation=3 -> 200x100
        formats/rgba.png                     RGBA, partially transparent
        formats/palette_trns.png             P + tRNS transparency index
        formats/gray_L.png, gray_LA.png      L, LA
        formats/gray16.png                   I;16, values 0..65535
        formats/bilevel.png                  1-bit
        formats/cmyk.jpg                     CMYK JPEG
        formats/animated.gif                 3 frames (red, green, blue)
        formats/animated.webp                3 frames (if WebP writable)
        formats/still.webp, image.bmp, image.tiff
        intl/日本語 café.png, intl/emoji 🐱.jpg
        intl/latin1_caf\\xe9.jpg              non-UTF-8 (latin-1) bytes name
        nested/level2/level3/deep.png        several levels deep
        nested/loop -> ..                    directory symlink loop
        real_dir/in_real_dir.jpg             also reachable via alias/
        alias -> real_dir                    directory symlink
        folder.jpg/inside.jpg                directory named like an image
        link_to_photo.jpg -> photos/a.jpg    file symlink
        broken/empty.jpg                     0 bytes                ("empty")
        broken/truncated.jpg                 60 % of a JPEG         ("truncated")
        broken/notes.png                     text                   ("not-an-image")
        broken/bomb.png                      1-bit 20000x20000 PNG  ("bomb")
        broken/unreadable.jpg                mode 000, non-root only ("unreadable")
        README.txt, data.json, ._junk.dat, .DS_Store      ignored junk
        gone.jpg -> does-not-exist.jpg       dangling symlink (ignored)
        pipe.jpg                             FIFO (ignored; reading it blocks)

    Args:
        root: Target directory.
        with_unreadable: Also create ``broken/unreadable.jpg`` (mode 000).  It
            is skipped anyway when running as root, who can read it.

    Returns:
        A :class:`Collection` describing what was written.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    good: dict[str, tuple[int, int]] = {}
    modes: dict[str, str] = {}
    animated: dict[str, int] = {}
    broken: dict[str, str] = {}
    ignored: list[str] = []

    def add_good(rel: str, data: bytes, size: tuple[int, int], mode: str) -> None:
        _write(root / rel, data)
        good[rel] = size
        modes[rel] = mode

    seed = 1000

    def photo(w: int, h: int) -> Image.Image:
        nonlocal seed
        seed += 1
        return photo_like(w, h, seed)

    # -- plain RGB JPEGs, several sizes, extension case variants, nesting --
    for rel, (w, h) in [
        ("photos/a.jpg", (640, 480)),
        ("photos/panorama.jpg", (1000, 30)),
        ("photos/2023/d.Jpeg", (64, 64)),
        ("photos/2023/summer/b.JPG", (320, 240)),
        ("photos/2023/summer/beach/c.jpeg", (100, 150)),
    ]:
        add_good(rel, _jpeg_bytes(photo(w, h)), (w, h), "RGB")

    # -- EXIF orientation --
    for orientation, rel, shown in [
        (6, "exif/rotated_6.jpg", (100, 200)),
        (3, "exif/rotated_3.jpg", (200, 100)),
    ]:
        exif = Image.Exif()
        exif[0x0112] = orientation
        add_good(rel, _jpeg_bytes(photo(200, 100), exif=exif.tobytes()), shown, "RGB")

    # -- modes and formats --
    base = photo(160, 120)
    rgba = base.convert("RGBA")
    alpha = np.full((120, 160), 255, np.uint8)
    alpha[:, :60] = 0  # fully transparent band
    alpha[:, 60:100] = np.linspace(0, 255, 40, dtype=np.uint8)[None, :]  # ramp
    rgba.putalpha(Image.fromarray(alpha, "L"))
    add_good("formats/rgba.png", encode_image(rgba, "PNG"), (160, 120), "RGBA")

    pal = photo(96, 72).quantize(colors=16, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    ImageDraw.Draw(pal).rectangle((0, 0, 40, 30), fill=15)  # index 15 -> transparent
    add_good("formats/palette_trns.png", encode_image(pal, "PNG", transparency=15), (96, 72), "P")

    gray = photo(128, 96).convert("L")
    add_good("formats/gray_L.png", encode_image(gray, "PNG"), (128, 96), "L")
    la = gray.copy()
    la.putalpha(Image.fromarray(np.tile(np.linspace(0, 255, 128, dtype=np.uint8), (96, 1)), "L"))
    add_good("formats/gray_LA.png", encode_image(la, "PNG"), (128, 96), "LA")

    g16_data = encode_image(_gray16(128, 64), "PNG")
    with Image.open(io.BytesIO(g16_data)) as back:
        g16_mode = back.mode
        lo, hi = back.getextrema()
    if g16_mode not in ("I;16", "I") or (lo, hi) != (0, 65535):
        raise RuntimeError(f"16-bit PNG read back as {g16_mode} {lo}..{hi}")
    add_good("formats/gray16.png", g16_data, (128, 64), g16_mode)

    bl = np.asarray(photo(120, 80).convert("L"))
    bilevel = Image.fromarray(np.where(bl >= np.median(bl), 255, 0).astype(np.uint8), "L")
    bilevel = bilevel.convert("1", dither=Image.Dither.NONE)
    add_good("formats/bilevel.png", encode_image(bilevel, "PNG"), (120, 80), "1")

    add_good("formats/cmyk.jpg", _jpeg_bytes(photo(160, 120).convert("CMYK")), (160, 120), "CMYK")

    frames = _frames((64, 48), seed=7)
    gif = encode_image(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    add_good("formats/animated.gif", gif, (64, 48), "P")
    animated["formats/animated.gif"] = 3

    add_good("formats/still.webp", encode_image(photo(160, 120), "WEBP", quality=80, method=4), (160, 120), "RGB")
    try:
        webp_anim = encode_image(
            frames[0], "WEBP", save_all=True, append_images=frames[1:],
            duration=100, loop=0, lossless=True,
        )
        with Image.open(io.BytesIO(webp_anim)) as back:
            ok = getattr(back, "n_frames", 1) == 3
            webp_mode = back.mode
    except (OSError, ValueError, KeyError):  # no (animated) WebP writer
        ok = False
    if ok:
        add_good("formats/animated.webp", webp_anim, (64, 48), webp_mode)
        animated["formats/animated.webp"] = 3

    add_good("formats/image.bmp", encode_image(photo(120, 90), "BMP"), (120, 90), "RGB")
    add_good("formats/image.tiff", encode_image(photo(160, 120), "TIFF", compression="tiff_lzw"), (160, 120), "RGB")

    # -- international file names --
    add_good("intl/日本語 café.png", encode_image(photo(80, 60), "PNG"), (80, 60), "RGB")
    add_good("intl/emoji 🐱.jpg", _jpeg_bytes(photo(120, 90)), (120, 90), "RGB")
    latin1_rel = b"intl/latin1_caf\xe9.jpg"
    _write(os.fsencode(root) + b"/" + latin1_rel, _jpeg_bytes(photo(90, 120)))
    good[os.fsdecode(latin1_rel)] = (90, 120)
    modes[os.fsdecode(latin1_rel)] = "RGB"

    # -- deep nesting, directory symlinks (loop + alias) --
    add_good("nested/level2/level3/deep.png", encode_image(photo(64, 48), "PNG"), (64, 48), "RGB")
    os.symlink("..", root / "nested" / "loop", target_is_directory=True)
    add_good("real_dir/in_real_dir.jpg", _jpeg_bytes(photo(100, 80)), (100, 80), "RGB")
    os.symlink("real_dir", root / "alias", target_is_directory=True)
    symlinked_dirs = ["nested/loop", "alias"]

    # -- a directory named like an image, holding a good image --
    add_good("folder.jpg/inside.jpg", _jpeg_bytes(photo(80, 80)), (80, 80), "RGB")
    ignored.append("folder.jpg")

    # -- file symlink --
    os.symlink("photos/a.jpg", root / "link_to_photo.jpg")
    file_symlinks = ["link_to_photo.jpg"]

    # -- broken --
    _write(root / "broken/empty.jpg", b"")
    broken["broken/empty.jpg"] = "empty"
    full = _jpeg_bytes(photo(320, 240))
    _write(root / "broken/truncated.jpg", full[: len(full) * 6 // 10])
    broken["broken/truncated.jpg"] = "truncated"
    _write(root / "broken/notes.png", b"Shopping list:\n- milk\n- not a PNG, just text\n")
    broken["broken/notes.png"] = "not-an-image"
    _write(root / "broken/bomb.png", _bomb_png(*BOMB_SIZE))
    broken["broken/bomb.png"] = "bomb"
    if with_unreadable and os.geteuid() != 0:
        p = root / "broken/unreadable.jpg"
        _write(p, _jpeg_bytes(photo(64, 64)))
        os.chmod(p, 0)
        broken["broken/unreadable.jpg"] = "unreadable"

    # -- ignored junk --
    _write(root / "README.txt", b"Test image collection generated by tests/imagegen.py\n")
    _write(root / "data.json", b'{"not": "an image"}\n')
    _write(root / "._junk.dat", b"\x00\x05\x16\x07" + bytes(60))  # AppleDouble-like
    _write(root / ".DS_Store", b"\x00\x00\x00\x01Bud1" + bytes(56))
    os.symlink("does-not-exist.jpg", root / "gone.jpg")
    os.mkfifo(root / "pipe.jpg")
    ignored += ["README.txt", "data.json", "._junk.dat", ".DS_Store", "gone.jpg", "pipe.jpg"]

    return Collection(
        root=root,
        good=good,
        broken=broken,
        ignored=ignored,
        symlinked_dirs=symlinked_dirs,
        file_symlinks=file_symlinks,
        modes=modes,
        animated=animated,
    )


def make_jpegs(
    root: Path, count: int, size: tuple[int, int] = (640, 480), seed: int = 0
) -> list[Path]:
    """Write ``count`` photo-like JPEGs ``img_00000.jpg``... into ``root``.

    Image ``i`` is ``photo_like(*size, seed + i)`` at quality 85.

    Returns:
        The written paths, in index order.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        p = root / f"img_{i:05d}.jpg"
        p.write_bytes(_jpeg_bytes(photo_like(size[0], size[1], seed + i)))
        paths.append(p)
    return paths


def _default_size(i: int) -> tuple[int, int]:
    return 72 + i % 5, 60


def write_photos(
    root: Path,
    count: int,
    start: int = 0,
    *,
    size: Callable[[int], tuple[int, int]] = _default_size,
    name: str = "img_{:03d}.jpg",
    seed: int = 0,
    quality: int = 90,
) -> Path:
    """Write photo-like JPEGs number ``start`` to ``start + count - 1`` into ``root`` (made if missing).

    Photo ``i`` is ``photo_like(*size(i), seed + i)`` saved as ``name.format(i)``: a later call with
    ``start`` past the first adds new, different photos to the same folder.

    Returns:
        ``root``.
    """
    root.mkdir(parents=True, exist_ok=True)
    for i in range(start, start + count):
        photo_like(*size(i), seed=seed + i).save(root / name.format(i), quality=quality)
    return root
