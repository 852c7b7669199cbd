"""``build_index``'s options: one ``BuildConfig``, overridden by keyword, unknown names refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from indexer.build import BuildConfig, build_index
from retrieval.errors import InvalidArgumentError, PhotosDirError, UnknownBuildOptionError


def test_replace_validates_like_a_new_config() -> None:
    cfg = BuildConfig(model="m").replace(batch_size=8, draft=False, commit_seconds=5.0)
    assert (cfg.model, cfg.batch_size, cfg.draft, cfg.commit_seconds) == ("m", 8, False, 5.0)
    with pytest.raises(InvalidArgumentError, match="batch size"):
        cfg.replace(batch_size=0)


def test_unknown_option_is_named_with_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(UnknownBuildOptionError, match="'batch_sise'.*batch_size") as info:
        build_index(tmp_path, tmp_path / "idx", batch_sise=8)
    assert isinstance(info.value, TypeError) and info.value.option == "batch_sise"
    assert "commit_seconds" in info.value.valid


def test_options_are_checked_before_the_photos(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="memory"):
        build_index(tmp_path / "missing", tmp_path / "idx", BuildConfig(), max_memory="lots")
    with pytest.raises(InvalidArgumentError, match="twice"):
        build_index(tmp_path / "missing", tmp_path / "idx", "a-model", model="b-model")
    # A model name as the third argument still works (the signature before BuildConfig).
    with pytest.raises(PhotosDirError):
        build_index(tmp_path / "missing", tmp_path / "idx", "a-model", max_memory="4GB")
