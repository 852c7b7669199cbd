"""Peer runtimes for the benchmarks: ONNX Runtime and OpenVINO running the same towers.

What a user tuning a CPU build would try before writing kernels: the tower exported once with
``torch.onnx.export`` (retrieval's own export, :mod:`retrieval.encoders.runtime.export`, into the
run's work directory, never at import), then

* ``onnxruntime-fp32``: ONNX Runtime's CPU provider on the export;
* ``onnxruntime-int8``: ``onnxruntime.quantization.quantize_dynamic`` of it (int8 weights,
  activations quantised per call with one scale, ONNX Runtime's defaults);
* ``openvino-fp32``: OpenVINO's CPU plugin on the export, ``INFERENCE_PRECISION_HINT=f32``;
* ``openvino-bf16``: the same with ``INFERENCE_PRECISION_HINT=bf16`` (the plugin's own default on
  CPUs with bf16: AVX-512 BF16 or AMX; elsewhere it runs f32);
* ``openvino-int8``: NNCF weight compression ``int8_asym`` (OpenVINO's recommendation for
  transformers on CPU; NNCF has no group size for int8, so per output channel) and the bf16
  inference hint where the CPU has bf16 (``avx512_bf16`` or AMX), f32 elsewhere.

Threads: the run's count for each (intra-op; one inter-op stream). A runtime that is not
installed is a skipped row with its reason.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.encoders.base import first_line

PEERS: tuple[str, ...] = ("onnxruntime", "openvino")
PIPELINES: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("onnxruntime-fp32", "onnxruntime-int8"),
    "openvino": ("openvino-fp32", "openvino-bf16", "openvino-int8"),
}
_PACKAGES = {"onnxruntime": ("onnxruntime", "onnx"), "openvino": ("openvino", "nncf", "onnx")}
INSTALL = "pip install 'clipsearch[peers]'"

Embed = Callable[[np.ndarray], np.ndarray]


def parse_peers(text: str) -> list[str]:
    """``--peers a,b`` checked against :data:`PEERS`.

    Raises:
        ValueError: an unknown name.
    """
    names = [p.strip() for p in text.split(",") if p.strip()]
    for name in names:
        if name not in PEERS:
            raise ValueError(f"unknown peer {name!r}; use one of {', '.join(PEERS)}")
    return names


def peer_missing(peer: str) -> str | None:
    """Why ``peer`` cannot run here (a package missing or broken), or None."""
    from retrieval.encoders.runtime import packages_missing

    why = packages_missing(*_PACKAGES[peer])
    return f"{why}; {INSTALL}" if why is not None else None


def cpu_has_bf16() -> bool:
    from retrieval.encoders import cpu

    flags = cpu.cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _normalise(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, dtype=np.float32)
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


def export_vision(model_dir: Path) -> Path:
    """The image tower of ``model_dir`` (with its projection) as ONNX: the export our own fp32
    path caches (``CLIPSEARCH_ONNX_CACHE``), so both run the same file."""
    from retrieval.encoders import HFClipEncoder
    from retrieval.encoders.runtime.export import cached_vision_export

    enc = HFClipEncoder.load(str(model_dir), device="cpu")
    return cached_vision_export(
        lambda: enc.vision_model, enc.family.image_output, enc.fingerprint, enc.native_image_size, str(model_dir)
    )


def ort_session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_int8(path: Path) -> Path:
    """``quantize_dynamic`` of an export, as ONNX Runtime's docs show it (kept if there)."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    dest = path.with_name(path.stem + "-int8.onnx")
    if not dest.is_file():
        # Its advice to pre-process first goes to the root logger; a new user's call is this one.
        logging.getLogger().setLevel(max(logging.getLogger().level, logging.ERROR))
        quantize_dynamic(str(path), str(dest), weight_type=QuantType.QInt8)
    return dest


def ov_compiled(path: Path, threads: int, kind: str = "fp32") -> tuple[Any, str]:
    """OpenVINO's compiled model of an export in ``kind`` (``fp32``; ``bf16``: the bf16 hint;
    ``int8``: NNCF int8_asym weights) and the inference precision it was given."""
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(path))
    hint = "bf16" if kind == "bf16" else "f32"
    if kind == "int8":
        import contextlib
        import io
        import logging

        import nncf

        nncf.set_log_level(logging.ERROR)
        # NNCF draws its table and progress bar on stdout, where the benchmark's JSON line goes.
        with contextlib.redirect_stdout(io.StringIO()):
            model = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
        hint = "bf16" if cpu_has_bf16() else "f32"
    config = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "INFERENCE_PRECISION_HINT": hint}
    return core.compile_model(model, "CPU", config), hint


