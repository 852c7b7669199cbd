"""retrieval.faults: which arrival a spec selects, the pause handshake, mistakes caught early."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from retrieval import faults
from retrieval.faults import ENV, PAUSE_DIR_ENV, PAUSE_ENV, PAUSE_TIMEOUT_ENV, crash_point


@pytest.fixture(autouse=True)
def fresh_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faults, "_counts", {})
    for name in (ENV, PAUSE_ENV, PAUSE_DIR_ENV, PAUSE_TIMEOUT_ENV):
        monkeypatch.delenv(name, raising=False)


def test_unset_does_nothing_even_for_unknown_points() -> None:
    crash_point("no-such-point")
    assert faults._counts == {}


def test_selects_the_nth_arrival_or_every_one() -> None:
    sel = faults._selects
    assert [sel("commit:3", "commit", k, every=False) for k in (1, 2, 3, 4)] == [False, False, True, False]
    assert [sel("commit", "commit", k, every=False) for k in (1, 2)] == [True, False]
    assert [sel("commit", "commit", k, every=True) for k in (1, 2)] == [True, True]
    assert sel("locked, commit:2", "commit", 2, every=True) and not sel("locked,commit:2", "commit", 1, every=True)
    assert not sel("publish:1", "commit", 1, every=False)


def test_unknown_names_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "comit:1")
    with pytest.raises(ValueError, match="unknown fault point 'comit'"):
        crash_point("commit")
    with pytest.raises(ValueError, match="add it to retrieval.faults.POINTS"):
        crash_point("not-a-point")


def test_pause_holds_the_nth_arrival_until_released(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PAUSE_ENV, "commit:2")
    monkeypatch.setenv(PAUSE_DIR_ENV, str(tmp_path))
    crash_point("commit")  # the first arrival passes
    assert list(tmp_path.iterdir()) == []
    worker = threading.Thread(target=crash_point, args=("commit",))
    worker.start()
    reached = tmp_path / "commit-2.reached"
    while not reached.exists():  # no timing: the thread is held until go exists
        assert worker.is_alive()
        worker.join(0.005)
    assert worker.is_alive() and int(reached.read_text()) > 0
    (tmp_path / "commit-2.go").touch()
    worker.join(60)
    assert not worker.is_alive()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["commit-2.go", "commit-2.reached"]


def test_a_pause_nobody_releases_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PAUSE_ENV, "locked")
    monkeypatch.setenv(PAUSE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(PAUSE_TIMEOUT_ENV, "0")
    with pytest.raises(TimeoutError, match="locked"):
        crash_point("locked")

