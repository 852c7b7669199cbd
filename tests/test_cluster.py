"""``serve --ray`` on a three-node ``ray.cluster_utils.Cluster`` on this machine: a shard set on
Ray Serve (clipsearch.server.cluster) against the unsharded index, and its faults: a shard past
its deadline, a shard failing verify, images added to one shard under traffic, a node removed
under traffic: one that holds a router and shard replicas, the traffic entering the other
nodes' HTTP proxies.

One cluster and one deployment serve the whole module (starting them is most of its time); the
tests run in file order, the node removal last.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import assert_one_line_error
from vector_indexes import clustered, write_vectors_index

pytest.importorskip("ray.serve")

from clipsearch.cli import main  # noqa: E402
from clipsearch.server.cluster import APP_NAME, ClusterOptions, RayShard, deploy  # noqa: E402
from indexer.partition import add_to_partitions, split_index  # noqa: E402
from retrieval.errors import EngineError, IndexCorruptError  # noqa: E402
from retrieval.index import ImageIndex  # noqa: E402
from retrieval.request import SearchRequest  # noqa: E402

# Shard deadlines: long enough for a healthy replica on a loaded 2-core host running a Ray
# cluster beside the rest of the suite (at 2 s and 1 s, clean-clone CI runs met answers late:
# one partial answer after a node loss, one 503 from the healthy shard beside a stalled one).
DEADLINE_S = 4.0
STALLED_DEADLINE_S = 3.0  # each search beside the stalled shard waits this long


@dataclass
class Served:
    cluster: Any
    url: str
    urls: dict[str, str]  # each node's HTTP proxy, by node id (url is the head's)
    root: Path
    set_dir: Path
    vectors: np.ndarray


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _until(condition: Callable[[], bool], within_s: float = 60.0) -> None:
    """Wait for ``condition`` (traffic is under way, answers came) instead of a fixed sleep: on a
    loaded host the first answers through a fresh proxy took over a second."""
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {within_s} s"
        time.sleep(0.05)


def _wait_routed(urls: Iterable[str], within_s: float = 60.0) -> None:
    """Until every proxy routes the application (a worker's proxy starts once a replica is
    placed on its node, and learns the routes a moment later: refused connections, then 404s)."""
    import httpx

    deadline = time.monotonic() + within_s
    for url in urls:
        while True:
            try:
                if httpx.get(f"{url}/api/indexes", timeout=10).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"{url} does not route the application"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    root = tmp_path_factory.mktemp("cluster")
    vectors = clustered(600, 32)
    write_vectors_index(root / "all.idx", vectors, commit_every=600)
    split_index(root / "all.idx", 2, root / "set")
    # The head holds Serve's controller; each worker a replica of each shard (the resource
    # "shard", max_replicas_per_node=1); every node a router (max_routers_per_node=1) and an
    # HTTP proxy, each worker's on a port of its own (Serve's knob for proxies sharing a host).
    port, worker_ports = _free_port(), [_free_port(), _free_port()]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, "object_store_memory": 80 << 20})
    urls = {cluster.head_node.node_id: f"http://127.0.0.1:{port}"}
    for worker_port in worker_ports:
        node = cluster.add_node(num_cpus=1, object_store_memory=80 << 20, resources={"shard": 4},
                                env_vars={"RAY_SERVE_WORKER_PROXY_HTTP_PORT": str(worker_port)})
        urls[node.node_id] = f"http://127.0.0.1:{worker_port}"
    cluster.wait_for_nodes()
    options = ClusterOptions(replicas=2, routers=3, deadline_s=DEADLINE_S, shard_cpus=0.3, router_cpus=0.2, max_replicas_per_node=1,
                             max_routers_per_node=1, shard_resources=(("shard", 1),))
    try:
        started = deploy(root / "set", options, {"warm": False}, address=cluster.address, http={"host": "127.0.0.1", "port": port})
        assert started is False
        _wait_routed(urls.values())
        yield Served(cluster, urls[cluster.head_node.node_id], urls, root, root / "set", vectors)
    finally:
        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
        cluster.shutdown()


def _search(client: Any, vector: np.ndarray, k: int = 5) -> dict[str, Any]:
    response = client.post("/api/search", json={"vector": vector.tolist(), "k": k})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _ids(body: dict[str, Any]) -> list[tuple[int, float, str]]:
    return [(r["id"], r["score"], r["path"]) for r in body["results"]]


def _want(index: ImageIndex, vector: np.ndarray, k: int = 5) -> list[tuple[int, float, str]]:
    return [(h.id, h.score, h.path) for h in index.search(SearchRequest(vector=vector, k=k))]


def test_the_cluster_answers_as_the_unsharded_index(served: Served) -> None:
    import httpx

    whole = ImageIndex.open(served.root / "all.idx")
    with httpx.Client(base_url=served.url, timeout=30) as client:
        for q in served.vectors[[0, 299, 300, 599]]:
            body = _search(client, q)
            assert _ids(body) == _want(whole, q)
            assert body["partial"] is False and body["missing_shards"] == []
        assert client.get("/api/indexes").json()[0]["count"] == 600
        assert client.post("/api/search", json={"vector": [1.0, 0.0], "k": 1}).status_code == 400
        assert client.post("/api/search", json={"image_id": 600, "k": 1}).status_code == 404
        assert client.get("/").status_code == 200


def test_a_shard_past_its_deadline_makes_a_partial_result(served: Served) -> None:
    from ray import serve
    from starlette.testclient import TestClient

    from clipsearch.server import create_app

    class _Stalled:
        """A shard replica that never answers in time (a hung node, a replica stuck in a long
        GC); defined here so that Ray ships the class itself (tests/ is not on its path)."""

        async def call(self, method: str, *args: Any) -> Any:
            await asyncio.sleep(60)

    serve.run(serve.deployment(name="stalled", ray_actor_options={"num_cpus": 0.1})(_Stalled).bind(), name="stalled",
              route_prefix="/stalled")
    stalled = serve.get_deployment_handle("stalled", app_name="stalled")

    def connect(root: Path, shard: Any) -> Any:
        if shard.name == "shard-0001":
            return RayShard(shard.name, stalled)
        return RayShard(shard.name, serve.get_deployment_handle(shard.name, app_name=APP_NAME))

    whole = ImageIndex.open(served.root / "all.idx")
    try:
        with TestClient(create_app([served.set_dir], warm=False, shard_connect=connect, shard_deadline_s=STALLED_DEADLINE_S)) as client:
            for q in served.vectors[[5, 400]]:
                started = time.monotonic()
                body = _search(client, q)
                assert time.monotonic() - started < STALLED_DEADLINE_S + 3
                assert body["partial"] is True and body["missing_shards"] == ["shard-0001"]
                # The unsharded ranking without the missing shard's images (ids 300..599).
                assert _ids(body) == [h for h in _want(whole, q, 600) if h[0] < 300][:5]
            # A lookup that needs the missing shard says so, rather than hanging.
            assert client.get("/api/images/450?index=set").status_code == 503
    finally:
        serve.delete("stalled")


def test_a_call_whose_replica_dies_is_answered_by_another(served: Served, tmp_path: Path) -> None:
    from ray import serve

    class _DiesOnce:
        """Two replicas; the first call to reach either kills its process (a node lost while it
        searched), every later call answers."""

        def __init__(self, marker: str) -> None:
            self.marker = marker

        def call(self, method: str, *args: Any) -> Any:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return method
            os._exit(1)

    marker = tmp_path / "died"
    serve.run(serve.deployment(name="dies", num_replicas=2, ray_actor_options={"num_cpus": 0.1})(_DiesOnce).bind(str(marker)),
              name="dies", route_prefix="/dies")
    try:
        shard = RayShard("dies", serve.get_deployment_handle("dies", app_name="dies"))
        assert shard.call("describe").result(10) == "describe"
        assert marker.exists()
    finally:
        serve.delete("dies")


def test_a_shard_failing_verify_is_refused_at_start_with_its_name(served: Served, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from ray import serve

    bad = tmp_path / "set"
    shutil.copytree(served.set_dir, bad)
    victim = next(p for p in sorted((bad / "shard-0001").rglob("*")) if p.is_file() and p.suffix in (".faiss", ".npy", ".f16", ".f32"))
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    options = ClusterOptions(replicas=1, routers=1)
    with pytest.raises(IndexCorruptError, match="shard 'shard-0001'.*nothing was deployed"):
        deploy(bad, options, {"warm": False}, address=served.cluster.address)
    assert set(serve.status().applications) == {APP_NAME}
    code = main(["serve", "--ray", str(bad), "--address", served.cluster.address])
    assert_one_line_error(code, capsys.readouterr().err, "shard-0001")
    code = main(["serve", "--ray", str(served.set_dir), "--address", "127.0.0.1:1"])
    assert_one_line_error(code, capsys.readouterr().err, "cannot reach the Ray cluster at 127.0.0.1:1")
    with pytest.raises(EngineError, match="cannot reach the Ray cluster"):
        deploy(served.set_dir, options, {}, address="ray://127.0.0.1:1")
    assert set(serve.status().applications) == {APP_NAME}


def test_a_deployment_that_fails_to_start_is_deleted(served: Served, tmp_path: Path) -> None:
    from ray import serve

    bad = tmp_path / "set"
    shutil.copytree(served.set_dir, bad)
    for faiss_file in (bad / "shard-0001").rglob("*.faiss"):
        faiss_file.write_bytes(b"damaged")
    # Not verified first: the damage is found by the shard's replica as it opens the shard.
    options = ClusterOptions(replicas=1, routers=1, shard_cpus=0.1, router_cpus=0.1, verify=False)
    with pytest.raises(EngineError, match="could not be deployed"):
        deploy(bad, options, {"warm": False}, address=served.cluster.address, name="broken", route_prefix="/broken")
    assert set(serve.status().applications) == {APP_NAME}


def test_images_added_to_a_shard_under_traffic_never_mix_generations(served: Served) -> None:
    import httpx

    new = clustered(30, 32, seed=11)
    write_vectors_index(served.root / "new.idx", new, commit_every=30)
    write_vectors_index(served.root / "grown.idx", np.concatenate([served.vectors, new]), commit_every=630)
    before, after = ImageIndex.open(served.root / "all.idx"), ImageIndex.open(served.root / "grown.idx")
    queries = new[:3]
    added_paths = ImageIndex.open(served.root / "new.idx").metadata.paths_of(range(30))

    def grown(q: np.ndarray) -> list[tuple[int, float, str]]:
        # The added images keep the paths their own index gave them.
        return [(i, s, added_paths[i - 600] if i >= 600 else p) for i, s, p in _want(after, q)]

    wanted = [(_want(before, q), grown(q)) for q in queries]
    assert all(b != a for b, a in wanted)
    answers: list[tuple[int, list[tuple[int, float, str]]]] = []
    stop = threading.Event()

    def traffic() -> None:
        with httpx.Client(base_url=served.url, timeout=30) as client:
            while not stop.is_set():
                for n, q in enumerate(queries):
                    answers.append((n, _ids(_search(client, q))))

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        _until(lambda: bool(answers))  # the set answered as it was, before anything is added
        add_to_partitions(served.set_dir, served.root / "new.idx")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (answers and answers[-1][1] == wanted[answers[-1][0]][1]):
            time.sleep(0.2)
        time.sleep(0.5)
    finally:
        stop.set()
        thread.join()
    # Every answer is the set's before the images were added or after, never a mix of the two.
    assert all(got in wanted[n] for n, got in answers)
    assert answers[0][1] == wanted[answers[0][0]][0] and answers[-1][1] == wanted[answers[-1][0]][1]


def test_a_node_removed_under_traffic_costs_no_request(served: Served) -> None:
    import httpx
    from ray._private.state import actors

    # Where Serve placed each replica (Serve names their actors after the deployment; the GCS's
    # table, as the state API needs the dashboard this cluster runs without).
    placed = [(a["Address"]["NodeID"], a["ActorClassName"]) for a in actors(actor_state_name="ALIVE").values()]
    worker = next(n for n in served.cluster.list_all_nodes() if n is not served.cluster.head_node)
    lost = {name.rsplit(":", 1)[-1] for node, name in placed if node == worker.node_id}
    assert {"router", "shard-0000", "shard-0001"} <= lost, lost
    survivors = [url for node, url in served.urls.items() if node != worker.node_id]
    results: list[tuple[str, int, bool]] = []
    stop = threading.Event()
    q = served.vectors[10]

    def traffic(url: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            while not stop.is_set():
                response = client.post("/api/search", json={"vector": q.tolist(), "k": 5})
                results.append((url, response.status_code, response.status_code == 200 and response.json()["partial"]))

    # Two clients on each surviving node's proxy: its router and a replica of each shard live on.
    threads = [threading.Thread(target=traffic, args=(url,)) for url in survivors for _ in range(2)]
    for t in threads:
        t.start()
    try:
        _until(lambda: len(results) >= len(threads))
        served_before = len(results)
        served.cluster.remove_node(worker, allow_graceful=False)  # killed, as a crashed machine
        time.sleep(4.0)
        _until(lambda: len(results) > served_before + 5)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert served_before > 0 and len(results) > served_before + 5
    assert {url for url, _, _ in results[served_before:]} == set(survivors)
    assert all(code == 200 and not partial for _, code, partial in results), [r for r in results if r[1:] != (200, False)][:5]


def test_cluster_options_refuse_bad_values(capsys: pytest.CaptureFixture[str]) -> None:
    from retrieval.errors import InvalidArgumentError

    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--ray", "nothing", "--shard-resource", "shard=0"])
    assert exit_.value.code == 2 and "NAME=AMOUNT with AMOUNT > 0" in capsys.readouterr().err

    for bad, needle in (({"replicas": 0}, "--replicas"), ({"routers": 1.5}, "--routers"), ({"deadline_s": 0}, "deadline_s"),
                        ({"max_replicas_per_node": 0}, "--max-replicas-per-node"),
                        ({"shard_resources": (("shard", 0),)}, "shard_resources")):
        with pytest.raises(InvalidArgumentError, match=needle):
            ClusterOptions(**bad)


class _Clock:
    """The time the hedging code reads, moved on only by the fake responses' waits: the test
    asserts when each try went out without a loaded host's scheduling moving the figures."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


