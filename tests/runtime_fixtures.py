"""Fixtures and helpers of the image-runtime tests (test_image_runtime.py for the exact tower,
test_image_runtime_reduced.py for bf16 and int8): the photos and their pixels, one export cache
per session, which runtimes this CPU's batch check refuses, and the update-against-rebuild
comparison. conftest.py loads this module as a plugin, so its fixtures are everyone's; a module
that uses them marks its tests ``usefixtures("runtime_cache")`` and imports the helpers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from helpers import folder_pixels
from imagegen import make_jpegs

from indexer import build_index
from retrieval import ImageIndex
from retrieval.encoders import HFClipEncoder, cpu
from retrieval.encoders import chooser as CH
from retrieval.encoders.runtime import export as E
from retrieval.encoders.runtime import image as IR
from retrieval.errors import ModelLoadError

if TYPE_CHECKING:
    import torch

needs_openvino = pytest.mark.skipif(bool(IR.RUNTIMES["openvino"].missing()), reason="the [openvino] extra is not installed")
# A oneDNN ISA cap below the CPU (ONEDNN_MAX_CPU_ISA, to make a machine act as a smaller one)
# leaves OpenVINO's reduced towers without kernels for some nodes: they fail on their first
# images, and the chooser falls back (test_a_tower_that_fails_on_its_first_images_is_passed_over).
ONEDNN_CAPPED = cpu.kernel_level() != cpu.detected_level()
needs_ov_int8 = pytest.mark.skipif(
    bool(IR.RUNTIMES["openvino"].missing("int8")) or not CH.tried_here("int8") or ONEDNN_CAPPED,
    reason="OpenVINO's int8 tower needs the [openvino] extra (with nncf) and a CPU at the AVX-512 VNNI level "
    "(with AMX torch's int8 runs: OpenVINO's moved with the batch there), without a oneDNN ISA cap below it",
)
needs_ov_bf16 = pytest.mark.skipif(
    bool(IR.RUNTIMES["openvino"].missing()) or not CH.tried_here("bf16") or ONEDNN_CAPPED,
    reason="OpenVINO's bf16 tower needs the [openvino] extra and a CPU with AMX, without a oneDNN ISA cap below it",
)
# Each runtime whose package is installed (make install installs both).
RUNTIMES = [
    pytest.param(name, marks=pytest.mark.skipif(bool(IR.RUNTIMES[name].missing()), reason=f"{name} is not installed"))
    for name in [c.runtime for c in CH.candidates("image", "fp32")]
]


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("onnx") / "photos"
    make_jpegs(root, 12, size=(160, 120))
    return root


@pytest.fixture(scope="module")
def pixels(tiny_model: Path, photos: Path) -> torch.Tensor:
    return folder_pixels(photos, HFClipEncoder.load(str(tiny_model), device="cpu").preprocess)


@pytest.fixture
def runtime_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One export cache for the session's worker (exports are what is slow), never the user's."""
    path = tmp_path_factory.getbasetemp() / "onnx-cache-test"
    monkeypatch.setenv(E.ONNX_CACHE_ENV, str(path))
    monkeypatch.delenv(CH.RUNTIME_ENV, raising=False)
    return path


@pytest.fixture(scope="module")
def refused_here(tiny_model: Path, pixels: torch.Tensor, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The runtimes whose batch check fails on this CPU, with why (``openvino-int8`` and
    ``openvino-bf16`` for its reduced towers): OpenVINO's fp32 vectors moved with the batch on an
    AVX2 host, its int8 ones with AMX, and there auto rightly passes them over. Any other failure
    to run is not excused: the tests that ask for the runtime fail on it."""
    refused: dict[str, str] = {}
    tries = [(name, name, "fp32") for name in [c.runtime for c in CH.candidates("image", "fp32")] if not IR.RUNTIMES[name].missing()]
    if not IR.RUNTIMES["openvino"].missing("int8"):
        tries.append(("openvino-int8", "openvino", "int8"))
    if not IR.RUNTIMES["openvino"].missing():
        tries.append(("openvino-bf16", "openvino", "bf16"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(E.ONNX_CACHE_ENV, str(tmp_path_factory.getbasetemp() / "onnx-cache-test"))
        for key, name, precision in tries:
            mp.setenv(CH.RUNTIME_ENV, name)
            try:
                HFClipEncoder.load(str(tiny_model), device="cpu", precision=precision).embed_pixels(pixels[:4])
            except ModelLoadError as exc:
                if "change with the batch" in str(exc):
                    refused[key] = str(exc)
    return refused


def usable(runtime: str, refused: dict[str, str]) -> None:
    """Skip a test that needs ``runtime`` to run the tower where its batch check refuses it on
    this CPU (the refusal itself is tested with a simulated drift, on every CPU)."""
    if runtime in refused:
        pytest.skip(f"{runtime} does not pass its batch check on this CPU: {refused[runtime]}")


def encoder_on(
    model: Path, runtime: str, monkeypatch: pytest.MonkeyPatch, pixels: torch.Tensor, precision: str = "fp32"
) -> HFClipEncoder:
    """An encoder of ``model`` in ``precision`` whose tower's runtime was chosen with
    ``CLIPSEARCH_IMAGE_RUNTIME=runtime`` (on the first 4 images)."""
    monkeypatch.setenv(CH.RUNTIME_ENV, runtime)
    enc = HFClipEncoder.load(str(model), device="cpu", precision=precision)
    enc.embed_pixels(pixels[:4])  # the runtime is chosen here
    return enc


def vectors_by_path(index: ImageIndex) -> np.ndarray:
    order = np.argsort([r["path"] for r in index.rows(range(len(index)))])
    return index.vectors.embeddings()[order]


def update_and_rebuild(model: Path, photos: Path, tmp_path: Path, precision: str) -> tuple[ImageIndex, ImageIndex]:
    """An index of 5 photos updated with the rest (``u.idx``) and one built at once (``r.idx``),
    in other batch sizes."""
    files = sorted(p.name for p in photos.iterdir())
    common = dict(model=str(model), workers=0, device="cpu", precision=precision)
    build_index(photos, tmp_path / "u.idx", files=files[:5], batch_size=3, **common)
    build_index(photos, tmp_path / "u.idx", batch_size=4, **common)
    build_index(photos, tmp_path / "r.idx", batch_size=16, **common)
    return ImageIndex.open(tmp_path / "u.idx"), ImageIndex.open(tmp_path / "r.idx")


def updated_equals_rebuilt(u: ImageIndex, r: ImageIndex, runtime: str) -> None:
    """The updated index ``u`` holds the rebuilt ``r``'s vectors, and an image query against it
    runs on ``runtime`` and finds the image itself."""
    np.testing.assert_array_equal(vectors_by_path(u), vectors_by_path(r))
    hit = u.search_image(u.files.path(0), k=1)[0]
    assert hit.id == 0 and hit.score == pytest.approx(1.0, abs=1e-6)
    assert u.encoders.image_path()["runtime"] == runtime
