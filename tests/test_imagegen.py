"""Tests of the test-data generator ``tests/imagegen.py`` itself."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps, UnidentifiedImageError

try:  # works whether or not tests/ is a package
    from imagegen import BOMB_SIZE, GIF_FRAME_COLORS, Collection, make_collection, make_jpegs, photo_like
except ImportError:  # pragma: no cover
    from tests.imagegen import (  # type: ignore[no-redef]  # same names, tests package
        BOMB_SIZE,
        GIF_FRAME_COLORS,
        Collection,
        make_collection,
        make_jpegs,
        photo_like,
    )


@pytest.fixture(scope="module")
def coll(tmp_path_factory: pytest.TempPathFactory) -> Collection:
    return make_collection(tmp_path_factory.mktemp("coll") / "root")


def _snapshot(root: Path) -> dict[str, tuple[str, str]]:
    """rel path -> (kind, sha256 or link target), without following symlinks."""
    out: dict[str, tuple[str, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root).replace(os.sep, "/")
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", "")
            elif stat.S_ISREG(st.st_mode):
                if not os.access(p, os.R_OK):
                    out[rel] = ("unreadable", str(st.st_size))
                else:
                    with open(p, "rb") as f:
                        out[rel] = ("file", hashlib.sha256(f.read()).hexdigest())
            elif stat.S_ISFIFO(st.st_mode):
                out[rel] = ("fifo", "")
            else:  # pragma: no cover
                out[rel] = ("other", "")
    return out


# ---------------------------------------------------------------- good files


def test_good_files_open_with_documented_mode_and_size(coll: Collection) -> None:
    assert len(coll.good) >= 20
    assert set(coll.modes) == set(coll.good)
    for rel, size in coll.good.items():
        with Image.open(coll.root / rel) as im:
            assert im.mode == coll.modes[rel], rel
            im.load()
            shown = ImageOps.exif_transpose(im)
            assert shown.size == size, rel
            # Everything must be convertible to RGB for an embedder.
            assert shown.convert("RGB").size == size, rel


def test_expected_cases_present(coll: Collection) -> None:
    good = coll.good
    # sizes incl. extreme aspect
    assert {(640, 480), (320, 240), (100, 150), (64, 64), (1000, 30)} <= set(good.values())
    # extension case variants
    exts = {os.path.splitext(r)[1] for r in good}
    assert {".jpg", ".JPG", ".jpeg", ".Jpeg", ".png", ".gif", ".bmp", ".tiff", ".webp"} <= exts
    # modes
    assert {"RGB", "RGBA", "P", "L", "LA", "1", "CMYK"} <= set(coll.modes.values())
    assert coll.modes["formats/gray16.png"] in ("I;16", "I")
    # several directory levels
    assert max(r.count("/") for r in good) >= 3
    # unicode names
    assert "intl/日本語 café.png" in good
    assert "intl/emoji 🐱.jpg" in good


def test_exif_orientation(coll: Collection) -> None:
    with Image.open(coll.root / "exif/rotated_6.jpg") as im:
        assert im.size == (200, 100)
        assert im.getexif()[0x0112] == 6
        assert ImageOps.exif_transpose(im).size == (100, 200)
    assert coll.good["exif/rotated_6.jpg"] == (100, 200)
    with Image.open(coll.root / "exif/rotated_3.jpg") as im:
        assert im.getexif()[0x0112] == 3
        assert ImageOps.exif_transpose(im).size == (200, 100)


def test_transparency_and_special_modes(coll: Collection) -> None:
    root = coll.root
    with Image.open(root / "formats/rgba.png") as im:
        lo, hi = im.getchannel("A").getextrema()
        assert (lo, hi) == (0, 255)
        assert len(np.unique(np.asarray(im.getchannel("A")))) > 10  # partial alpha
    with Image.open(root / "formats/palette_trns.png") as im:
        assert im.mode == "P"
        assert isinstance(im.info.get("transparency"), int)
        assert im.info["transparency"] in np.asarray(im)
    with Image.open(root / "formats/gray_LA.png") as im:
        assert im.mode == "LA"
    with Image.open(root / "formats/gray16.png") as im:
        assert im.mode in ("I;16", "I")
        assert im.getextrema() == (0, 65535)
    with Image.open(root / "formats/bilevel.png") as im:
        assert im.mode == "1"
        assert set(np.unique(np.asarray(im.convert("L")))) == {0, 255}
    with Image.open(root / "formats/cmyk.jpg") as im:
        assert im.mode == "CMYK"


def test_animated_first_frame(coll: Collection) -> None:
    assert coll.animated["formats/animated.gif"] == 3
    for rel, n in coll.animated.items():
        with Image.open(coll.root / rel) as im:
            assert getattr(im, "n_frames", 1) == n, rel
            seen = []
            for i in range(n):
                im.seek(i)
                seen.append(im.convert("RGB").getpixel((1, 1)))
            for got, want in zip(seen, GIF_FRAME_COLORS, strict=True):
                assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 8, (rel, seen)
        # A fresh open starts at frame 0 (red), the one that counts.
        with Image.open(coll.root / rel) as im:
            r, g, b = im.convert("RGB").getpixel((1, 1))
            assert r > 150 and g < 80 and b < 80


def test_non_utf8_name(coll: Collection) -> None:
    rel = os.fsdecode(b"intl/latin1_caf\xe9.jpg")
    assert rel in coll.good
    assert "\udce9" in rel  # surrogate escape
    raw = os.fsencode(coll.root) + b"/" + os.fsencode(rel)
    assert raw.endswith(b"caf\xe9.jpg")
    with open(raw, "rb") as f, Image.open(f) as im:
        im.load()
        assert im.size == coll.good[rel]
    # the str (surrogate-escaped) path works too
    with Image.open(coll.root / rel) as im:
        assert im.size == coll.good[rel]


# -------------------------------------------------------------- broken files


def test_broken_files_fail(coll: Collection) -> None:
    expected = {"empty", "truncated", "not-an-image", "bomb"}
    assert expected <= set(coll.broken.values())
    for rel, cat in coll.broken.items():
        p = coll.root / rel
        if cat == "bomb":
            with pytest.raises(Image.DecompressionBombError):
                Image.open(p)
        elif cat == "unreadable":
            with pytest.raises(PermissionError):
                Image.open(p)
        elif cat == "truncated":
            with Image.open(p) as im:  # header is intact ...
                with pytest.raises(OSError):
                    im.load()  # ... but the data is not
        else:
            with pytest.raises(UnidentifiedImageError):
                Image.open(p)
    assert (coll.root / "broken/empty.jpg").stat().st_size == 0


def test_bomb_is_small_and_declares_huge_size(coll: Collection) -> None:
    p = coll.root / "broken/bomb.png"
    assert p.stat().st_size < 1_000_000
    w, h = BOMB_SIZE
    assert w * h > 2 * Image.MAX_IMAGE_PIXELS
    data = p.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(data[16:20], "big") == w and int.from_bytes(data[20:24], "big") == h


def test_unreadable_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = make_collection(tmp_path / "no", with_unreadable=False)
    assert "broken/unreadable.jpg" not in c.broken
    assert not (tmp_path / "no/broken/unreadable.jpg").exists()

    real_root = os.geteuid() == 0
    c = make_collection(tmp_path / "default")
    assert ("broken/unreadable.jpg" in c.broken) is (not real_root)
    assert (tmp_path / "default/broken/unreadable.jpg").exists() is (not real_root)

    # Exercise the non-root branch whatever user we are.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    c = make_collection(tmp_path / "nonroot")
    assert c.broken["broken/unreadable.jpg"] == "unreadable"
    assert stat.S_IMODE(os.stat(tmp_path / "nonroot/broken/unreadable.jpg").st_mode) == 0


# ------------------------------------------------------ ignored and symlinks


def test_ignored_and_symlinks(coll: Collection) -> None:
    root = coll.root
    kinds = {rel: stat.S_IFMT(os.lstat(root / rel).st_mode) for rel in coll.ignored}
    assert kinds["gone.jpg"] == stat.S_IFLNK and not (root / "gone.jpg").exists()
    assert kinds["pipe.jpg"] == stat.S_IFIFO
    assert kinds["folder.jpg"] == stat.S_IFDIR
    assert "folder.jpg/inside.jpg" in coll.good
    for rel in ("README.txt", "data.json", "._junk.dat"):
        assert kinds[rel] == stat.S_IFREG

    assert set(coll.symlinked_dirs) == {"nested/loop", "alias"}
    for rel in coll.symlinked_dirs:
        assert (root / rel).is_symlink() and (root / rel).is_dir()
    assert (root / "nested/loop").resolve() == root.resolve()
    assert (root / "alias").resolve() == (root / "real_dir").resolve()
    assert "real_dir/in_real_dir.jpg" in coll.good
    assert not any(r.startswith(("alias/", "nested/loop/")) for r in coll.good)

    assert coll.file_symlinks == ["link_to_photo.jpg"]
    link = root / "link_to_photo.jpg"
    assert link.is_symlink() and os.readlink(link) == "photos/a.jpg"
    assert link.resolve() == (root / "photos/a.jpg").resolve()
    assert "photos/a.jpg" in coll.good and "link_to_photo.jpg" not in coll.good


def test_every_entry_is_accounted_for(coll: Collection) -> None:
    """A non-following walk finds exactly the described entries."""
    snap = _snapshot(coll.root)
    described = (
        set(coll.good) | set(coll.broken) | set(coll.ignored)
        | set(coll.symlinked_dirs) | set(coll.file_symlinks)
    )
    files = {r for r, (k, _) in snap.items() if k != "dir" or r in described}
    assert files == described
    regular = {r for r, (k, _) in snap.items() if k in ("file", "unreadable")}
    assert set(coll.good) | set(coll.broken) <= regular
    assert not set(coll.good) & set(coll.broken)


# -------------------------------------------------- determinism, size, speed


def test_deterministic(tmp_path: Path) -> None:
    a = make_collection(tmp_path / "a")
    b = make_collection(tmp_path / "b")
    assert a.good == b.good and a.broken == b.broken and a.ignored == b.ignored
    assert a.modes == b.modes
    sa, sb = _snapshot(a.root), _snapshot(b.root)
    assert sa == sb
    assert sum(k == "file" for k, _ in sa.values()) >= 25


def test_small_and_cheap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Cheap by construction rather than by a stopwatch (which flakes on a loaded machine):
    # the time goes into drawing and encoding pixels, so count those.
    drawn: list[tuple[int, int]] = []
    encoded: list[tuple[int, int]] = []
    module = sys.modules[make_collection.__module__]
    draw, save = module.photo_like, Image.Image.save

    def counting_draw(width: int, height: int, seed: int) -> Image.Image:
        drawn.append((width, height))
        return draw(width, height, seed)

    def counting_save(self: Image.Image, *args: object, **kwargs: object) -> None:
        encoded.append(self.size)
        save(self, *args, **kwargs)

    monkeypatch.setattr(module, "photo_like", counting_draw)
    monkeypatch.setattr(Image.Image, "save", counting_save)
    c = make_collection(tmp_path / "c")
    monkeypatch.undo()
    # Every image file but the hand-built bomb goes through one encode; the 400 M pixel bomb is
    # never drawn or encoded, and nothing is bigger than photos/a.jpg (640x480).
    assert drawn and encoded  # the counters saw the work
    assert max(w * h for w, h in encoded + drawn) == 640 * 480
    assert sum(w * h for w, h in encoded) < 1_000_000 and sum(w * h for w, h in drawn) < 1_000_000
    total = 0
    for dirpath, _, filenames in os.walk(c.root):
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    assert total < 2_000_000


# ---------------------------------------------------- photo_like, make_jpegs


def test_photo_like() -> None:
    a = photo_like(200, 150, seed=3)
    assert a.mode == "RGB" and a.size == (200, 150)
    assert a.tobytes() == photo_like(200, 150, seed=3).tobytes()
    assert a.tobytes() != photo_like(200, 150, seed=4).tobytes()
    arr = np.asarray(a, dtype=np.float32)
    # smooth, like a photo: neighbouring pixels are close, but the image is not flat
    assert np.abs(np.diff(arr, axis=1)).mean() < 12
    assert arr.std() > 10
    assert photo_like(1, 1, 0).size == (1, 1)


def test_make_jpegs(tmp_path: Path) -> None:
    paths = make_jpegs(tmp_path / "a", 3, seed=5)
    assert [p.name for p in paths] == ["img_00000.jpg", "img_00001.jpg", "img_00002.jpg"]
    for p in paths:
        with Image.open(p) as im:
            assert im.format == "JPEG" and im.mode == "RGB" and im.size == (640, 480)
        assert 5_000 < p.stat().st_size < 200_000
    again = make_jpegs(tmp_path / "b", 3, seed=5)
    assert [p.read_bytes() for p in paths] == [p.read_bytes() for p in again]
    small = make_jpegs(tmp_path / "c", 1, size=(32, 16))
    with Image.open(small[0]) as im:
        assert im.size == (32, 16)
