"""Tests of collection discovery (``indexer/discover.py``)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from indexer.discover import Discovery, discover

try:
    from imagegen import Collection
except ImportError:  # pragma: no cover
    from tests.imagegen import Collection  # type: ignore[no-redef]  # same names, tests package


def _rels(d: Discovery) -> list[bytes]:
    return [f.rel for f in d.files]


def _expected(collection: Collection) -> set[str]:
    return set(collection.good) | set(collection.broken) | set(collection.file_symlinks)


def test_discover_collection_exact_set(collection: Collection) -> None:
    d = discover(collection.root)
    found = {os.fsdecode(r) for r in _rels(d)}
    assert found == _expected(collection)
    assert len(_rels(d)) == len(found)  # no duplicates
    assert d.unreadable_dirs == []


def test_discover_policy_details(collection: Collection) -> None:
    found = {os.fsdecode(r) for r in _rels(discover(collection.root))}
    # File symlinks to regular files are taken.
    for link in collection.file_symlinks:
        assert link in found
    # Directory symlinks are not followed: nothing under alias/ or nested/loop/.
    for sym in collection.symlinked_dirs:
        assert not any(p == sym or p.startswith(sym + "/") for p in found), sym
    assert "real_dir/in_real_dir.jpg" in found
    # FIFO, dangling link, junk, and the directory named like an image are ignored.
    for name in collection.ignored:
        assert name not in found
    assert "pipe.jpg" not in found and "gone.jpg" not in found and "folder.jpg" not in found
    assert "folder.jpg/inside.jpg" in found
    # Case-insensitive extensions.
    assert "photos/2023/d.Jpeg" in found
    assert "photos/2023/summer/b.JPG" in found


def test_discover_sizes_and_mtimes(collection: Collection) -> None:
    for f in discover(collection.root).files:
        st = os.stat(os.path.join(os.fsencode(collection.root), f.rel))  # follows file symlinks
        assert f.size == st.st_size
        assert f.mtime_ns == st.st_mtime_ns


def test_discover_sorted_by_bytes_and_deterministic(collection: Collection) -> None:
    first = _rels(discover(collection.root))
    assert all(isinstance(r, bytes) for r in first)
    assert first == sorted(first)
    second = _rels(discover(collection.root))
    assert first == second
    # Also accepts a str path.
    assert _rels(discover(str(collection.root))) == first


def test_discover_non_utf8_name_exact_bytes(collection: Collection) -> None:
    rels = _rels(discover(collection.root))
    assert b"intl/latin1_caf\xe9.jpg" in rels
    assert "intl/日本語 café.png".encode() in rels
    assert "intl/emoji 🐱.jpg".encode() in rels
    # The rel bytes open the file again.
    with open(os.path.join(os.fsencode(collection.root), b"intl/latin1_caf\xe9.jpg"), "rb") as fh:
        assert fh.read(2) == b"\xff\xd8"


def test_discover_extension_argument_case_insensitive(tmp_path: Path) -> None:
    for name in ["x.JPG", "y.jpg", "z.JpEg", "w.png", "v.gif", "noext", ".jpg", "a.jpg.txt"]:
        (tmp_path / name).write_bytes(b"x")
    rels = _rels(discover(tmp_path, extensions=[".JPG", ".jpeg"]))
    assert rels == [b"x.JPG", b"y.jpg", b"z.JpEg"]
    rels_default = _rels(discover(tmp_path))
    assert rels_default == [b"v.gif", b"w.png", b"x.JPG", b"y.jpg", b"z.JpEg"]


def test_discover_symlinks_to_non_regular_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "in.png").write_bytes(b"x")
    (tmp_path / "real.png").write_bytes(b"x")
    os.symlink("dir", tmp_path / "dirlink.jpg")  # directory symlink named like an image
    os.symlink("real.png", tmp_path / "filelink.png")
    os.symlink("filelink.png", tmp_path / "chain.png")  # link -> link -> file
    os.mkfifo(tmp_path / "fifo.png")
    os.symlink("fifo.png", tmp_path / "fifolink.png")
    os.symlink("nowhere.png", tmp_path / "dangling.png")
    os.symlink("self.png", tmp_path / "self.png")  # self loop
    rels = _rels(discover(tmp_path))
    assert rels == [b"chain.png", b"dir/in.png", b"filelink.png", b"real.png"]


def test_discover_unreadable_dir_reported(collection: Collection, monkeypatch: pytest.MonkeyPatch) -> None:
    real_scandir = os.scandir
    blocked = os.path.join(os.fsencode(collection.root), b"photos", b"2023")

    def fake_scandir(path: object = ".") -> object:
        if os.fsencode(path) == blocked:  # type: ignore[arg-type]  # path is object in this stand-in for scandir
            raise PermissionError(13, "Permission denied", path)
        return real_scandir(path)  # type: ignore[arg-type]  # path is object in this stand-in for scandir

    monkeypatch.setattr(os, "scandir", fake_scandir)
    d = discover(collection.root)
    monkeypatch.undo()

    assert len(d.unreadable_dirs) == 1
    rel, why = d.unreadable_dirs[0]
    assert rel == b"photos/2023"
    assert "ermission" in why
    found = {os.fsdecode(r) for r in _rels(d)}
    expected = {p for p in _expected(collection) if not p.startswith("photos/2023/")}
    assert found == expected
    # The walk continued past the unreadable directory (siblings and later dirs found).
    assert "photos/a.jpg" in found
    assert "real_dir/in_real_dir.jpg" in found


def test_discover_unreadable_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_scandir(path: object = ".") -> object:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(os, "scandir", fake_scandir)
    d = discover(tmp_path)
    monkeypatch.undo()
    assert d.files == []
    assert d.unreadable_dirs == [(b"", "Permission denied")]


def test_discover_symlink_loop_terminates(collection: Collection) -> None:
    # nested/loop -> .. points back at the root: a walker that followed it would never end.
    result: list[Discovery] = []
    t = threading.Thread(target=lambda: result.append(discover(collection.root)), daemon=True)
    t.start()
    t.join(timeout=20)
    assert not t.is_alive(), "discover() did not finish: directory symlink loop followed?"
    assert result and not any(r.startswith(b"nested/loop") for r in _rels(result[0]))


def test_discover_empty_dir(tmp_path: Path) -> None:
    d = discover(tmp_path)
    assert d.files == [] and d.unreadable_dirs == []


def test_from_list_takes_listed_files_only(collection) -> None:
    from indexer.discover import from_list

    d = from_list(
        collection.root,
        [
            "photos/a.jpg", "photos/../photos/a.jpg", "formats/rgba.png", "nope.jpg", "../outside.jpg", "/etc/passwd", "folder.jpg",
            b"intl/latin1_caf\xe9.jpg",
        ],
    )
    assert [f.rel for f in d.files] == [b"formats/rgba.png", b"intl/latin1_caf\xe9.jpg", b"photos/a.jpg"]
    reasons = dict(d.missing)
    assert reasons[b"nope.jpg"] == "file not found"
    assert reasons[b"../outside.jpg"] == reasons[b"/etc/passwd"] == "outside the photos directory"
    assert reasons[b"folder.jpg"] == "not a regular file"
