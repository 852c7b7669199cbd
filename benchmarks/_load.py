"""The load side of ``bench_serve.py``: ``clipsearch serve`` as a subprocess (:class:`Server`),
and the asyncio HTTP/1.1 client that loads it (:func:`run_load`) with the CPU and memory
accounting of both ends. Pure mechanics: what is measured and reported lives in ``bench_serve``."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVING_LINE = re.compile(r"clipsearch: serving (http://([^/\s]+):(\d+)/)")

# -- the client ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    """One request and the in-process call it must agree with (none for ``health``)."""

    method: str
    target: str
    body: dict[str, Any] | None = None
    text: str | None = None
    vector: list[float] | None = None
    image_id: int | None = None
    # clip-back's /knn-service: the answer is a list of {"id", "similarity", ...}.
    knn: bool = False

    def encode(self, host: str, token: str | None) -> bytes:
        """The bytes of this request as HTTP/1.1 (keep-alive is HTTP/1.1's default)."""
        lines = [f"{self.method} {self.target} HTTP/1.1", f"Host: {host}", "Accept: application/json"]
        if token:
            lines.append(f"Authorization: Bearer {token}")
        payload = b""
        if self.body is not None:
            payload = json.dumps(self.body, separators=(",", ":")).encode()
            lines += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


@dataclass
class LoadResult:
    """What one (kind, clients) run measured."""

    latencies: list[float] = field(default_factory=list)
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    exceptions: collections.Counter[str] = field(default_factory=collections.Counter)
    wall_s: float = 0.0
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0

    @property
    def errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status != 200) + sum(self.exceptions.values())


class Connection:
    """A keep-alive HTTP/1.1 connection: send a prepared request, read status and body."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        """Send ``raw`` and return ``(status, body)``; reconnects when the server closed."""
        return await asyncio.wait_for(self._request(raw), self.timeout)

    async def _request(self, raw: bytes) -> tuple[int, bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        self._writer.write(raw)
        head = await self._reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip().lower()
        if "content-length" in headers:
            body = await self._reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding") == "chunked":
            body = await self._read_chunked()
        else:
            body = await self._reader.read()  # the server closes to end the body
            headers["connection"] = "close"
        if headers.get("connection") == "close":
            await self.close()
        return status, body

    async def _read_chunked(self) -> bytes:
        assert self._reader is not None
        parts: list[bytes] = []
        while True:
            size = int((await self._reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await self._reader.readuntil(b"\r\n")  # no trailers are expected
                return b"".join(parts)
            parts.append(await self._reader.readexactly(size))
            await self._reader.readexactly(2)

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a server's workers)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _tree_cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and of its children (a server and its workers)."""
    total = 0.0
    for p in [pid, *_children(pid)]:
        try:
            total += _cpu_seconds(p)
        except OSError:
            pass  # a process that ended meanwhile
    return total


def tree_memory_mb(pid: int) -> dict[str, Any]:
    """Resident memory of ``pid`` and its children now: each one's RSS, and the sum of their PSS
    (a shared page counted once, split between its sharers)."""
    rss, pss = [], 0.0
    for p in [pid, *_children(pid)]:
        try:
            status = Path(f"/proc/{p}/status").read_text()
            rollup = Path(f"/proc/{p}/smaps_rollup").read_text()
        except OSError:
            continue
        rss += [round(int(line.split()[1]) / 1024, 1) for line in status.splitlines() if line.startswith("VmRSS:")]
        pss += sum(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")) / 1024
    return {"rss_mb": rss, "rss_total_mb": round(sum(rss), 1), "pss_total_mb": round(pss, 1)}


def self_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_load(
    host: str, port: int, queries: Sequence[bytes], clients: int, requests: int, warmup: int, timeout: float, server_pid: int
) -> LoadResult:
    """``clients`` connections, each ``warmup`` untimed then ``requests`` timed requests in turn.

    Client ``c`` sends queries ``c * requests + j`` (cyclically), so that the clients do not
    all ask the same thing at the same moment.
    """
    result = LoadResult()
    conns = [Connection(host, port, timeout) for _ in range(clients)]
    ready = 0
    go = asyncio.Event()

    async def one(conn: Connection, raw: bytes, timed: bool) -> None:
        t0 = time.perf_counter()
        try:
            status, _ = await conn.request(raw)
        except Exception as exc:  # a benchmark counts every failure, whatever its kind
            result.exceptions[type(exc).__name__] += 1
            await conn.close()
            return
        if timed:
            result.latencies.append(time.perf_counter() - t0)
            result.statuses[status] += 1

    async def client(c: int, conn: Connection) -> None:
        nonlocal ready
        for j in range(warmup):
            await one(conn, queries[(c * warmup + j) % len(queries)], timed=False)
        ready += 1
        if ready == clients:
            go.set()
        await go.wait()
        for j in range(requests):
            await one(conn, queries[(c * requests + j) % len(queries)], timed=True)

    tasks = [asyncio.create_task(client(c, conn)) for c, conn in enumerate(conns)]
    await go.wait()
    cpu0, server0, t0 = self_cpu_seconds(), _tree_cpu_seconds(server_pid), time.perf_counter()
    await asyncio.gather(*tasks)
    result.wall_s = time.perf_counter() - t0
    result.client_cpu_s = self_cpu_seconds() - cpu0
    result.server_cpu_s = _tree_cpu_seconds(server_pid) - server0
    for conn in conns:
        await conn.close()
    return result


def per_client(total: int, clients: int) -> int:
    """Each client's share of a run's ``total`` timed requests (rounded up: every client sends)."""
    return -(-total // clients)


# -- the server ---------------------------------------------------------------------------------


class Server:
    """``clipsearch serve INDEX --port 0`` in a subprocess; its URL is parsed from stderr."""

    def __init__(self, command: list[str], start_timeout: float) -> None:
        self.command = command
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.stderr: collections.deque[str] = collections.deque(maxlen=40)
        found = threading.Event()
        self.url = self.host = ""
        self.port = 0

        def drain() -> None:
            # Read stderr to the end, so that a chatty server never blocks on a full pipe.
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.stderr.append(line.rstrip())
                m = SERVING_LINE.search(line)
                if m and not found.is_set():
                    self.url, self.host, self.port = m.group(1), m.group(2), int(m.group(3))
                    found.set()
            found.set()  # the process ended: stop waiting

        self._drain = threading.Thread(target=drain, daemon=True)
        self._drain.start()
        if not found.wait(start_timeout) or not self.url:
            self.stop()
            tail = " | ".join(self.stderr) or "no output"
            raise RuntimeError(f"server did not start within {start_timeout:.0f} s (exit code {self.proc.returncode}): {tail}")
        self.startup_s = time.perf_counter() - t0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def peak_rss_mb(self) -> float | None:
        """The server's peak resident memory (VmHWM), while it runs."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
        except OSError:
            pass
        return None

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, then wait (SIGKILL after ``timeout``); returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._drain.join(5)
        return self.proc.returncode
