"""Shared fixtures: a tiny random CLIP checkpoint with the real tokenizer, image collections,
synthetic vector indexes (module-scoped: each test module builds its own).

Everything is built offline in temporary directories; nothing is downloaded.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from imagegen import Collection, make_collection  # noqa: E402

# The image-runtime tests' fixtures (photos, their pixels, the export cache, the batch check's refusals).
pytest_plugins = ["runtime_fixtures"]

if TYPE_CHECKING:
    import numpy as np

# Keep library threads modest: tests run on 2 cores beside DataLoader workers.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# ONNX exports of the fp32 image tower (retrieval.encoders.runtime) go to one directory per test
# session, shared with the CLI subprocesses: never the user's cache, and each model is exported once.
if "CLIPSEARCH_ONNX_CACHE" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["CLIPSEARCH_ONNX_CACHE"] = tempfile.mkdtemp(prefix="clipsearch-onnx-")
    atexit.register(shutil.rmtree, os.environ["CLIPSEARCH_ONNX_CACHE"], True)


# The slowest files' seconds in one full run (two workers, the AMX host, 2026-12-08), longest
# first. The Makefile's test command runs files in collection order (--no-loadscope-reorder), so
# each worker takes the longest file left: xdist's own order (most tests first) left a
# two-test Ray file to the end, run alone while the other worker idled. A figure gone stale
# only changes the order, never what runs.
SLOW_FILES: dict[str, int] = {
    "test_ray.py": 311, "test_benchmarks.py": 305, "test_crash.py": 260, "test_ray_parts.py": 175,
    "test_cli.py": 158, "test_video_ray.py": 138, "test_browser.py": 105, "test_cluster.py": 97,
    "test_people_ui.py": 66, "test_docs_samples.py": 65, "test_shards_s3.py": 55, "test_server.py": 46,
    "test_siglip_cli.py": 45, "test_watch.py": 34, "test_text_backfill.py": 33, "test_workers.py": 31,
    "test_open_by_plan.py": 30, "test_finetune.py": 30, "test_concurrency.py": 29, "test_faces_index.py": 26,
    "test_numpy_text.py": 26, "test_openclip.py": 25, "test_multilingual_ui.py": 22, "test_siglip_ui.py": 22,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slowest files first (:data:`SLOW_FILES`); a file's tests keep their order (the sort is stable)."""
    items.sort(key=lambda item: -SLOW_FILES.get(item.path.name, 0))


def pytest_report_header(config: pytest.Config) -> str:
    """The CPU level the suite acts on: tests adapt to it (or skip, saying why), and
    ``CLIPSEARCH_CPU_CAP`` / ``ONEDNN_MAX_CPU_ISA`` lower it to run the suite as on a smaller CPU."""
    from retrieval.encoders import cpu

    facts = cpu.describe()
    caps = ", ".join(f"{k}={v}" for k, v in facts.items() if k not in ("detected", "level"))
    return f"clipsearch CPU level: {facts['level']} (detected {facts['detected']}{'; ' + caps if caps else ''})"


