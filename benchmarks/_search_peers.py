"""What ``bench_search.py`` runs beside its own rows: the autofaiss peer (the vectors exported
as ``.npy`` parts, ``autofaiss.build_index`` in a fresh interpreter under the same memory budget)
and the text-query paths of ``--text-precisions`` (ours through ``ImageIndex.open``, the plain
Hugging Face call, and the ONNX Runtime / OpenVINO text towers of ``_peers``). Measuring the
results is ``bench_search``'s."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from _common import ROOT

# Peers: other tools that build an index from the same vectors, compared in the same table.
PEERS = ("autofaiss",)

# autofaiss 2.18 pins numpy<2 and pandas<3, which pip would downgrade (the project runs numpy 2,
# pandas 3): install it without its dependencies, plus the small packages it imports that the
# project does not already bring (embedding-reader, fire and fire's termcolor/six).
AUTOFAISS_INSTALL = ".venv/bin/pip install --no-deps autofaiss==2.18.0 embedding-reader==1.8.1 fire==0.6.0 termcolor six"

# Run in a fresh interpreter (its own peak RSS and wall time, as _REINDEX). argv[1] is a JSON
# object of build_index's arguments plus "index_out". save_on_disk=False and our own
# write_index: autofaiss 2.18's own save dumps its metrics with json.dump, which fails on the
# numpy 2 float32 it computes them in (a numpy 1 float64 was a float); the index it returns is
# the one it would have saved, already set to its chosen search parameters.
#
# autofaiss 2.18 builds its OPQ indexes (its choice at 10M x 512-d in 4 GB) with
# faiss.OPQMatrix(d, M=..., d2=...), keywords that faiss 1.15's SWIG wrapper does not take: the
# shim passes them by position, the same constructor.
_AUTOFAISS = """
import json, sys, time
status = lambda key: [int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith(key)][0]
import autofaiss, faiss
_OPQMatrix = faiss.OPQMatrix
faiss.OPQMatrix = lambda d=0, M=1, d2=-1: _OPQMatrix(d, M, d2)
base = status("VmRSS:")
kwargs = json.loads(sys.argv[1])
out = kwargs.pop("index_out")
t0 = time.perf_counter()
index, infos = autofaiss.build_index(save_on_disk=False, index_path=None, index_infos_path=None, **kwargs)
if index is None:
    sys.exit("autofaiss.build_index returned no index (see its log above)")
faiss.write_index(index, out)
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "infos": infos, "version": getattr(autofaiss, "__version__", "?"),
                  "peak_rss_mb": status("VmHWM:"), "base_rss_mb": base}, default=float))
