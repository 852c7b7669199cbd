"""The query layer (retrieval.encoders.query) asks its encoders what they run, through the
capabilities of retrieval.encoders.base, instead of telling encoder types apart: fakes that
declare those capabilities, and are none of the real types, get the text path, the image
vectors and the image path they declare, and an update shares the tower they stand for."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from retrieval.encoders import chooser as CH
from retrieval.encoders import query as Q
from retrieval.encoders.text_choice import TextPath
from retrieval.images import PreprocessConfig
from retrieval.layout import FaissRef, Manifest, PartRef

FINGERPRINT = "ab" * 32
DIM = 4


def _manifest(generation: str = "0123456789abcdef") -> Manifest:
    return Manifest(
        model="/models/tiny-clip",
        model_fingerprint=FINGERPRINT,
        backend="hf",
        dim=DIM,
        count=1,
        skipped=0,
        preprocess={"shortest_edge": 64, "crop_size": [64, 64], "resample": "bicubic", "jpeg_draft": False},
        index_type="Flat",
        generation=generation,
        source_root="/photos",
        created="2024-01-02T03:04:05Z",
        tool_version="0.1.0",
        parts=(PartRef(f"gen-{generation}/embeddings/part-00000.parquet", 1, 0, "a" * 32),),
        faiss=FaissRef(f"gen-{generation}/index.faiss", 1),
        skipped_file=f"gen-{generation}/skipped.parquet",
        model_info={"precision": "fp32", "image_runtime": "openvino"},
    )


class _Model:
    """What the query layer checks against the index: the same model as the manifest's."""

    name = "/models/tiny-clip"
    backend = "hf"
    dim = DIM
    fingerprint = FINGERPRINT
    family_name = None


class _ImageTower(_Model):
    """An image tower of its own, as the recorded one is, declaring its path."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, PreprocessConfig, bool]] = []

    def embed_image(self, source: Any, cfg: PreprocessConfig, draft: bool = True) -> np.ndarray:
        self.calls.append((source, cfg, draft))
        return np.full((1, DIM), 0.5, dtype=np.float32)

    def image_query_path(self) -> dict[str, str | None]:
        return {"tower": "recorded", "runtime": "fake-runtime", "reason": "a fake tower"}


class _FullEncoder(_ImageTower):
    """A full encoder: its path's reason is the caller's (why the recorded tower was not reopened)."""

    max_text_length = 77
    query_languages: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self.image_precision = SimpleNamespace(set=lambda mode: None)

    def follow_image_runtime(self, recorded: str | None, precision: str | None = None) -> None:
        pass

    def image_query_path(self) -> dict[str, str | None]:
        return {"tower": "encoder", "runtime": "fake-torch", "reason": None}

    def loaded_path(self) -> TextPath | None:
        return None


class _TextEncoder(_Model):
    """A text encoder that knows the path it runs."""

    max_text_length = 77
    query_languages: tuple[str, ...] = ()

    def loaded_path(self) -> TextPath:
        return TextPath("onnxruntime", "a fake text tower, loaded")


class _TextLoader:
    """Stands for the numpy text tower's loader; what it loads is not of its type."""

    @staticmethod
    def load(model: str, **kwargs: Any) -> _TextEncoder:
        return _TextEncoder()


def _no_full_encoder(name: str, device: str) -> Any:
    raise AssertionError("the full encoder was loaded")


def test_image_queries_run_on_what_the_tower_declares(monkeypatch: pytest.MonkeyPatch) -> None:
    tower = _ImageTower()
    monkeypatch.setattr(Q, "open_recorded", lambda manifest, model, device: tower)
    manifest = _manifest()
    queries = Q.QueryEncoders(manifest, device="cpu", encoder_factory=_no_full_encoder)
    assert queries.image_path() == {"tower": None, "runtime": None, "reason": None}
    vector = queries.embed_image("photo.jpg")
    assert np.array_equal(vector, np.full((1, DIM), 0.5, dtype=np.float32))
    assert tower.calls == [("photo.jpg", PreprocessConfig.from_dict(manifest.preprocess), False)]
    assert queries.image_path() == {"tower": "recorded", "runtime": "fake-runtime", "reason": "a fake tower"}
    assert queries.image_encoder is tower and queries.loaded_encoder is None
    # A later generation with the same tower shares it: its first image query loads nothing.
    later = queries.following(_manifest("fedcba9876543210"))
    assert later.image_path()["tower"] == "recorded" and later.image_encoder is tower


def test_the_full_encoder_reports_why_the_recorded_tower_was_not_reopened(monkeypatch: pytest.MonkeyPatch) -> None:
    full = _FullEncoder()
    monkeypatch.setattr(Q, "open_recorded", lambda manifest, model, device: "no remembered checks here")
    queries = Q.QueryEncoders(_manifest(), device="cpu", encoder_factory=lambda name, device: full)
    queries.embed_image(b"jpeg bytes")
    assert [call[0] for call in full.calls] == [b"jpeg bytes"]
    assert queries.image_path() == {"tower": "encoder", "runtime": "fake-torch", "reason": "no remembered checks here"}
    # Not a tower of its own: a later generation reaches it through the full encoder, after
    # deciding afresh whether the recorded tower reopens.
    later = queries.following(_manifest("fedcba9876543210"))
    assert later.image_path()["tower"] is None and later.loaded_encoder is full


def test_text_queries_report_the_path_their_encoder_declares(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (CH.TEXT_RUNTIME_ENV, CH.TEXT_PATH_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(Q, "NumpyTextEncoder", _TextLoader)
    queries = Q.QueryEncoders(_manifest(), device="cpu", encoder_factory=_no_full_encoder)
    assert isinstance(queries.text_encoder, _TextEncoder)
    assert queries.text_path() == TextPath("onnxruntime", "a fake text tower, loaded")
