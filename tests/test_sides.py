"""The side-stage interface (:mod:`indexer.sides`): a third stage plugs into a build through the
registry alone, and is asked what :mod:`indexer.sides.contract` says, in that order.

The probe stage below writes no file and records every call; the builds are a few tiny images
with the tiny random checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from indexer import build_index
from indexer.build_config import BuildConfig
from indexer.dataset import Item
from indexer.sides import registry
from indexer.sides.contract import SideRun, SideStats
from retrieval.errors import EngineError
from retrieval.layout import Manifest, read_manifest


@dataclass
class ProbeWriter:
    log: list[tuple[Any, ...]]

    def rows_renumbered(self, first: int) -> None:
        self.log.append(("renumbered", first))

    def rows_rewritten(self, first: int) -> None:
        self.log.append(("rewritten", first))

    def row_columns(self, setting: Any) -> dict[str, Any]:
        return {}

    def write(self, staging: Path, gen_rel: str, count: int, sources: Sequence[pa.Table | Path], setting: Any) -> None:
        self.log.append(("write", count, setting))

    def committed(self, entry: Any, index_dir: Path, count: int) -> None:
        self.log.append(("committed", count))


@dataclass(frozen=True)
class ProbeStage:
    log: list[tuple[Any, ...]] = field(default_factory=list)
    done: list[bool] = field(default_factory=lambda: [False])  # what complete() answers
    fail: str = ""  # check() raises this
    name: str = "probe"

    def check(self, cfg: BuildConfig) -> None:
        self.log.append(("check",))
        if self.fail:
            raise EngineError(self.fail)

    def setting(self, cfg: BuildConfig, previous: Manifest | None) -> Any:
        self.log.append(("setting", previous is not None))
        return "on"

    def decode_options(self, setting: Any) -> dict[str, Any]:
        return {}

    def embedded(self, items: Iterable[Item]) -> dict[str, int]:
        n = len(list(items))
        self.log.append(("embedded", n))
        return {"rows": n}

    def side_writer(self, index_dir: Path, base: Manifest | None) -> ProbeWriter:
        self.log.append(("side_writer", base is not None))
        return ProbeWriter(self.log)

    def complete(self, previous: Manifest, setting: Any) -> bool:
        return self.done[0]

    def before_embedding(self, run: SideRun) -> SideStats:
        self.log.append(("before", run.writer.count, run.recorded))
        return SideStats({"before": 1})

    def after_embedding(self, run: SideRun) -> SideStats:
        self.log.append(("after", run.writer.count, run.writer.tail_pending))
        return SideStats({"after": 1})

    def report(self, stats: SideStats, current: Manifest | None) -> dict[str, Any]:
        self.log.append(("report", dict(stats.counts), stats.seconds >= 0, current is not None))
        return {}


def _photos(folder: Path, n: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (48, 48, 3), dtype=np.uint8)).save(folder / f"p{i}.png")
    return folder


def _build(photos: Path, out: Path, model: Path) -> None:
    build_index(photos, out, model=str(model), batch_size=4, workers=0, device="cpu", precision="fp32", progress=False)


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> ProbeStage:
    stage = ProbeStage()
    monkeypatch.setattr(registry, "SIDE_STAGES", (*registry.SIDE_STAGES, stage))
    return stage


def test_a_third_stage_plugs_in_through_the_registry(tmp_path: Path, tiny_model: Path, probe: ProbeStage) -> None:
    photos, out = _photos(tmp_path / "photos", 3), tmp_path / "idx"
    _build(photos, out, tiny_model)
    # Asked in the contract's order: check, setting, its writer, before the embedding (nothing
    # committed yet), the rows embedded, after them (still queued for the final commit), that commit,
    # the report.
    assert probe.log == [
        ("check",), ("setting", False), ("side_writer", False), ("before", 0, False), ("embedded", 3),
        ("after", 3, True), ("write", 3, "on"), ("committed", 3),
        ("report", {"before": 1, "rows": 3, "after": 1}, True, True),
    ]
    m = read_manifest(out)
    assert m.count == 3 and m.keywords is not None  # the other stages ran beside it
    assert read_manifest(out).generation == m.generation

    # Rows dropped by an update: the stage's writer is told from which id they moved.
    probe.log.clear()
    (photos / "p0.png").unlink()
    _build(photos, out, tiny_model)
    assert ("setting", True) in probe.log and ("side_writer", True) in probe.log
    assert ("renumbered", 0) in probe.log and ("write", 2, "on") in probe.log
    assert read_manifest(out).count == 2


def test_a_stage_not_complete_gets_a_generation_and_a_complete_one_none(
    tmp_path: Path, tiny_model: Path, probe: ProbeStage,
) -> None:
    photos, out = _photos(tmp_path / "photos", 2), tmp_path / "idx"
    _build(photos, out, tiny_model)
    first = read_manifest(out).generation
    _build(photos, out, tiny_model)  # nothing changed, but the stage says it has work left
    second = read_manifest(out).generation
    assert second != first
    probe.done[0] = True
    probe.log.clear()
    _build(photos, out, tiny_model)
    assert read_manifest(out).generation == second  # up to date: no generation written
    assert ("before", 2, True) in probe.log  # told the previous generation is complete for it
    assert not [entry for entry in probe.log if entry[0] == "write"]


def test_a_failed_check_stops_the_build_before_any_work(tmp_path: Path, tiny_model: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    stage = ProbeStage(fail="the probe engine is missing: pip install 'clipsearch[probe]'")
    monkeypatch.setattr(registry, "SIDE_STAGES", (*registry.SIDE_STAGES, stage))
    photos, out = _photos(tmp_path / "photos", 1), tmp_path / "idx"
    with pytest.raises(EngineError, match=r"clipsearch\[probe\]"):
        _build(photos, out, tiny_model)
    assert stage.log == [("check",)] and not out.exists()