"""


def peer_list(text: str) -> list[str]:
    """``--peer`` value: comma-separated names from :data:`PEERS` (argparse type; an unknown
    name is a usage error, exit 2)."""
    names = list(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [p for p in names if p not in PEERS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown peer {unknown[0]!r} (known: {', '.join(PEERS)})")
    return names


def peer_missing(peer: str) -> str | None:
    """Why ``peer`` cannot be imported by the interpreter its build subprocess runs, or None.

    Asked of a subprocess with the same environment (PYTHONPATH included) rather than of this
    process, so that what is checked is what the build will run, and a broken dependency of the
    package (not only its absence) is caught before any index is written.
    """
    proc = subprocess.run(
        [sys.executable, "-c", f"import {peer}; {peer}.build_index"], capture_output=True, text=True, env=dict(os.environ), cwd=ROOT
    )
    if proc.returncode == 0:
        return None
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {proc.returncode}"


def mem_available_bytes() -> int:
    """MemAvailable from /proc/meminfo in bytes: what autofaiss is told the machine has free."""
    from retrieval.faiss_index import available_memory

    available = available_memory()
    if not available:
        raise RuntimeError("no MemAvailable in /proc/meminfo")
    return available


def export_npy(index_dir: Path, dest: Path, batch_rows: int = 65536) -> int:
    """Write the stored embeddings of ``index_dir`` to ``dest/NNNNNN.npy`` chunks; returns the
    rows written.

    autofaiss reads a folder of .npy files sorted by name and numbers the vectors in that order,
    so zero-padded names in id order give its index our ids. Streamed from Parquet: memory is one
    chunk whatever the size.
    """
    import numpy as np

    from retrieval import ImageIndex

    dest.mkdir(parents=True)
    rows = 0
    for part, (first, vecs) in enumerate(ImageIndex.open(index_dir, mmap=True).iter_embeddings(batch_rows=batch_rows)):
        if first != rows:  # ids with gaps would not match autofaiss's running numbering
            raise RuntimeError(f"stored ids are not contiguous: chunk starts at {first}, expected {rows}")
        np.save(dest / f"{part:06d}.npy", np.ascontiguousarray(vecs, dtype=np.float32))
        rows += len(vecs)
    return rows


def autofaiss_subprocess(
    embeddings: Path, index_out: Path, max_memory_bytes: int, memory_available_bytes: int, k: int, query_time_ms: float,
    log: Path | None = None,
) -> dict[str, Any]:
    """Build autofaiss's chosen index over the .npy folder ``embeddings`` in a fresh process.

    Budgets are passed as byte counts ("4294967296B"): autofaiss's and our memory strings both
    read "4GB" as 4 GiB, but a byte count leaves nothing to interpret. ``log``: where its
    progress log goes while it runs (an hour at 10M; ``tail -f`` it), else kept in memory.
    """
    kwargs = {
        "embeddings": str(embeddings),
        "index_out": str(index_out),
        "max_index_memory_usage": f"{max_memory_bytes}B",
        "current_memory_available": f"{memory_available_bytes}B",
        "metric_type": "ip",  # our vectors are normalised and searched by inner product
        "min_nearest_neighbors_to_retrieve": k,
        "max_index_query_time_ms": query_time_ms,
    }
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    argv = [sys.executable, "-c", _AUTOFAISS, json.dumps(kwargs)]
    if log is None:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
        err = proc.stderr
    else:
        with open(log, "w") as err_file:
            proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err_file, text=True, env=env, cwd=ROOT)
        err = log.read_text(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"autofaiss build failed (exit status {proc.returncode}): {err.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def parse_index_param(text: str) -> dict[str, int | float]:
    """autofaiss's ``index_param`` ("nprobe=16,efSearch=32,ht=2048") as a dict, like our
    ``search_params``."""
    out: dict[str, int | float] = {}
    for item in text.split(","):
        if "=" in item:
            name, value = item.split("=", 1)
            number = float(value)
            out[name.strip()] = int(number) if number.is_integer() else number
    return out


def text_search(image_index: Any, index_dir: Path, model: str | None, precision: str) -> tuple[Any, Any]:
    """``(index, search)``: ``search(text)`` returns the 10 hits of one text as ``precision``
    makes its vector (``default``: ``ImageIndex.open`` as it comes; ``hf``: the plain Hugging
    Face call), and ``search.embed(texts)`` the vectors."""
    import numpy as np

    if precision == "default":
        index = image_index.open(index_dir, model=model, device="cpu", query_cache=0)  # the texts repeat
    else:
        index = image_index.open(index_dir, model=model, device="cpu", precision="fp32" if precision in ("hf", *TEXT_PEERS) else precision,
                                 query_cache=0)
    if precision in TEXT_PEERS:
        return index, peer_text_search(index, Path(model or index.query_model), precision)
    if precision != "hf":
        def search(text: str) -> Any:
            return index.search(text, 10)

        search.embed = index.embed_texts  # type: ignore[attr-defined]
        return index, search
    import torch
    from transformers import AutoTokenizer, CLIPModel

    from retrieval.encoders.base import quiet_transformers

    with quiet_transformers():
        hf_model = CLIPModel.from_pretrained(model or index.query_model).eval()
        tokenizer = AutoTokenizer.from_pretrained(model or index.query_model)

    def embed(texts: list[str]) -> Any:
        with torch.no_grad():
            out = hf_model.get_text_features(**tokenizer(texts, padding=True, return_tensors="pt"))
        v = out.numpy() if hasattr(out, "numpy") else out.pooler_output.numpy()
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)

    def search_hf(text: str) -> Any:
        return index.search_vectors(embed([text]), 10)[0]

    search_hf.embed = lambda texts: np.concatenate([embed([t]) for t in texts])  # type: ignore[attr-defined]
    return index, search_hf


TEXT_PEERS = ("onnxruntime", "openvino")


class PeerUnavailable(RuntimeError):
    """A peer runtime's text tower cannot run here (not installed); the message says why."""


def peer_text_search(index: Any, model_dir: Path, peer: str) -> Any:
    """``search(text)`` on ``peer``'s fp32 text tower (``_peers.text_embedder``: the checkpoint
    exported once to ONNX beside it), then the same vector search and paths as every row."""
    import numpy as np
    import torch
    from _peers import text_embedder

    try:
        embed = text_embedder(peer, model_dir, model_dir.parent / "peer-onnx", torch.get_num_threads())
    except RuntimeError as exc:
        raise PeerUnavailable(str(exc)) from exc

    def search(text: str) -> Any:
        return index.search_vectors(embed([text]), 10)[0]

    search.embed = lambda texts: np.concatenate([embed([t]) for t in texts])  # type: ignore[attr-defined]
    return search