class _Response:
    """A DeploymentResponse stand-in: answers ``value`` after ``delay`` s, or never (a replica on
    a node that died without a word), or raises ``error`` (a replica known lost)."""

    def __init__(self, clock: _Clock, value: Any = None, delay: float | None = 0.0, error: Exception | None = None) -> None:
        self.clock, self.value, self.error, self.cancelled = clock, value, error, False
        self.delay = delay
        self.ready_at: float | None = None

    def sent(self) -> _Response:
        self.ready_at = None if self.delay is None else self.clock.now + self.delay
        return self

    def result(self, timeout_s: float | None = None) -> Any:
        if self.error is not None:
            raise self.error
        wait = float("inf") if self.ready_at is None else self.ready_at - self.clock.now
        if timeout_s is not None and wait > timeout_s:
            self.clock.sleep(timeout_s)
            raise TimeoutError
        self.clock.sleep(wait)
        return self.value

    def cancel(self) -> None:
        self.cancelled = True


class _Handle:
    def __init__(self, responses: list[_Response]) -> None:
        self.responses: list[_Response] = responses
        self.sent: list[_Response] = []
        self.sent_at: list[float] = []
        self.call = self

    def remote(self, method: str, *args: Any) -> _Response:
        response = self.responses.pop(0).sent()
        self.sent.append(response)
        self.sent_at.append(response.clock.now)
        return response


