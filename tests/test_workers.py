"""``clipsearch serve --workers 2``: two worker processes behind one port, each with the index's
FAISS file memory-mapped (not read into its own memory), each following a new generation, and
their metrics summed at a scrape (prometheus-client's multiprocess mode). Also the CLI's answers
to bad ``--workers`` and ``--cors-origin`` values."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server extra is not installed: pip install -e '.[server]'")

from conftest import clipsearch_exe, run_cli  # noqa: E402
from imagegen import photo_like  # noqa: E402
from test_metrics_endpoint import samples, value  # noqa: E402

pytestmark = pytest.mark.slow  # a server with two workers in subprocesses


def _photos(root: Path, first: int, count: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(first, first + count):
        photo_like(88 + 4 * i, 64, seed=700 + i).save(root / f"w{i:02d}.jpg", quality=90)


def _get(url: str) -> tuple[int, bytes]:
    # A new connection per request (no keep-alive), so that either worker may accept it.
    req = urllib.request.Request(url, headers={"Connection": "close"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.status, resp.read()


def _workers_of(pid: int) -> list[int]:
    """The worker processes ``pid`` spawned (not multiprocessing's resource tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return sorted(found)


def test_two_workers_share_the_mapped_index_and_follow_updates(tmp_path: Path, tiny_model: Path) -> None:
    from indexer import build_index

    photos, index_dir = tmp_path / "photos", tmp_path / "w.idx"
    _photos(photos, 0, 6)
    # An IVF index: FAISS maps an IVF file's lists; a Flat file's codes it copies even when mapped.
    build = {"model": str(tiny_model), "batch_size": 8, "workers": 0, "device": "cpu", "index_type": "IVF2,Flat"}
    build_index(photos, index_dir, **build)
    metrics_dir = tmp_path / "prom"
    metrics_dir.mkdir()
    cmd = [clipsearch_exe(), "serve", str(index_dir), "--port", "0", "--workers", "2", "--device", "cpu"]
    cmd += ["--cache-dir", str(tmp_path / "c")]
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("clipsearch: serving "):
                ready.set()
        ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        ready.wait(240)
        served = [line for line in lines if line.startswith("clipsearch: serving ")]
        assert served, "".join(lines)
        url = served[0].split()[-1].rstrip("/")
        assert "clipsearch: 2 workers\n" in lines

        workers = _workers_of(proc.pid)
        assert len(workers) == 2, workers
        faiss_file = next(index_dir.glob("gen-*/index.faiss")).resolve()
        for pid in workers:
            # Mapped, not read: the workers share the file's pages in the page cache.
            assert str(faiss_file) in Path(f"/proc/{pid}/maps").read_text(), pid

        status, body = _get(url + "/api/search?q=a+lake&k=3")
        assert status == 200 and len(json.loads(body)["results"]) == 3
        knn = json.dumps({"text": "a lake", "indice_name": "w.idx", "num_images": 3}).encode()
        with urllib.request.urlopen(urllib.request.Request(url + "/knn-service", data=knn), timeout=60) as resp:
            assert [r["id"] for r in json.loads(resp.read())] == [r["id"] for r in json.loads(body)["results"]]

        # Requests on new connections until both workers have counted some (each writes its own
        # file); four at a time, so that a worker busy with one leaves the next to the other.
        sent = 0
        with ThreadPoolExecutor(4) as pool:
            while sent < 400 and len(list(metrics_dir.glob("counter_*.db"))) < 2:
                assert [r[0] for r in pool.map(_get, [url + "/api/health"] * 4)] == [200] * 4
                sent += 4
        assert len(list(metrics_dir.glob("counter_*.db"))) == 2, "one worker answered every request"
        scraped = samples(_get(url + "/metrics")[1].decode())
        assert value(scraped, "clipsearch_http_requests_total", route="/api/health", method="GET", status="200") == sent

        # A new generation: every worker answers from it (each reopens on its own).
        _photos(photos, 6, 3)
        build_index(photos, index_dir, **build)
        counts = {json.loads(_get(url + "/api/indexes")[1])[0]["count"] for _ in range(20)}
        assert counts == {9}
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        reader.join(10)
    assert rc == 0, "".join(lines)
    assert "Traceback" not in "".join(lines)
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]


