"""``clipsearch index --engine ray``: the same index as the local engine, from a Ray Data actor pool.

One embedded Ray (``ray.init(num_cpus=2)``) serves this module's in-process tests; the cluster
test runs first, before it starts, against a two-node ``ray.cluster_utils.Cluster`` on this
machine that the CLI reaches through ``--ray-address``, the way a real cluster is used.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from helpers import local_ray
from imagegen import Collection, photo_like, write_photos

from clipsearch.cli import main
from indexer import build_index, ray_cluster, ray_engine
from indexer.build_config import BuildConfig
from retrieval import ImageIndex
from retrieval.encoders.cpu import cpu_level
from retrieval.errors import EngineError, InvalidArgumentError
from retrieval.layout import STAGING_PREFIX

ROOT = Path(__file__).resolve().parents[1]


def _photo_size(i: int) -> tuple[int, int]:
    return 72 + i % 5, 60 + i % 3


def _contents(index_dir: Path) -> tuple[list[tuple[int, str]], np.ndarray, list[tuple[str, str]], dict]:
    index = ImageIndex.open(index_dir)
    rows = [(r["id"], r["path"]) for r in index.rows(range(len(index)), columns=("id", "path"))]
    skipped = sorted((s.path, s.reason) for s in index.metadata.skipped())
    manifest = json.loads((index_dir / "manifest.json").read_text())
    return rows, np.asarray(index.vectors.embeddings()), skipped, manifest


def assert_same_index(local: Path, other: Path) -> None:
    """Same ids and paths in the same order, same skips and reasons, vectors within 1e-5, same
    precision mode and FAISS choice."""
    rows_a, emb_a, skip_a, man_a = _contents(local)
    rows_b, emb_b, skip_b, man_b = _contents(other)
    assert rows_b == rows_a
    assert [i for i, _ in rows_b] == list(range(len(rows_b)))
    assert len({p for _, p in rows_b}) == len(rows_b), "a path is indexed twice"
    assert skip_b == skip_a
    assert emb_b.shape == emb_a.shape
    assert float(np.abs(emb_b - emb_a).max()) <= 1e-5
    assert float(np.min(np.sum(emb_a * emb_b, axis=1))) >= 0.99999
    assert man_b["model_info"]["precision"] == man_a["model_info"]["precision"]
    assert man_b["index_type"] == man_a["index_type"]
    assert man_b["count"] == man_a["count"] and man_b["complete"] and man_a["complete"]


@pytest.fixture(scope="module")
def small_photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Twelve JPEGs and one broken file."""
    root = write_photos(tmp_path_factory.mktemp("ray_small") / "photos", 12, size=_photo_size)
    (root / "broken.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    return root


@pytest.fixture(scope="module")
def small_local(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, small_photos: Path) -> Path:
    out = tmp_path_factory.mktemp("ray_small_local") / "local.idx"
    build_index(small_photos, out, model=str(tiny_model), batch_size=4, device="cpu")
    return out


# -- the cluster path: runs before this module's embedded Ray starts --------------------------------


@pytest.fixture()
def two_node_cluster() -> Iterator[str]:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                             "object_store_memory": 100 << 20})
    cluster.add_node(num_cpus=1, object_store_memory=100 << 20)
    cluster.wait_for_nodes()
    try:
        yield cluster.address
    finally:
        cluster.shutdown()


