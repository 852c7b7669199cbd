"""Watch mode: changes reach the index within seconds, files being written wait, excluded files
are ignored; SIGTERM commits and exits 0, ``kill -9`` leaves an index the next run resumes, a
deleted folder is a one-line error with the index whole.

Short settle times keep these fast; every wait polls the index on disk and has a safety timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import clipsearch_exe
from helpers import assert_one_line_error
from imagegen import write_photos

from clipsearch.cli import main
from indexer import BuildReport, WatchConfig, watch_index
from retrieval import ImageIndex
from retrieval.errors import InvalidArgumentError, PhotosDirError
from retrieval.faults import ENV as CRASH_ENV
from retrieval.layout import read_manifest

SAFETY = 90.0  # seconds: a net against a hung test, never a timing


def wait_for(condition: Callable[[], bool], what: str, alive: Callable[[], bool] = lambda: True) -> None:
    deadline = time.monotonic() + SAFETY
    while not condition():
        if not alive():
            raise AssertionError(f"stopped before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"never got to {what}")
        time.sleep(0.1)


_seen: dict[Path, tuple[tuple[int, int], set[str]]] = {}


def paths(index_dir: Path) -> set[str]:
    """The paths the index holds now; opened again only when its manifest was replaced (polling
    must not take the CPU from the process under test)."""
    try:
        st = (index_dir / "manifest.json").stat()
    except FileNotFoundError:
        return set()
    key = (st.st_ino, st.st_mtime_ns)
    if index_dir in _seen and _seen[index_dir][0] == key:
        return _seen[index_dir][1]
    for _ in range(5):
        try:
            found = set(ImageIndex.open(index_dir).metadata.paths())
            break
        except FileNotFoundError:
            time.sleep(0.05)  # a generation replaced while opening: read the next one
    else:
        found = set(ImageIndex.open(index_dir).metadata.paths())
    _seen[index_dir] = (key, found)
    return found


class Watching:
    """``watch_index`` in a thread, with what each update committed."""

    def __init__(self, photos: Path, out: Path, model: Path, watch: WatchConfig, **kw: Any) -> None:
        self.stop = threading.Event()
        self.states: list[tuple[BuildReport, dict[str, int], set[str]]] = []
        self.error: BaseException | None = None
        self.result: Any = None
        self.out = out

        def record(report: BuildReport) -> None:
            index = ImageIndex.open(out)
            rows = index.rows(range(len(index)), columns=("path", "size"))
            skipped = {s.path for s in index.metadata.skipped()}
            self.states.append((report, {r["path"]: r["size"] for r in rows}, skipped))

        def run() -> None:
            try:
                self.result = watch_index(photos, out, str(model), watch, stop=self.stop, on_update=record,
                                          device="cpu", precision="fp32", batch_size=8, **kw)
            except BaseException as exc:  # handed to the test thread
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def holds(self, *names: str, without: tuple[str, ...] = ()) -> Callable[[], bool]:
        return lambda: bool(self.states) and set(names) <= set(self.states[-1][1]) and not set(without) & set(self.states[-1][1])

    def finish(self) -> Any:
        self.stop.set()
        self.thread.join(SAFETY)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error
        return self.result


def test_files_being_written_wait_and_excluded_files_are_ignored(tmp_path: Path, tiny_model: Path) -> None:
    photos, out = write_photos(tmp_path / "p", 2), tmp_path / "idx"
    # Writes 0.2 s apart: far inside the settle time even on a loaded machine.
    w = Watching(photos, out, tiny_model, WatchConfig(settle=1.0, rescan=60))
    wait_for(w.holds("img_000.jpg", "img_001.jpg"), "the first update", w.alive)
    # Hidden files and caches are no change to the index.
    write_photos(photos, 1, 5, name=".hidden_{:03d}.jpg")
    write_photos(photos / "@eaDir", 1, 6)
    # A file written slowly: its size and mtime change for longer than the settle time.
    data = (write_photos(tmp_path / "src", 1, 7) / "img_007.jpg").read_bytes()
    with open(photos / "slow.jpg", "wb") as fh:
        for i in range(0, len(data), len(data) // 8):
            fh.write(data[i : i + len(data) // 8])
            fh.flush()
            time.sleep(0.2)
    wait_for(w.holds("slow.jpg"), "the slow file indexed", w.alive)
    for _, rows, skipped in w.states:
        assert rows.get("slow.jpg", len(data)) == len(data), "indexed half-written"
        assert "slow.jpg" not in skipped
        assert not {".hidden_005.jpg", "@eaDir/img_006.jpg"} & set(rows)
    # Changing .clipsearchignore is a change: what it now excludes leaves.
    (photos / ".clipsearchignore").write_text("slow.jpg\n", encoding="utf-8")
    wait_for(w.holds("img_000.jpg", without=("slow.jpg",)), "the newly excluded file removed", w.alive)
    done = w.finish()
    assert done.events and done.updates == len(w.states) >= 3
    assert sum(r.added for r, _, _ in w.states) == 3 and not any(r.newly_skipped for r, _, _ in w.states)


def test_rescans_find_changes_without_events(tmp_path: Path, tiny_model: Path) -> None:
    photos, out = write_photos(tmp_path / "p", 2), tmp_path / "idx"
    w = Watching(photos, out, tiny_model, WatchConfig(settle=0.2, rescan=0.4, events=False))
    wait_for(w.holds("img_000.jpg", "img_001.jpg"), "the first update", w.alive)
    write_photos(photos / "new", 1, 3)
    (photos / "img_000.jpg").unlink()
    wait_for(w.holds("new/img_003.jpg", without=("img_000.jpg",)), "the rescan's update", w.alive)
    updates = len(w.states)
    time.sleep(1.0)  # rescans that find nothing new commit nothing
    done = w.finish()
    assert not done.events and done.updates == updates >= 2


def test_bad_watch_settings(tmp_path: Path, tiny_model: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="settle"):
        WatchConfig(settle=0)
    with pytest.raises(InvalidArgumentError, match="rescan"):
        WatchConfig(rescan=float("nan"))
    with pytest.raises(InvalidArgumentError, match="engine 'local'"):
        watch_index(tmp_path, tmp_path / "idx", str(tiny_model), engine="ray")
    with pytest.raises(PhotosDirError):
        watch_index(tmp_path / "missing", tmp_path / "idx", str(tiny_model))


# -- the CLI, in a subprocess ---------------------------------------------------------------------


class WatchCli:
    def __init__(self, photos: Path, out: Path, model: Path, tmp: Path, env: dict[str, str] | None = None) -> None:
        self.stdout, self.stderr = tmp / f"out-{time.monotonic_ns()}.txt", tmp / f"err-{time.monotonic_ns()}.txt"
        args = [clipsearch_exe(), "index", str(photos), str(out), "--model", str(model), "--device", "cpu", "--precision",
                "fp32", "--no-progress", "--json", "--watch", "--watch-settle", "0.3", "--watch-rescan", "30"]
        with open(self.stdout, "wb") as o, open(self.stderr, "wb") as e:
            self.proc = subprocess.Popen(args, stdout=o, stderr=e, env={**os.environ, **(env or {})})

    def alive(self) -> bool:
        return self.proc.poll() is None

    def finish(self) -> tuple[int, list[dict[str, Any]], str]:
        try:
            code = self.proc.wait(SAFETY)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        lines = [json.loads(line) for line in self.stdout.read_text().splitlines() if line.strip()]
        return code, lines, self.stderr.read_text()


def test_cli_follows_changes_and_sigterm_commits(tmp_path: Path, tiny_model: Path) -> None:
    photos, out = write_photos(tmp_path / "p", 3), tmp_path / "idx"
    cli = WatchCli(photos, out, tiny_model, tmp_path)
    wait_for(lambda: paths(out) == {"img_000.jpg", "img_001.jpg", "img_002.jpg"}, "the first update", cli.alive)
    write_photos(photos, 1, 3)  # added
    wait_for(lambda: "img_003.jpg" in paths(out), "the added file", cli.alive)
    assert "img_003.jpg" in {h.path for h in ImageIndex.open(out).search("a photo", k=10)}
    write_photos(photos, 1, 9, name="img_001.jpg")  # changed in place
    (photos / "sub").mkdir()
    (photos / "img_002.jpg").rename(photos / "sub" / "moved.jpg")  # moved
    wait_for(lambda: paths(out) == {"img_000.jpg", "img_001.jpg", "sub/moved.jpg", "img_003.jpg"}, "the move", cli.alive)
    (photos / "img_000.jpg").unlink()  # deleted
    wait_for(lambda: "img_000.jpg" not in paths(out), "the deletion", cli.alive)
    cli.proc.send_signal(signal.SIGTERM)
    code, updates, err = cli.finish()
    assert code == 0, err
    assert "stopped watching" in err and "Traceback" not in err
    assert sum(u["added"] for u in updates) == 5 and sum(u["updated"] for u in updates) == 1
    assert sum(u["removed"] for u in updates) == 2
    manifest = read_manifest(out)
    assert manifest.complete and paths(out) == {"img_001.jpg", "sub/moved.jpg", "img_003.jpg"}


def test_cli_killed_mid_update_resumes_then_folder_deleted_is_exit_1(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    photos, out = write_photos(tmp_path / "p", 2), tmp_path / "idx"
    # The first update after the initial build dies while staging its generation (kill -9).
    cli = WatchCli(photos, out, tiny_model, tmp_path, env={CRASH_ENV: "staged:2"})
    wait_for(lambda: paths(out) == {"img_000.jpg", "img_001.jpg"}, "the first update", cli.alive)
    write_photos(photos, 1, 2)
    code, _, _ = cli.finish()
    assert code == -signal.SIGKILL
    assert paths(out) == {"img_000.jpg", "img_001.jpg"}  # the last commit, whole
    # The next run resumes; this one (the CLI in this process, its signal handlers in this
    # thread) then sees its folder deleted: one line, exit 1, the index whole.
    resumed = threading.Event()

    def delete_when_resumed() -> None:
        wait_for(lambda: "img_002.jpg" in paths(out), "the resumed update")
        resumed.set()
        shutil.rmtree(photos)

    helper = threading.Thread(target=delete_when_resumed, daemon=True)
    helper.start()
    code = main(["index", str(photos), str(out), "--model", str(tiny_model), "--device", "cpu", "--precision", "fp32",
                 "--no-progress", "--watch", "--watch-settle", "0.3", "--watch-rescan", "30"])
    helper.join(SAFETY)
    assert resumed.is_set()
    assert_one_line_error(code, capsys.readouterr().err, "deleted or moved")
    assert paths(out) == {"img_000.jpg", "img_001.jpg", "img_002.jpg"} and read_manifest(out).complete


def test_watch_flags(capsys: pytest.CaptureFixture[str]) -> None:
    from clipsearch.cli import build_parser
    from clipsearch.cli.options import values_from_args

    args = build_parser().parse_args(["index", "p", "i", "--watch", "--watch-settle", "0.5", "--watch-no-events"])
    assert args.watch and WatchConfig(**values_from_args(WatchConfig, args)) == WatchConfig(settle=0.5, events=False)
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["index", "p", "i", "--watch", "--watch-rescan", "0"])
    assert exit_.value.code == 2 and "--watch-rescan" in capsys.readouterr().err
    assert main(["index", "p", "i", "--watch", "--files-from", "list.txt"]) == 1
    assert_one_line_error(1, capsys.readouterr().err, "--files-from")


def test_a_stopped_update_commits_what_it_embedded(tmp_path: Path, tiny_model: Path) -> None:
    from indexer.build import BuildConfig, build_index, load_model, update_index
    from indexer.discover import discover

    photos, out = write_photos(tmp_path / "p", 6), tmp_path / "idx"
    cfg = BuildConfig(model=str(tiny_model), device="cpu", precision="fp32", batch_size=2)
    asked: list[bool] = []

    def stop() -> bool:  # asked before each batch: the second one is not embedded
        asked.append(True)
        return len(asked) > 1

    report = update_index(photos, out, cfg, load_model(cfg), discover(photos), stop=stop)
    assert report.added == 2 and read_manifest(out).complete and len(paths(out)) == 2
    rest = build_index(photos, out, cfg)
    assert (rest.added, rest.unchanged) == (4, 2) and len(paths(out)) == 6