def test_a_shard_call_is_hedged_after_half_its_deadline_and_retried_when_its_replica_is_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from clipsearch.server import cluster
    from clipsearch.server.cluster import HEDGE_AFTER, TRIES

    clock = _Clock()
    monkeypatch.setattr(cluster, "time", clock)
    # The first replica hangs: a second try goes out at half the deadline and answers.
    handle = _Handle([_Response(clock, delay=None), _Response(clock, "second", delay=0.1)])
    assert RayShard("shard-0000", handle).call("search", 1).result(timeout=1.0) == "second"
    assert handle.sent_at == [0.0, pytest.approx(HEDGE_AFTER * 1.0)]
    assert clock.now < 1.0 and [r.cancelled for r in handle.sent] == [True, False]
    # A fast answer sends nothing more.
    clock.now = 0.0
    handle = _Handle([_Response(clock, "first", delay=0.05), _Response(clock, "never sent")])
    assert RayShard("shard-0000", handle).call("search").result(timeout=1.0) == "first" and len(handle.sent) == 1
    # A lost replica is tried again at once, up to TRIES in all; then its error is raised.
    clock.now = 0.0
    handle = _Handle([_Response(clock, error=RuntimeError("actor died")), _Response(clock, "again")])
    assert RayShard("shard-0000", handle).call("search").result(timeout=1.0) == "again"
    assert handle.sent_at == [0.0, 0.0]
    handle = _Handle([_Response(clock, error=RuntimeError(f"died {i}")) for i in range(TRIES)])
    with pytest.raises(RuntimeError, match=f"died {TRIES - 1}"):
        RayShard("shard-0000", handle).call("search").result(timeout=1.0)
    # Nobody answers: a TimeoutError at the deadline, every try cancelled.
    clock.now = 0.0
    handle = _Handle([_Response(clock, delay=None), _Response(clock, delay=None)])
    with pytest.raises(TimeoutError, match="no replica answered search within 0.4 s"):
        RayShard("shard-0000", handle).call("search").result(timeout=0.4)
    assert 0.4 <= clock.now < 0.4 + 0.05 and all(r.cancelled for r in handle.sent)


def test_a_proxy_keeps_every_try_on_its_own_nodes_router() -> None:
    from types import SimpleNamespace

    from clipsearch.server.node_routing import OwnNodeRouters

    routers = [SimpleNamespace(node_id=node, name=name) for node, name in (("a", "a1"), ("b", "b1"), ("a", "a2"))]
    pending = SimpleNamespace(routing_context=SimpleNamespace(should_backoff=False))

    def chosen(node: str) -> list[list[str]]:
        me = SimpleNamespace(_self_node_id=node)
        ranks = asyncio.run(OwnNodeRouters.choose_replicas(me, routers, pending))  # type: ignore[arg-type]
        return [[r.name for r in rank] for rank in ranks]

    # Every try (Serve asks again after each one its choice did not take): the node's own routers.
    assert chosen("a") == [["a1", "a2"]] and chosen("a") == [["a1", "a2"]] and chosen("b") == [["b1"]]
    assert pending.routing_context.should_backoff is True  # tries again after a pause, not in a spin
    # A node with a proxy and no router (shards only): any router.
    assert chosen("c") == [["a1", "b1", "a2"]]