def test_cluster_driver_killed_resumes_to_a_local_build(
    tmp_path: Path, tiny_model: Path, small_photos: Path, small_local: Path, two_node_cluster: str
) -> None:
    """Two nodes of one CPU each, one actor on each, the driver a separate process reaching the
    head by address; killed with SIGKILL at the second part's link (after the first part's commit,
    between an actor's write and its link), then run again: the next run removes the staged part
    and embeds only what was not committed."""
    import ray

    assert not ray.is_initialized(), "the cluster test must run before this module's embedded Ray"
    out = tmp_path / "cluster.idx"
    args = ["index", small_photos, out, "--model", tiny_model, "--engine", "ray", "--ray-address", two_node_cluster,
            "--actors", "2", "--cpus-per-actor", "1", "--batch-size", "4", "--commit-every", "4", "--no-progress", "--json"]
    killed = run_cli(args, env={"CLIPSEARCH_CRASH_AT": "adopt:2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    staged = [p for p in out.iterdir() if p.name.startswith(f"{STAGING_PREFIX}ray-")]
    assert len(staged) == 1 and list((staged[0] / "embeddings").glob("*.parquet"))
    partial = json.loads((out / "manifest.json").read_text())
    # The first part committed: 4 files, the broken one (the first) a skip record.
    assert not partial["complete"] and (partial["count"], partial["skipped"]) == (3, 1)

    done = run_cli(args)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["engine"] == "ray" and report["actors"] == 2 and report["resumed"] is True
    assert report["ray_write"] == "actors"
    assert report["cluster_resources"]["CPU"] == 2.0
    # Only what the killed run had not committed was embedded again.
    assert (report["embedded"], report["newly_skipped"]) == (13 - 4, 0)
    assert_same_index(small_local, out)
    assert [p.name for p in out.iterdir() if p.name.startswith(STAGING_PREFIX)] == []


def test_unreachable_address_fails_with_one_line(tmp_path: Path, tiny_model: Path, small_photos: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "x.idx"
    proc = run_cli(["index", small_photos, out, "--model", tiny_model, "--engine", "ray", "--ray-address", f"127.0.0.1:{port}"],
                   timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"clipsearch: error: cannot reach the Ray cluster at 127.0.0.1:{port}: Connection refused; "
        "is its head running (`ray start --head`)?"
    ]
    assert not out.exists()


def test_an_address_that_is_not_a_ray_head_fails_in_bounded_time() -> None:
    """Ray's own connect retries for minutes at a port that accepts and says nothing, or says
    something else; the probe gives up after its timeout."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(EngineError, match=f"cannot reach the Ray cluster at {address}: no answer"):
            ray_cluster.check_reachable(address, timeout=0.5)

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        address = f"127.0.0.1:{other.getsockname()[1]}"

        def answer() -> None:
            conn, _ = other.accept()
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        thread = threading.Thread(target=answer)
        thread.start()
        with pytest.raises(EngineError, match=f"{address} does not answer as a Ray head"):
            ray_cluster.check_reachable(address, timeout=5)
        thread.join()
    with pytest.raises(EngineError, match="is not HOST:PORT"):
        ray_cluster.check_reachable("ray://:10001")


# -- the embedded Ray shared by the rest of the module -------------------------------------------


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    with local_ray():
        yield


def test_collection_equals_local_build(
    tmp_path: Path, tiny_model: Path, collection: Collection, ray_local: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every image mode, broken files and odd names (non-UTF-8 bytes too), two actors."""
    local = tmp_path / "local.idx"
    expected = build_index(collection.root, local, model=str(tiny_model), batch_size=8, device="cpu")
    out = tmp_path / "ray.idx"
    code = main(["index", str(collection.root), str(out), "--model", str(tiny_model), "--engine", "ray", "--actors", "2",
                 "--cpus-per-actor", "1", "--batch-size", "8", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert report["engine"] == "ray" and report["actors"] == 2 and report["workers"] == 2
    assert report["cluster_resources"]["CPU"] == 2.0
    assert (report["embedded"], report["newly_skipped"]) == (expected.embedded, expected.newly_skipped)
    assert report["newly_skipped"] >= len(collection.broken) - 1  # "unreadable" is readable by root
    # Progress on stderr: images done / total and images/s.
    assert f"/{expected.embedded + expected.newly_skipped} " in captured.err and "img/s" in captured.err
    assert_same_index(local, out)


def test_update_sends_only_new_and_changed_files(tmp_path: Path, tiny_model: Path, ray_local: None) -> None:
    photos = write_photos(tmp_path / "photos", 6, size=_photo_size)
    out = tmp_path / "ray.idx"
    # Built by the local engine: the engines make the same index, so either may update it.
    build_index(photos, out, model=str(tiny_model), batch_size=4, device="cpu")
    write_photos(photos, 2, start=6, size=_photo_size)  # 2 new
    photo_like(90, 70, seed=99).save(photos / "img_001.jpg", quality=90)  # changed
    (photos / "img_002.jpg").unlink()  # removed
    report = build_index(photos, out, model=str(tiny_model), engine="ray", batch_size=4)
    assert (report.added, report.updated, report.removed, report.unchanged, report.embedded) == (2, 1, 1, 4, 3)
    assert report.engine == "ray"
    rebuilt = tmp_path / "local.idx"
    build_index(photos, rebuilt, model=str(tiny_model), batch_size=4, device="cpu")
    rows_u, emb_u, _, _ = _contents(out)
    rows_r, emb_r, _, _ = _contents(rebuilt)
    by_path_u = dict(zip((p for _, p in rows_u), emb_u, strict=True))
    by_path_r = dict(zip((p for _, p in rows_r), emb_r, strict=True))
    assert sorted(by_path_u) == sorted(by_path_r)
    for path, vector in by_path_r.items():
        assert np.abs(by_path_u[path] - vector).max() <= 1e-5, path


def test_ocr_on_an_index_embedded_without_it_reads_the_text_on_the_driver(
    tmp_path: Path, tiny_model: Path, ray_local: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--ocr with --engine ray on an index embedded without it: the driver reads the text of its
    rows (indexer.backfill), nothing is embedded again (OCR faked: the mechanics, not the engine)."""
    from indexer import ocr

    photos = write_photos(tmp_path / "photos", 4, size=_photo_size)
    out = tmp_path / "ray.idx"
    build_index(photos, out, model=str(tiny_model), batch_size=4, device="cpu")
    rows_before, emb_before, _, _ = _contents(out)
    monkeypatch.setattr(ocr, "check_engine", lambda: None)
    monkeypatch.setattr(ocr, "recognise", lambda image: "INVOICE4711")
    report = build_index(photos, out, model=str(tiny_model), engine="ray", batch_size=4, ocr=True)
    assert (report.engine, report.text_read, report.embedded, report.with_ocr_text) == ("ray", 4, 0, 4)
    rows_after, emb_after, _, _ = _contents(out)
    assert rows_after == rows_before and emb_after.tobytes() == emb_before.tobytes()
    assert json.loads((out / "manifest.json").read_text())["keywords"]["ocr"] is True
    assert len(ImageIndex.open(out, device="cpu").search("4711", mode="keyword")) == 4


def test_killed_actor_is_retried_without_duplicates(
    tmp_path: Path, tiny_model: Path, small_photos: Path, small_local: Path, ray_local: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The actor is held at its second batch (a named fault point, forwarded to the actors),
    killed with SIGKILL there, and Ray restarts it and retries its batches."""
    pause = tmp_path / "pause"
    pause.mkdir()
    monkeypatch.setenv("CLIPSEARCH_PAUSE_AT", "embed:2")
    monkeypatch.setenv("CLIPSEARCH_PAUSE_DIR", str(pause))
    out = tmp_path / "ray.idx"
    result: dict[str, object] = {}

    def build() -> None:
        try:
            result["report"] = build_index(small_photos, out, model=str(tiny_model), engine="ray", actors=1, batch_size=4)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            result["error"] = exc

    thread = threading.Thread(target=build)
    thread.start()
    reached = pause / "embed-2.reached"
    first = _wait_for_pid(reached, other_than=None)
    os.kill(first, signal.SIGKILL)
    # The restarted actor, at its own second batch: Ray restarts it after noticing the death, which
    # on two loaded cores (the suite's other worker beside it) took over two minutes once.
    second = _wait_for_pid(reached, other_than=first, timeout=360.0)
    (pause / "embed-2.go").touch()
    thread.join(timeout=240)
    assert not thread.is_alive()
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    assert second != first
    assert_same_index(small_local, out)


def _wait_for_pid(path: Path, other_than: int | None, timeout: float = 120.0) -> int:
    # A safety net for a broken test, never a timing: the actor writes the file when it arrives.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            pid = int(path.read_text() or 0)
            if pid and pid != other_than:
                return pid
        time.sleep(0.02)
    raise AssertionError(f"no actor reached {path.name}")


def test_calibration_on_a_node_chooses_what_the_driver_would(tiny_model: Path, small_photos: Path, ray_local: None) -> None:
    """On a cluster of other machines `auto` is calibrated by a Ray task with an actor's
    resources; here, where the nodes are this machine, it must choose what the driver chooses."""
    import torch

    from indexer import calibrate
    from indexer.discover import discover
    from retrieval.encoders import load_encoder
    from retrieval.encoders.precision import auto_candidates

    files = discover(small_photos).files
    local = load_encoder(str(tiny_model), device="cpu", precision="auto")
    calibrate.resolve(local, None, small_photos, files, max_pixels=10**8, draft=True)
    driver = load_encoder(str(tiny_model), device="cpu", precision="auto")
    with ray_engine.ray_run(BuildConfig(model=str(tiny_model), engine="ray")) as run:
        assert run.this_machine and run.calibrates_here(driver)
        info = run.resolve_precision(driver, small_photos, None, files, keep_recorded=False)
    assert info["precision"] == local.info["precision"]
    assert info["precision_requested"] == "auto"
    # Both gate the same modes; a CPU with no reduced mode to try (level none) gates nothing.
    def gated(i: dict) -> list[str] | None:
        return [g["mode"] for g in i["precision_gate"]["gate"]] if "precision_gate" in i else None

    assert gated(info) == gated(local.info)
    assert (gated(info) is not None) == bool(auto_candidates(torch.device("cpu")))
    assert info["_cpu_level"] == cpu_level()


def test_gpus_on_a_cluster_without_gpus(tmp_path: Path, tiny_model: Path, small_photos: Path, ray_local: None,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.idx"
    code = main(["index", str(small_photos), str(out), "--model", str(tiny_model), "--engine", "ray", "--gpus-per-actor", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err == ["clipsearch: error: --gpus-per-actor 1: the Ray cluster has no GPUs; leave it out to embed on CPUs"]
    assert not out.exists()
    with pytest.raises(EngineError, match=r"3 actors x 1 CPUs need 3 CPUs; the Ray cluster has 2"):
        build_index(small_photos, out, model=str(tiny_model), engine="ray", actors=3, cpus_per_actor=1)
    assert not out.exists()


# -- no cluster needed -----------------------------------------------------------------------------


def test_pool_plan() -> None:
    plan = ray_cluster.plan_pool
    assert plan(BuildConfig(engine="ray"), {"CPU": 2}) == ray_cluster.Pool(1, 2.0, 0.0)
    assert plan(BuildConfig(engine="ray"), {"CPU": 16}) == ray_cluster.Pool(4, 4.0, 0.0)
    assert plan(BuildConfig(engine="ray", cpus_per_actor=1), {"CPU": 2}) == ray_cluster.Pool(2, 1.0, 0.0)
    # GPU actors: one per GPU, the CPUs but one shared out among them for decoding.
    assert plan(BuildConfig(engine="ray", gpus_per_actor=1), {"CPU": 17, "GPU": 4}) == ray_cluster.Pool(4, 4.0, 1.0)
    assert plan(BuildConfig(engine="ray", gpus_per_actor=0.5), {"CPU": 8, "GPU": 1}) == ray_cluster.Pool(2, 3.0, 0.5)
    with pytest.raises(EngineError, match="the Ray cluster has no GPUs"):
        plan(BuildConfig(engine="ray", gpus_per_actor=1), {"CPU": 8})
    with pytest.raises(EngineError, match="3 actors x 1 GPUs need 3 GPUs; the Ray cluster has 2"):
        plan(BuildConfig(engine="ray", gpus_per_actor=1, actors=3), {"CPU": 8, "GPU": 2})
    with pytest.raises(EngineError, match="need 8 CPUs; the Ray cluster has 2"):
        plan(BuildConfig(engine="ray", actors=2, cpus_per_actor=4), {"CPU": 2})


def test_ray_not_installed_names_the_extra(tmp_path: Path, tiny_model: Path, small_photos: Path,
                                          monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # `import ray` raises ImportError
    out = tmp_path / "x.idx"
    code = main(["index", str(small_photos), str(out), "--model", str(tiny_model), "--engine", "ray"])
    assert code == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "clipsearch: error: --engine ray needs Ray Data, which is not installed: pip install 'clipsearch[ray]'"
    ]
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--actors", "2"], "actors only apply to engine 'ray' (--engine ray)"),
        (["--ray-address", "auto", "--cpus-per-actor", "2"], "ray_address, cpus_per_actor only apply to engine 'ray' (--engine ray)"),
        (["--ray-write", "actors"], "ray_write only apply to engine 'ray' (--engine ray)"),
    ],
)
def test_ray_options_need_the_ray_engine(tmp_path: Path, tiny_model: Path, small_photos: Path, args: list[str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.idx"
    assert main(["index", str(small_photos), str(out), "--model", str(tiny_model), *args]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"clipsearch: error: {message}"]
    assert not out.exists()


@pytest.mark.parametrize("args", [["--gpus-per-actor", "-1"], ["--cpus-per-actor", "0"], ["--actors", "0"], ["--engine", "spark"],
                                  ["--ray-write", "nfs"]])
def test_bad_engine_arguments_exit_2(tmp_path: Path, args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["index", str(tmp_path), str(tmp_path / "x.idx"), "--engine", "ray", *args])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("clipsearch index: error: argument")


def test_config_validation() -> None:
    with pytest.raises(InvalidArgumentError, match="engine must be one of local, ray"):
        BuildConfig(engine="spark")
    with pytest.raises(InvalidArgumentError, match="ray_write must be one of auto, driver, actors, got 'nfs'"):
        BuildConfig(engine="ray", ray_write="nfs")
    with pytest.raises(InvalidArgumentError, match="gpus per actor must be a number >= 0"):
        BuildConfig(engine="ray", gpus_per_actor=float("nan"))
    with pytest.raises(InvalidArgumentError, match="cannot take a loaded encoder"):
        build_index("photos", "out.idx", engine="ray", encoder=object())  # type: ignore[arg-type]


def test_only_the_ray_cluster_imports_ray_and_only_when_it_runs() -> None:
    """`import ray` appears in indexer/ray_cluster.py (the build's cluster) and
    clipsearch/server/cluster.py (`serve --ray`) alone, inside functions: a local build, search or
    serve never imports it (ray is an optional extra). The one module that imports it at its top,
    clipsearch/server/node_routing.py (Serve takes a request router as a module's class), is
    imported by cluster.py alone, inside a function."""
    allowed = {ROOT / "indexer" / "ray_cluster.py", ROOT / "clipsearch" / "server" / "cluster.py"}
    at_top = ROOT / "clipsearch" / "server" / "node_routing.py"
    for path in sorted([*ROOT.glob("retrieval/**/*.py"), *ROOT.glob("indexer/**/*.py"), *ROOT.glob("clipsearch/**/*.py")]):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "ray" or n.startswith("ray.") for n in names):
                assert path in allowed or path == at_top, f"{path} imports ray"
                assert id(node) not in top_level or path == at_top, f"{path} imports ray at module level"
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("node_routing"):
                assert path == ROOT / "clipsearch" / "server" / "cluster.py", f"{path} imports node_routing"
                assert id(node) not in top_level, f"{path} imports node_routing at module level"
            if isinstance(node, ast.Import) and any(a.name.endswith("node_routing") for a in node.names):
                raise AssertionError(f"{path} imports node_routing")


def test_docs_document_the_engine() -> None:
    page = (ROOT / "docs" / "ray.md").read_text(encoding="utf-8")
    for needle in ("--engine ray", "--ray-address", "--gpus-per-actor", "clipsearch[ray]", "shared file system", "--ray-write"):
        assert needle in page, needle