def vision_pipelines(peers: list[str], onnx_path: Path, threads: int) -> dict[str, Embed | str]:
    """``pipeline -> embed(pixel_values) -> normalised vectors``, or the reason it is skipped."""
    out: dict[str, Embed | str] = {}
    for peer in peers:
        missing = peer_missing(peer)
        if missing is not None:
            for name in PIPELINES[peer]:
                out[name] = missing
            continue
        if peer == "onnxruntime":
            for name, path in (("onnxruntime-fp32", onnx_path), ("onnxruntime-int8", ort_int8(onnx_path))):
                session = ort_session(path, threads)
                key = session.get_inputs()[0].name
                out[name] = (lambda s, k: lambda x: _normalise(s.run(None, {k: x})[0]))(session, key)
        else:
            for name in PIPELINES["openvino"]:
                try:
                    compiled, _hint = ov_compiled(onnx_path, threads, name.removeprefix("openvino-"))
                except Exception as exc:  # noqa: BLE001  (OpenVINO and NNCF raise their own; e.g. no kernel under a oneDNN cap)
                    out[name] = f"OpenVINO cannot compile it here: {first_line(exc)}"
                    continue
                request = compiled.create_infer_request()
                out[name] = (lambda r: lambda x: _normalise(r.infer([x])[0]))(request)
    return out


def describe(peers: list[str]) -> dict[str, str]:
    """Versions of the peers' packages, and OpenVINO's int8 inference precision here."""
    import importlib.metadata as md

    data: dict[str, str] = {}
    for peer in peers:
        for package in _PACKAGES[peer]:
            try:
                data[package] = md.version(package)
            except md.PackageNotFoundError:
                data[package] = "not installed"
    if "openvino" in peers:
        data["openvino_int8_hint"] = "bf16" if cpu_has_bf16() else "f32"
    return data


# -- text towers (bench_search.py --text-precisions onnxruntime,openvino) --------------------------


def export_text(model_dir: Path, dest: Path) -> Path:
    """``CLIPTextModelWithProjection`` of ``model_dir`` as ONNX (``input_ids``, ``attention_mask``
    -> ``text_embeds``; batch and length dynamic), at ``dest`` (kept if there): retrieval's own
    export (:func:`retrieval.encoders.runtime.export.export_text`), so the peers run the graph
    our exact text path runs."""
    if dest.is_file():
        return dest
    import json

    from retrieval.encoders.runtime.export import export_text as export

    config = json.loads((model_dir / "config.json").read_text())
    eos = config.get("text_config", config).get("eos_token_id", 49407)
    return export(model_dir, dest, str(model_dir), int(eos))


def text_embedder(peer: str, model_dir: Path, work_dir: Path, threads: int) -> Callable[[list[str]], np.ndarray]:
    """``embed(texts) -> normalised vectors`` on ``peer``'s fp32 text tower (the checkpoint's own
    tokenizer, as the Hugging Face row uses it), or raises ``RuntimeError`` with why it cannot run."""
    missing = peer_missing(peer)
    if missing is not None:
        raise RuntimeError(missing)
    from transformers import AutoTokenizer

    path = export_text(model_dir, work_dir / "text.onnx")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if peer == "onnxruntime":
        session = ort_session(path, threads)

        def run(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            return session.run(None, {"input_ids": ids, "attention_mask": mask})[0]  # type: ignore[no-any-return]
    else:
        compiled, _hint = ov_compiled(path, threads)
        request = compiled.create_infer_request()

        def run(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            return request.infer({"input_ids": ids, "attention_mask": mask})[0]  # type: ignore[no-any-return]

    def embed(texts: list[str]) -> np.ndarray:
        batch = tokenizer(texts, padding=True, truncation=True, return_tensors="np")
        ids = batch["input_ids"].astype(np.int64)
        return _normalise(run(ids, batch["attention_mask"].astype(np.int64)))

    return embed