@pytest.fixture(autouse=True)
def _gate_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test remembers ``auto``'s text gate in its own file (subprocesses inherit it): no
    test reads an outcome another one recorded, nor the user's cache. Outside ``tmp_path``, which
    some tests expect to hold only what they wrote."""
    monkeypatch.setenv("CLIPSEARCH_GATE_CACHE", str(tmp_path_factory.mktemp("gate-cache") / "text-precision.json"))


@pytest.fixture(autouse=True)
def _runtime_checks(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test remembers the image runtimes' checks in its own file (subprocesses inherit it):
    an image query reopens a recorded tower (retrieval.encoders.recorded_tower) only where the
    same test checked it, whatever ran before."""
    monkeypatch.setenv("CLIPSEARCH_RUNTIME_CHECKS", str(tmp_path_factory.mktemp("runtime-checks") / "checks.json"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random CLIP checkpoint: 64 px images, 48-d projection, real CLIP tokenizer."""
    from retrieval.tools.random_model import make_random_clip

    return make_random_clip(tmp_path_factory.mktemp("tiny_clip"), preset="tiny", seed=0)


@pytest.fixture(scope="session")
def other_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same shapes as ``tiny_model`` but different weights (seed 1)."""
    from retrieval.tools.random_model import make_random_clip

    return make_random_clip(tmp_path_factory.mktemp("tiny_clip_other"), preset="tiny", seed=1)


@pytest.fixture(scope="session")
def collection(tmp_path_factory: pytest.TempPathFactory) -> Collection:
    """A generated collection with every image mode, broken files and file-system oddities."""
    return make_collection(tmp_path_factory.mktemp("collection") / "photos")


@pytest.fixture(scope="session")
def built_index(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, collection: Collection) -> Path:
    """``collection`` indexed with ``tiny_model`` through the Python API (read-only for tests)."""
    from indexer import build_index

    out = tmp_path_factory.mktemp("built") / "photos.idx"
    build_index(collection.root, out, model=str(tiny_model), batch_size=8, workers=1, device="cpu")
    return out


# -- synthetic vector indexes (vector_indexes.py) ------------------------------------------------


@pytest.fixture(scope="module")
def drawn() -> np.ndarray:
    """``ROWS`` clustered vectors to index and 200 more from the same distribution."""
    from vector_indexes import DIM, ROWS, clustered

    return clustered(ROWS + 200, DIM)


@pytest.fixture(scope="module")
def vectors(drawn: np.ndarray) -> np.ndarray:
    from vector_indexes import ROWS

    return drawn[:ROWS]


@pytest.fixture(scope="module")
def held_out(drawn: np.ndarray) -> np.ndarray:
    """Queries from the collection's distribution that are not in the index."""
    from vector_indexes import ROWS

    return drawn[ROWS:]


@pytest.fixture(scope="module")
def vec_index(tmp_path_factory: pytest.TempPathFactory, vectors: np.ndarray) -> Path:
    """``vectors`` committed 250 at a time, exact (read-only for tests: mutate a ``copy_of`` it)."""
    from vector_indexes import write_vectors_index

    out = tmp_path_factory.mktemp("ann") / "vec.idx"
    write_vectors_index(out, vectors, commit_every=250)
    return out


def clipsearch_exe() -> str:
    """The installed ``clipsearch`` console script of this interpreter's environment."""
    exe = Path(sys.executable).parent / "clipsearch"
    return str(exe) if exe.exists() else "clipsearch"


def run_cli(
    args: Sequence[str | os.PathLike[str]],
    cwd: Path | None = None,
    timeout: float = 300,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the installed ``clipsearch`` console script in a subprocess."""
    cmd = [clipsearch_exe(), *map(os.fspath, args)]
    full_env = {**os.environ, "PYTHONWARNINGS": "default", **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout, env=full_env)


def cli_here(args: Sequence[str | os.PathLike[str]], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The ``clipsearch`` command's ``main`` on ``args`` in this process: its exit code and what it
    printed, shaped as :func:`run_cli`'s result.

    The same code as the console script (which only calls ``main``) without a second interpreter
    start-up and its imports. For commands that read settings once per process (the query
    layer's environment variables are read when used, not at import), do not kill or signal the
    process, and do not need a fresh interpreter (the cold-start and import checks keep
    :func:`run_cli`). ``env`` is set for the call only.
    """
    import contextlib
    import io
    from unittest import mock

    from clipsearch.cli import main

    argv = [os.fspath(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    # The environment as it was afterwards: ``env``, and what main sets for its own process.
    with mock.patch.dict(os.environ, env or {}), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors and --help
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return subprocess.CompletedProcess(["clipsearch", *argv], code, out.getvalue(), err.getvalue())