def test_a_stop_while_the_workers_load_stops_the_server(tmp_path: Path, tiny_model: Path) -> None:
    from indexer import build_index

    _photos(tmp_path / "photos", 0, 2)
    build_index(tmp_path / "photos", tmp_path / "s.idx", model=str(tiny_model), batch_size=8, workers=0, device="cpu")
    # Workers that never finish loading: a spawned worker's interpreter sleeps in sitecustomize
    # (not multiprocessing's resource tracker, which would keep stderr open after the server).
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import time\nif b'spawn_main' in open('/proc/self/cmdline', 'rb').read():\n    time.sleep(3600)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")])}
    cmd = [clipsearch_exe(), "serve", str(tmp_path / "s.idx"), "--port", "0", "--workers", "2", "--device", "cpu"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(workers := _workers_of(proc.pid)) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert len(workers) == 2, workers
        time.sleep(1.0)  # the supervisor is waiting for them now
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)  # uvicorn alone would wait START_TIMEOUT_S (600 s)
    finally:
        if proc.poll() is None:  # failed: the sleeping workers would hold stderr open for an hour
            for pid in [*workers, proc.pid]:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            proc.communicate()
    # A stop asked for is a clean exit, not "a worker failed to start"; no worker outlives it.
    assert proc.returncode == 0, err
    assert "error" not in err and "Traceback" not in err, err
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]


def test_a_worker_reports_the_server_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvicorn makes a worker's server on first use, from the healthcheck thread or the main
    thread; here the healthcheck's is made last, as a loaded machine may order them."""
    import uvicorn
    from uvicorn.supervisors import multiprocess

    from clipsearch.server.workers import _Worker

    running = threading.Event()

    class Server:
        def __init__(self, config: uvicorn.Config) -> None:
            self.started = False
            if threading.current_thread().name != "worker main":
                running.wait(10)  # the healthcheck thread's server is done after the main one runs

        def run(self, sockets: list[object] | None = None) -> None:
            self.started = True
            running.set()

    monkeypatch.setattr(multiprocess, "Server", Server)
    worker = _Worker(uvicorn.Config("clipsearch.server.workers:worker_app", factory=True), [])
    worker.parent_conn.send(b"ping")  # a ping already waits when the worker starts
    main = threading.Thread(target=worker.target, name="worker main", daemon=True)
    main.start()
    main.join(10)
    answers = [worker.parent_conn.recv()]  # the waiting ping's answer (made before or after the run)
    answers += [worker.is_ready(timeout=10) for _ in range(3)]
    assert answers[1:] == [True, True, True], answers


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--workers", "0"], 2, "must be in 1..256"),
        (["--workers", "many"], 2, "or auto"),
        (["--cors-origin", "http://front.test/page"], 1, "CORS origin"),
        (["--image-url-timeout", "0"], 2, "(0, 300]"),
    ],
)
def test_bad_serve_flags(tmp_path: Path, args: list[str], code: int, says: str) -> None:
    result = run_cli(["serve", str(tmp_path / "missing.idx"), "--port", "0", *args], timeout=120)
    assert result.returncode == code, result.stderr
    assert says in result.stderr and "Traceback" not in result.stderr


def test_workers_that_cannot_load_stop_the_server(tmp_path: Path, tiny_model: Path) -> None:
    from indexer import build_index

    _photos(tmp_path / "photos", 0, 2)
    build_index(tmp_path / "photos", tmp_path / "x.idx", model=str(tiny_model), batch_size=8, workers=0, device="cpu")
    # The index opens (the supervisor checks it), the model only loads in the workers: each says
    # why in one line, and the server exits 1 instead of starting them again and again.
    args = ["serve", str(tmp_path / "x.idx"), "--port", "0", "--workers", "2", "--device", "cpu", "--model", str(tmp_path / "gone")]
    result = run_cli(args, timeout=240)
    assert result.returncode == 1, result.stderr
    # (uvicorn reopens stdin in each worker and never closes it: run_cli shows ResourceWarnings)
    lines = [line for line in result.stderr.splitlines() if "ResourceWarning" not in line]
    assert lines and all(line.startswith("clipsearch: error:") for line in lines), result.stderr
    assert lines[-1] == "clipsearch: error: a worker failed to start (its error is above)"
