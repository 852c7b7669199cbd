"""The samples in README.md and docs/ run as written.

A fenced block right after a ``<!-- runnable -->`` line is run, in the order of its file, in a
sandbox that stands for a user's machine: a home with ``~/Pictures`` (stamps of the demo
collection), a working directory with ``photos/``, ``query.jpg`` and ``queries.jsonl``, and a
Hugging Face cache in which ``openai/clip-vit-base-patch32`` is the demo model (the Hub cannot
be reached here; the samples name the model users will download). ``bash`` blocks run line by
line (``clipsearch serve`` in the background until it answers ``/api/health``), ``python``
blocks as scripts; a server started without ``--port`` gets a free port instead of 8000. A
sample that fails names its file and line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "data" / "demo"
DEMO_MODEL = ROOT / "data" / "models" / "demo-clip"
HUB_MODEL = "openai/clip-vit-base-patch32"
MARKER = "<!-- runnable -->"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Stamps in the sandbox's photo folders: enough for every sample, few enough to index in seconds.
PHOTOS = 24


@dataclass(frozen=True)
class Sample:
    file: Path
    line: int
    language: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"


def samples_of(path: Path) -> list[Sample]:
    """The runnable blocks of one Markdown file, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for n, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        fence = lines[n + 1].strip() if n + 1 < len(lines) else ""
        if not fence.startswith("```"):
            raise AssertionError(f"{path.name}:{n + 1}: {MARKER} must stand right before a fenced block")
        end = next(i for i in range(n + 2, len(lines)) if lines[i].strip() == "```")
        out.append(Sample(path, n + 3, fence.strip("`").strip(), "\n".join(lines[n + 2 : end])))
    return out


def _fake_hub_cache(hf_home: Path) -> None:
    # The layout huggingface_hub's snapshot_download(local_files_only=True) reads.
    repo = hf_home / "hub" / ("models--" + HUB_MODEL.replace("/", "--"))
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(DEMO_MODEL, repo / "snapshots" / commit)


def _sandbox(root: Path) -> tuple[Path, dict[str, str]]:
    home, work = root / "home", root / "work"
    captions = [json.loads(line) for line in (DEMO / "captions.jsonl").read_text().splitlines()][::30][:PHOTOS]
    for folder in (home / "Pictures", work / "photos"):
        for row in captions:
            target = folder / Path(row["path"]).relative_to("images")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(DEMO / row["path"], target)
    shutil.copyfile(DEMO / captions[0]["path"], work / "query.jpg")  # a PNG by content: decoded by content
    (work / "queries.jsonl").write_text(
        "".join(json.dumps({"query": r["caption"], "relevant": [str(Path(r["path"]).relative_to("images"))]}) + "\n" for r in captions)
    )
    _fake_hub_cache(root / "hf")
    env = {
        **os.environ,
        "HOME": str(home),
        "HF_HOME": str(root / "hf"),
        "HF_HUB_OFFLINE": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    return work, env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(command: str, cwd: Path, env: dict[str, str], where: str) -> None:
    # The one change to a sample: a server started without --port gets a free one, not 8000,
    # which another program on the machine may hold.
    given = re.search(r"--port (\d+)", command)
    port = int(given.group(1)) if given else _free_port()
    if given is None:
        command = f"{command} --port {port}"
    url = f"http://127.0.0.1:{port}/api/health"
    proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                said = proc.stdout.read().decode() if proc.stdout else ""
                raise AssertionError(f"{where}: `{command}` exited with {proc.returncode}:\n{said}")
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    assert json.load(resp)["status"] == "ok"
                    return
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"{where}: `{command}` did not answer {url} within 120 s")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def _run(sample: Sample, cwd: Path, env: dict[str, str]) -> None:
    if sample.language == "python":
        proc = subprocess.run([sys.executable, "-c", sample.code], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{sample.where}: the Python sample failed:\n{proc.stderr[-3000:]}"
        return
    assert sample.language in ("bash", "console", "sh"), f"{sample.where}: cannot run a {sample.language!r} block"
    for offset, raw in enumerate(sample.code.splitlines()):
        command = raw.removeprefix("$ ").split("  #")[0].strip()
        if not command or command.startswith("#") or (sample.language == "console" and not raw.startswith("$ ")):
            continue
        where = f"{sample.file.relative_to(ROOT)}:{sample.line + offset}"
        if command.startswith("clipsearch serve"):
            _serve(command, cwd, env, where)
            continue
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{where}: `{command}` exited with {proc.returncode}:\n{proc.stderr[-3000:]}"


FILES = [p for p in DOCS if samples_of(p)]


def test_runnable_samples_exist() -> None:
    # The quick start is covered: a change that drops the markers must say so here.
    assert {p.name for p in FILES} >= {"README.md", "index.md"}


@pytest.mark.slow
@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_samples_run_as_written(path: Path, tmp_path: Path) -> None:
    cwd, env = _sandbox(tmp_path)
    for sample in samples_of(path):
        _run(sample, cwd, env)


def test_a_marker_without_a_block_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.md"
    bad.write_text(f"{MARKER}\ntext\n")
    with pytest.raises(AssertionError, match="must stand right before a fenced block"):
        samples_of(bad)
