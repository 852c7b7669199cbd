"""Tests of the on-disk index contract in ``retrieval/layout.py``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from retrieval.errors import IndexFormatError, NotAnIndexError, UnsupportedFormatError
from retrieval.layout import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_FILE,
    FaissRef,
    Manifest,
    PartRef,
    atomic_write,
    display_path,
    embeddings_schema,
    is_index_dir,
    read_manifest,
    write_manifest,
)


def _manifest(**overrides: Any) -> Manifest:
    fields: dict[str, Any] = dict(
        model="/models/tiny-clip",
        model_fingerprint="ab" * 32,
        backend="hf",
        dim=48,
        count=12,
        skipped=3,
        preprocess={"shortest_edge": 64, "crop_size": [64, 64], "resample": "bicubic"},
        index_type="Flat",
        generation="0123456789abcdef",
        source_root="/photos",
        created="2024-01-02T03:04:05Z",
        tool_version="0.1.0",
        parts=(
            PartRef("gen-0123456789abcdef/embeddings/part-00000.parquet", 5, 0, "a" * 32),
            PartRef("gen-0123456789abcdef/embeddings/part-00001.parquet", 7, 5, "b" * 32),
        ),
        faiss=FaissRef("gen-0123456789abcdef/index.faiss", 5),
        skipped_file="gen-0123456789abcdef/skipped.parquet",
    )
    fields.update(overrides)
    return Manifest(**fields)


def _write_json(index_dir: Path, data: Any) -> None:
    index_dir.mkdir(parents=True, exist_ok=True)
    (index_dir / MANIFEST_FILE).write_text(json.dumps(data), encoding="utf-8")


# ---------------------------------------------------------------- Manifest


def test_manifest_dict_round_trip() -> None:
    m = _manifest()
    data = m.to_dict()
    assert data["format"] == FORMAT_NAME
    assert data["format_version"] == FORMAT_VERSION
    assert data["metric"] == "inner_product"
    assert Manifest.from_dict(data) == m
    # Through JSON as well (what is on disk).
    assert Manifest.from_dict(json.loads(json.dumps(data))) == m


def test_manifest_write_read_round_trip(tmp_path: Path) -> None:
    m = _manifest()
    write_manifest(tmp_path, m)
    assert is_index_dir(tmp_path)
    assert read_manifest(tmp_path) == m
    # No temp files left behind.
    assert sorted(os.listdir(tmp_path)) == [MANIFEST_FILE]


def test_manifest_ignores_unknown_keys(tmp_path: Path) -> None:
    data = _manifest().to_dict()
    data["some_future_optional_field"] = 1
    _write_json(tmp_path, data)
    assert read_manifest(tmp_path) == _manifest()


def test_manifest_validation() -> None:
    with pytest.raises(ValueError):
        _manifest(dim=0)
    with pytest.raises(ValueError):
        _manifest(count=-1)
    with pytest.raises(ValueError):
        _manifest(metric="l2")


# ---------------------------------------------------------------- read_manifest errors


def test_read_manifest_missing_dir(tmp_path: Path) -> None:
    with pytest.raises(NotAnIndexError):
        read_manifest(tmp_path / "nope")
    assert not is_index_dir(tmp_path / "nope")


def test_read_manifest_dir_without_manifest(tmp_path: Path) -> None:
    (tmp_path / "other.txt").write_text("x")
    with pytest.raises(NotAnIndexError):
        read_manifest(tmp_path)
    assert not is_index_dir(tmp_path)


def test_read_manifest_on_a_file(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(NotAnIndexError):
        read_manifest(f)


def test_read_manifest_invalid_json(tmp_path: Path) -> None:
    (tmp_path / MANIFEST_FILE).write_text("{not json", encoding="utf-8")
    with pytest.raises(IndexFormatError) as exc:
        read_manifest(tmp_path)
    assert not isinstance(exc.value, UnsupportedFormatError)


def test_read_manifest_invalid_utf8(tmp_path: Path) -> None:
    (tmp_path / MANIFEST_FILE).write_bytes(b'{"format": "\xff"}')
    with pytest.raises(IndexFormatError):
        read_manifest(tmp_path)


def test_read_manifest_json_list(tmp_path: Path) -> None:
    _write_json(tmp_path, [_manifest().to_dict()])
    with pytest.raises(IndexFormatError):
        read_manifest(tmp_path)


def test_read_manifest_newer_version(tmp_path: Path) -> None:
    data = _manifest().to_dict()
    data["format_version"] = FORMAT_VERSION + 1
    _write_json(tmp_path, data)
    with pytest.raises(UnsupportedFormatError) as exc:
        read_manifest(tmp_path)
    assert isinstance(exc.value, IndexFormatError)
    msg = str(exc.value)
    assert "newer" in msg
    assert "upgrade" in msg


@pytest.mark.parametrize("version", [0, -1, "1", 1.0, None])
def test_read_manifest_bad_version(tmp_path: Path, version: Any) -> None:
    data = _manifest().to_dict()
    data["format_version"] = version
    _write_json(tmp_path, data)
    with pytest.raises(IndexFormatError):
        read_manifest(tmp_path)


@pytest.mark.parametrize("fmt", ["something-else", None, ""])
def test_read_manifest_wrong_format(tmp_path: Path, fmt: Any) -> None:
    data = _manifest().to_dict()
    data["format"] = fmt
    _write_json(tmp_path, data)
    with pytest.raises(IndexFormatError) as exc:
        read_manifest(tmp_path)
    assert not isinstance(exc.value, UnsupportedFormatError)


@pytest.mark.parametrize("missing", ["model", "dim", "count", "generation", "preprocess"])
def test_read_manifest_missing_field(tmp_path: Path, missing: str) -> None:
    data = _manifest().to_dict()
    del data[missing]
    _write_json(tmp_path, data)
    with pytest.raises(IndexFormatError):
        read_manifest(tmp_path)


def test_read_manifest_invalid_value(tmp_path: Path) -> None:
    data = _manifest().to_dict()
    data["dim"] = 0
    _write_json(tmp_path, data)
    with pytest.raises(IndexFormatError):
        read_manifest(tmp_path)


# ---------------------------------------------------------------- atomic_write


def test_atomic_write_replaces_content(tmp_path: Path) -> None:
    target = tmp_path / "data.bin"
    target.write_bytes(b"old")
    atomic_write(target, lambda fh: fh.write(b"new content"))
    assert target.read_bytes() == b"new content"
    assert sorted(os.listdir(tmp_path)) == ["data.bin"]


def test_atomic_write_creates_new_file(tmp_path: Path) -> None:
    target = tmp_path / "fresh.bin"
    atomic_write(target, lambda fh: fh.write(b"abc"))
    assert target.read_bytes() == b"abc"
    assert sorted(os.listdir(tmp_path)) == ["fresh.bin"]


class _Boom(Exception):
    pass


@pytest.mark.parametrize("exc_type", [_Boom, KeyboardInterrupt])
def test_atomic_write_failure_keeps_previous(tmp_path: Path, exc_type: type[BaseException]) -> None:
    target = tmp_path / "data.bin"
    target.write_bytes(b"previous")

    def write(fh: Any) -> None:
        fh.write(b"partial garbage")
        raise exc_type("fail")

    with pytest.raises(exc_type):
        atomic_write(target, write)
    assert target.read_bytes() == b"previous"
    assert sorted(os.listdir(tmp_path)) == ["data.bin"]


def test_atomic_write_failure_without_previous(tmp_path: Path) -> None:
    target = tmp_path / "data.bin"

    def write(fh: Any) -> None:
        raise _Boom()

    with pytest.raises(_Boom):
        atomic_write(target, write)
    assert os.listdir(tmp_path) == []


def test_write_manifest_failure_keeps_previous(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = _manifest(skipped=1)
    write_manifest(tmp_path, old)

    def fail_replace(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail_replace)
    with pytest.raises(OSError):
        write_manifest(tmp_path, _manifest(skipped=2))
    monkeypatch.undo()
    assert read_manifest(tmp_path) == old
    assert sorted(os.listdir(tmp_path)) == [MANIFEST_FILE]


# ---------------------------------------------------------------- schema / display_path


def test_embeddings_schema() -> None:
    schema = embeddings_schema(48)
    emb = schema.field("embedding").type
    assert pa.types.is_fixed_size_list(emb)
    assert emb.list_size == 48
    assert emb.value_type == pa.float32()
    assert emb == pa.list_(pa.float32(), 48)
    assert schema.field("id").type == pa.int64()
    assert schema.field("path").type == pa.string()
    assert schema.field("path_bytes").type == pa.binary()
    assert schema.field("width").type == pa.int32()
    assert schema.field("height").type == pa.int32()
    # Every column is required except the photo, text, shard and video columns, added later as nullable ones.
    from retrieval.layout import PHOTO_COLUMNS, SAMPLE_COLUMNS, TEXT_COLUMNS, VIDEO_COLUMNS

    optional = {f.name for f in (*PHOTO_COLUMNS, *TEXT_COLUMNS, *SAMPLE_COLUMNS, *VIDEO_COLUMNS)}
    assert all(f.nullable == (f.name in optional) for f in schema)


@pytest.mark.parametrize("dim", [0, -3])
def test_embeddings_schema_bad_dim(dim: int) -> None:
    with pytest.raises(ValueError):
        embeddings_schema(dim)


def test_display_path() -> None:
    assert display_path(b"caf\xe9.jpg") == "caf\\xe9.jpg"
    assert display_path("dir/日本語 café 🐱.png".encode()) == "dir/日本語 café 🐱.png"
    assert display_path(b"plain/a.jpg") == "plain/a.jpg"
    # Always valid UTF-8 (no surrogates), so it can go into a Parquet string column.
    display_path(b"\xff\xfe/x.jpg").encode("utf-8")


# ---------------------------------------------------------------- parts and faiss references


@pytest.mark.parametrize(
    "overrides",
    [
        {"count": 13},  # parts hold 12 rows
        {"parts": (PartRef("gen-x/embeddings/part-00000.parquet", 5, 1, "a" * 32),)},  # must start at id 0
        {"faiss": FaissRef("gen-x/index.faiss", 13)},  # more rows than the index
        {"skipped_file": "../skipped.parquet"},
        {"skipped_file": "/etc/passwd"},
    ],
)
def test_manifest_rejects_inconsistent_references(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        _manifest(**overrides)


def test_part_and_faiss_refs_validate() -> None:
    with pytest.raises(ValueError):
        PartRef("gen-x/embeddings/part-00000.parquet", 0, 0, "a")
    with pytest.raises(ValueError):
        PartRef("gen-x/../../x.parquet", 1, 0, "a")
    with pytest.raises(ValueError):
        FaissRef("gen-x/index.faiss", -1)
    assert _manifest(faiss=None).to_dict()["faiss"] is None
    assert Manifest.from_dict(_manifest(faiss=None).to_dict()) == _manifest(faiss=None)
