"""Readers while a writer commits: every answer comes from exactly one generation, none fails.

A ``clipsearch index`` subprocess builds an index and then updates it (ids renumbered), pausing
after every manifest switch (``CLIPSEARCH_PAUSE_AT=commit``) until the test lets it go on. At
each pause the test opens the new generation and records its answer (the truth), and searches
every index it opened at earlier pauses, whose generation directories the writer has removed
by then. A reader thread opens and searches in a loop, free-running, and the writer is let go
only once it has searched the generation the writer paused at. Forced by construction as well:
a reader that has read the manifest of generation g but not yet opened
its files while the writer goes on to publish g+2 and remove g.

Each answer is the whole index (k = its row count) for one query vector, so it shows the
generation's ids, paths and scores; it must equal the truth of the generation the reader
opened.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from faultctl import SAFETY_TIMEOUT, Cli, Pauses
from imagegen import photo_like

from retrieval import ImageIndex, store
from retrieval.encoders import load_encoder
from retrieval.layout import GENERATION_PREFIX, Manifest

pytestmark = pytest.mark.slow

FIRST, ADDED = 12, 4  # images of the first build; added by the update (which also deletes p00)
COMMIT_EVERY = 4
READER_MAX_SEARCHES = 5000  # the free-running reader stops by itself after this many (a safety net)


@dataclass(frozen=True)
class Answer:
    generation: str
    hits: tuple[tuple[int, str], ...]
    scores: tuple[float, ...]


def _answer(index: ImageIndex, query: np.ndarray) -> Answer:
    (hits,) = index.search_vectors(query, k=len(index))
    return Answer(index.manifest.generation, tuple((h.id, h.path) for h in hits), tuple(h.score for h in hits))


def _assert_same(got: Answer, truth: Answer) -> None:
    assert got.generation == truth.generation
    assert got.hits == truth.hits, got.generation
    np.testing.assert_allclose(got.scores, truth.scores, rtol=1e-5, atol=1e-6)


class FreeReader(threading.Thread):
    """Opens the index and searches, again and again, until told to stop (or READER_MAX_SEARCHES)."""

    def __init__(self, directory: Path, open_index: Callable[[Path], ImageIndex], query: np.ndarray) -> None:
        super().__init__(name="free-reader", daemon=True)
        self.directory, self.open_index, self.query = directory, open_index, query
        self.answers: list[Answer] = []
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self._seen: set[str] = set()
        self._changed = threading.Condition()

    def wait_for(self, generation: str) -> bool:
        """Wait until this reader has opened and searched ``generation`` (False: it stopped first)."""
        with self._changed:
            return (
                self._changed.wait_for(lambda: generation in self._seen or not self.is_alive(), SAFETY_TIMEOUT)
                and generation in self._seen
            )

    def _record(self, answer: Answer) -> None:
        with self._changed:
            self.answers.append(answer)
            self._seen.add(answer.generation)
            self._changed.notify_all()

    def run(self) -> None:
        previous: ImageIndex | None = None
        deadline = time.monotonic() + SAFETY_TIMEOUT
        while not self.stop.is_set() and len(self.answers) < READER_MAX_SEARCHES and time.monotonic() < deadline:
            try:
                index = self.open_index(self.directory)
                self._record(_answer(index, self.query))
                if previous is not None:  # the one opened before keeps answering from its files
                    self._record(_answer(previous, self.query))
                previous = index
            except BaseException as exc:  # noqa: BLE001 - every failure is a finding, reported below
                self.errors.append(exc)
                with self._changed:
                    self._changed.notify_all()
                return
            time.sleep(0.01)  # leaves the writer some CPU; nothing depends on it


def test_readers_see_one_generation_while_a_writer_commits(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    photos, out = tmp_path / "photos", tmp_path / "idx"
    photos.mkdir()
    for i in range(FIRST):
        photo_like(64, 48, seed=200 + i).save(photos / f"p{i:02d}.jpg", quality=90)
    encoder = load_encoder(str(tiny_model), device="cpu", precision="fp32")
    query = encoder.embed_texts(["a photo of something"])

    def open_index(directory: Path) -> ImageIndex:
        return ImageIndex.open(directory, encoder=encoder)

    # The held opener stops between reading the manifest and opening the generation's files.
    real_open_parts = store.open_parts
    held_manifest: list[str] = []
    entered, go_on = threading.Event(), threading.Event()

    def gated_open_parts(index_dir: Path, manifest: Manifest) -> list[pq.ParquetFile]:
        if threading.current_thread().name == "held-opener" and not go_on.is_set():
            held_manifest.append(manifest.generation)
            entered.set()
            go_on.wait(SAFETY_TIMEOUT)
        return real_open_parts(index_dir, manifest)

    monkeypatch.setattr(store, "open_parts", gated_open_parts)
    held_result: list[ImageIndex | BaseException] = []

    def held_open() -> None:
        try:
            held_result.append(open_index(out))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            held_result.append(exc)

    truth: dict[str, Answer] = {}
    opened: list[ImageIndex] = []  # one per pause, searched again at every later pause
    answered_after_removal = 0
    reader = FreeReader(out, open_index, query)
    opener = threading.Thread(target=held_open, name="held-opener", daemon=True)
    cmd = ["index", photos, out, "--model", tiny_model, "--batch-size", "2", "--commit-every", str(COMMIT_EVERY),
           "--workers", "0", "--precision", "fp32", "--device", "cpu", "--no-progress", "--json"]  # fmt: skip

    def run_writer(name: str, expected_paths: list[list[str]], at_pause: Callable[[int, str], None]) -> None:
        nonlocal answered_after_removal
        pauses = Pauses(tmp_path / name)
        writer = Cli(cmd, env=pauses.env("commit"))
        try:
            for k, paths in enumerate(expected_paths, start=1):
                assert pauses.wait(writer, "commit", k) == writer.pid, writer.finish().stderr
                # Held right after the manifest switch: a new reader gets this generation.
                index = open_index(out)
                answer = _answer(index, query)
                assert sorted(p for _, p in answer.hits) == sorted(paths), (name, k)
                assert [i for i, _ in sorted(answer.hits)] == list(range(len(paths)))
                truth[answer.generation] = answer
                for old in opened:
                    answered_after_removal += not (out / (GENERATION_PREFIX + old.manifest.generation)).exists()
                    _assert_same(_answer(old, query), truth[old.manifest.generation])
                opened.append(index)
                at_pause(k, answer.generation)
                # The writer goes on only once the free reader has searched this generation too.
                assert reader.wait_for(answer.generation), reader.errors
                pauses.release("commit", k)
            assert pauses.wait(writer, "commit", len(expected_paths) + 1) is None, "more commits than expected"
        except BaseException:
            writer.proc.kill()  # held at a pause nobody will release: do not wait for its timeout
            writer.finish()
            raise
        done = writer.finish()
        assert done.returncode == 0, done.stderr

    first = [f"p{i:02d}.jpg" for i in range(FIRST)]
    generations: dict[int, str] = {}

    def during_build(k: int, generation: str) -> None:
        generations[k] = generation
        if k == 1:
            reader.start()
            opener.start()
            assert entered.wait(SAFETY_TIMEOUT) and held_manifest == [generation]
        if k == 3:
            # The writer has published generations 2 and 3 and removed 1 since the opener read
            # the manifest naming 1: it must open the current generation instead, or fail.
            assert not (out / (GENERATION_PREFIX + generations[1])).exists()
            go_on.set()
            opener.join(SAFETY_TIMEOUT)
            (result,) = held_result
            assert isinstance(result, ImageIndex), f"opening during a commit failed: {result!r}"
            _assert_same(_answer(result, query), truth[generation])

    # Chunk commits after 4, 8 and 12 images, then the final commit with the FAISS index.
    build = [first[: COMMIT_EVERY * k] for k in range(1, FIRST // COMMIT_EVERY + 1)] + [first]
    try:
        run_writer("build", build, during_build)

        # The update deletes p00 (every id moves down) and adds 4: one chunk commit, then the final one.
        (photos / "p00.jpg").unlink()
        for i in range(FIRST, FIRST + ADDED):
            photo_like(64, 48, seed=200 + i).save(photos / f"p{i:02d}.jpg", quality=90)
        updated = first[1:] + [f"p{i:02d}.jpg" for i in range(FIRST, FIRST + ADDED)]
        run_writer("update", [updated, updated], lambda k, g: None)
    finally:
        go_on.set()  # no thread stays blocked after a failure
        reader.stop.set()
    reader.join(SAFETY_TIMEOUT)
    assert not reader.is_alive()
    assert not reader.errors, reader.errors
    assert len(truth) == len(build) + 2
    # By construction: at pause k the readers opened at pauses up to k-2 had lost their directories.
    assert answered_after_removal >= len(build) - 2
    assert reader.answers
    for answer in reader.answers:
        assert answer.generation in truth, "an answer from a generation that was never committed"
        _assert_same(answer, truth[answer.generation])
