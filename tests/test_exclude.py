"""What is not indexed: hidden names, thumbnail caches, ``--exclude`` and ``.clipsearchignore``;
recorded in the index and kept by updates; bad ignore files and patterns refused, the index whole."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import assert_one_line_error
from imagegen import write_photos

from clipsearch.cli import main
from indexer import build_index
from indexer.discover import discover
from indexer.exclusions import Exclusions, WalkOptions, load_exclusions, walk_options
from retrieval import ImageIndex
from retrieval.errors import InvalidArgumentError, PhotosDirError


def _tree(root: Path) -> Path:
    """Two photos kept, and one in each place that is left out by default."""
    write_photos(root, 2)
    write_photos(root / "trip", 1, 2)
    write_photos(root, 1, 3, name=".hidden_{:03d}.jpg")
    write_photos(root / ".thumbnails", 1, 4)
    write_photos(root / "trip" / "@eaDir", 1, 5)
    write_photos(root / "__MACOSX", 1, 6)
    write_photos(root / "#recycle", 1, 7)
    write_photos(root / "raw", 1, 8)
    return root


def _found(root: Path, exclusions: Exclusions | None) -> list[str]:
    return [os.fsdecode(f.rel) for f in discover(root, exclude=exclusions).files]


def _paths(index_dir: Path) -> list[str]:
    return sorted(ImageIndex.open(index_dir).metadata.paths())


def _build(photos: Path, out: Path, model: Path, **kw: object):  # type: ignore[no-untyped-def]  # BuildReport
    return build_index(photos, out, model=str(model), device="cpu", precision="fp32", batch_size=8, **kw)


KEPT = ["img_000.jpg", "img_001.jpg", "raw/img_008.jpg", "trip/img_002.jpg"]


def test_defaults_leave_out_hidden_names_and_caches(tmp_path: Path) -> None:
    root = _tree(tmp_path / "p")
    assert _found(root, Exclusions(WalkOptions())) == KEPT
    everything = _found(root, Exclusions(WalkOptions(include_hidden=True)))
    assert len(everything) == 9 and everything == _found(root, None)


def test_patterns_are_gitignore_lines(tmp_path: Path) -> None:
    root = _tree(tmp_path / "p")
    assert _found(root, Exclusions(WalkOptions(exclude=("raw/",)))) == [k for k in KEPT if not k.startswith("raw/")]
    # Anchored, negated and name patterns, as git reads them.
    spec = Exclusions(WalkOptions(exclude=("*.jpg", "!img_001.jpg", "/trip/")))
    assert _found(root, spec) == ["img_001.jpg"]
    # A folder pattern without a slash matches the folder at any depth; a file inside an excluded
    # folder cannot be re-included (git's rule), since the walk never enters it.
    assert _found(root, Exclusions(WalkOptions(exclude=("trip", "!trip/img_002.jpg")))) == KEPT[:3]
    # Empty lines and comments are no patterns.
    assert _found(root, Exclusions(WalkOptions(), ["", "# raw/", "  "])) == KEPT


def test_excluded_folders_are_not_entered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _tree(tmp_path / "p")
    write_photos(root / "trip" / "@eaDir" / "deep", 1, 9)
    listed: list[bytes] = []
    real = os.scandir

    def scandir(path):  # type: ignore[no-untyped-def]  # os.scandir's overloads
        listed.append(os.fsencode(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    discover(root, exclude=Exclusions(WalkOptions(exclude=("raw/",))))
    names = {os.path.basename(p) for p in listed}
    assert names == {b"p", b"trip"}, names


def test_events_on_paths_under_excluded_folders_are_excluded() -> None:
    spec = Exclusions(WalkOptions(exclude=("raw/",)))
    assert spec.skips_path(b"a/@eaDir/x.jpg", False) and spec.skips_path(b"raw/x/y.jpg", False)
    assert spec.skips_path(b".git", True) and spec.skips_path(b"a/.b/c.jpg", False)
    assert not spec.skips_path(b"a/b/c.jpg", False) and not spec.skips_path(b"a/rawish/c.jpg", False)


def test_given_options_replace_recorded_ones() -> None:
    recorded = WalkOptions(True, ("raw/",)).to_dict()
    assert walk_options(None, None, recorded) == WalkOptions(True, ("raw/",))
    assert walk_options(False, ("*.png",), recorded) == WalkOptions(False, ("*.png",))
    assert walk_options(None, ("",), recorded) == WalkOptions(True, ())  # --exclude '' clears them
    assert walk_options(None, None, None) == WalkOptions() == WalkOptions.from_dict({})


def test_bad_patterns_and_ignore_files(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="not a valid gitignore pattern"):
        Exclusions(WalkOptions(exclude=("!",)))
    from indexer.build_config import BuildConfig

    with pytest.raises(InvalidArgumentError, match=r"exclude pattern '\\\\'"):
        BuildConfig(exclude=("\\",))
    with pytest.raises(InvalidArgumentError, match="not a string"):
        BuildConfig(exclude=(3,))  # type: ignore[arg-type]  # the bad input under test
    assert BuildConfig(exclude="raw/").exclude == ("raw/",)  # type: ignore[arg-type]  # one pattern as text
    assert BuildConfig(exclude=["a", "b"]).exclude == ("a", "b")  # type: ignore[arg-type]  # a list as a tuple
    ignore = tmp_path / ".clipsearchignore"
    ignore.write_bytes(b"raw/\n\xff\xfe\n")
    with pytest.raises(InvalidArgumentError, match="not UTF-8"):
        load_exclusions(tmp_path, WalkOptions())
    ignore.write_text("raw/\n!\n", encoding="utf-8")
    with pytest.raises(InvalidArgumentError, match=r"\.clipsearchignore, line 2,"):
        load_exclusions(tmp_path, WalkOptions())


def test_build_records_exclusions_and_updates_keep_them(tmp_path: Path, tiny_model: Path) -> None:
    photos, out = _tree(tmp_path / "p"), tmp_path / "idx"
    first = _build(photos, out, tiny_model, exclude=("raw/",))
    assert _paths(out) == [k for k in KEPT if not k.startswith("raw/")] and first.added == 3
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["discovery"] == {"include_hidden": False, "exclude": ["raw/"]}
    # A re-run without the options keeps the recorded ones: nothing to do, nothing committed.
    again = _build(photos, out, tiny_model)
    assert (again.added, again.removed, again.commits) == (0, 0, 0)
    # Files that become excluded leave the index on update, and the report counts them.
    (photos / ".clipsearchignore").write_text("# the trip is private\ntrip/\n", encoding="utf-8")
    fewer = _build(photos, out, tiny_model)
    assert fewer.removed == 1 and _paths(out) == ["img_000.jpg", "img_001.jpg"]
    # --include-hidden brings the hidden files and caches in; --exclude '' clears the patterns.
    more = _build(photos, out, tiny_model, include_hidden=True, exclude=("",))
    assert more.added == 5 and len(_paths(out)) == 7  # the ignore file still leaves trip/ out
    assert json.loads((out / "manifest.json").read_text())["discovery"] == {"include_hidden": True, "exclude": []}
    (photos / ".clipsearchignore").unlink()
    back = _build(photos, out, tiny_model, include_hidden=False)
    assert back.added == 1 and back.removed == 4 and _paths(out) == KEPT


def test_bad_ignore_file_is_one_line_and_the_index_stays(tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    photos, out = _tree(tmp_path / "p"), tmp_path / "idx"
    _build(photos, out, tiny_model)
    before = (out / "manifest.json").read_bytes()
    ignore = photos / ".clipsearchignore"
    args = ["index", str(photos), str(out), "--model", str(tiny_model), "--device", "cpu", "--no-progress"]
    for content, needle in ((b"\xff\n", "not UTF-8"), (b"ok/\n\\\n", "line 2")):
        ignore.write_bytes(content)
        assert main(args) == 1
        assert_one_line_error(1, capsys.readouterr().err, ".clipsearchignore", needle)
    if os.geteuid() != 0:  # root reads a file whatever its mode
        ignore.write_bytes(b"raw/\n")
        ignore.chmod(0)
        assert main(args) == 1
        assert_one_line_error(1, capsys.readouterr().err, "cannot read", ".clipsearchignore")
        ignore.chmod(0o644)
    assert main([*args, "--exclude", "!"]) == 1
    assert_one_line_error(1, capsys.readouterr().err, "exclude pattern '!'")
    assert (out / "manifest.json").read_bytes() == before and _paths(out) == KEPT


def test_everything_excluded_is_no_images_and_the_index_stays(tmp_path: Path, tiny_model: Path) -> None:
    photos, out = _tree(tmp_path / "p"), tmp_path / "idx"
    _build(photos, out, tiny_model)
    with pytest.raises(PhotosDirError, match="hidden files and caches are left out"):
        _build(photos, out, tiny_model, exclude=("*.jpg",))
    assert _paths(out) == KEPT


def test_flags_make_the_walk_options() -> None:
    from clipsearch.cli import build_parser
    from clipsearch.cli.options import values_from_args
    from indexer.build_config import BuildConfig

    def config(*flags: str) -> BuildConfig:
        return BuildConfig(**values_from_args(BuildConfig, build_parser().parse_args(["index", "p", "i", *flags])))

    # Not given: None, which keeps what the index recorded.
    assert (config().include_hidden, config().exclude) == (None, None)
    given = config("--include-hidden", "--exclude", "a/", "--exclude", "*.png")
    assert (given.include_hidden, given.exclude) == (True, ("a/", "*.png"))
    assert config("--no-include-hidden").include_hidden is False
    assert config("--exclude", "").exclude == ("",)
