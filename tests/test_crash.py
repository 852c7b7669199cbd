"""kill -9 of the real CLI at random points; the index must stay consistent and resume.

Each seed kills ``clipsearch index`` once, either at a random arrival at a named point of the
pipeline (through ``CLIPSEARCH_CRASH_AT``: decoding, embedding, after a generation is renamed
into place but before the manifest switches, after the switch, before the final FAISS write)
or after a random delay from outside. Then:

- whatever is on disk opens and searches, holding only rows of the clean build, no path twice;
- re-running the same command completes, embeds only what was not committed, and gives the
  same paths and embeddings as a clean build.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import clipsearch_exe, run_cli
from imagegen import photo_like
from indexer.faults import ENV, POINTS
from retrieval import ImageIndex
from retrieval.layout import is_index_dir

pytestmark = pytest.mark.slow

N_IMAGES = 24
SEEDS = range(8)


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("crash") / "photos"
    (root / "sub").mkdir(parents=True)
    for i in range(N_IMAGES):
        photo_like(96, 72, seed=i).save(root / ("sub" if i % 3 else "") / f"p{i:02d}.jpg", quality=90)
    (root / "broken.jpg").write_bytes(b"\xff\xd8 truncated")
    return root


def _index_cmd(photos: Path, out: Path, model: Path, workers: int) -> list[object]:
    return ["index", photos, out, "--model", model, "--batch-size", "2", "--commit-every", "4", "--workers", str(workers), "--no-progress", "--json"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory, photos: Path, tiny_model: Path) -> dict[str, np.ndarray]:
    out = tmp_path_factory.mktemp("clean") / "idx"
    proc = run_cli(_index_cmd(photos, out, tiny_model, 0))
    assert proc.returncode == 0, proc.stderr
    return _by_path(out)


def _by_path(index_dir: Path) -> dict[str, np.ndarray]:
    index = ImageIndex.open(index_dir, device="cpu")
    rows = index.rows(range(len(index)))
    assert [r["id"] for r in rows] == list(range(len(index)))
    paths = [r["path"] for r in rows]
    assert len(set(paths)) == len(paths), "a path is indexed twice"
    if len(index):
        assert len(index.search("anything", k=len(index))) == len(index)
    return dict(zip(paths, index.embeddings(), strict=True))


def _assert_subset_of(index: dict[str, np.ndarray], clean: dict[str, np.ndarray]) -> None:
    for path, vec in index.items():
        assert path in clean, path
        assert np.allclose(vec, clean[path], atol=1e-6), path


@pytest.mark.parametrize("seed", SEEDS)
def test_kill_and_resume(seed: int, tmp_path: Path, photos: Path, tiny_model: Path, clean: dict[str, np.ndarray]) -> None:
    rng = random.Random(seed)
    out = tmp_path / "idx"
    timed = seed % 4 == 3
    point = POINTS[(seed - seed // 4) % len(POINTS)]  # the untimed seeds take every point in turn
    # A crash point inside a decode worker would kill the worker, not the CLI: decode in-process.
    workers = 0 if point == "decode" and not timed else rng.choice([0, 1])
    cmd = _index_cmd(photos, out, tiny_model, workers)
    if timed:
        # From outside, after a random delay: anywhere from start-up to the final write.
        delay = rng.uniform(2.0, 7.0)
        where = f"timed:{delay:.1f}s"
        with subprocess.Popen([clipsearch_exe(), *map(os.fspath, cmd)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
    else:
        nth = rng.randint(1, {"decode": N_IMAGES, "embed": 12, "publish": 6, "commit": 6, "finish": 1}[point])
        where = f"{point}:{nth}"
        killed = run_cli(cmd, env={ENV: where})
        assert killed.returncode == -signal.SIGKILL, (where, killed.stderr)

    committed = 0
    if is_index_dir(out):
        state = _by_path(out)
        _assert_subset_of(state, clean)
        committed = len(state)

    proc = run_cli(cmd)
    assert proc.returncode == 0, (where, proc.stderr)
    report = json.loads(proc.stdout)
    # Committed images are not embedded again; only the rest is.
    assert report["embedded"] == len(clean) - committed, (where, report)
    final = _by_path(out)
    assert sorted(final) == sorted(clean), where
    _assert_subset_of(final, clean)
    assert json.loads((out / "manifest.json").read_text())["complete"]
    assert len([p for p in out.iterdir() if p.name.startswith(("gen-", ".staging-"))]) == 1
