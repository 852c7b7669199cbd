"""Image queries on an index's recorded tower, reopened without torch's model
(retrieval.encoders.recorded_tower): the same vectors bit for bit as the full encoder, a cold
process that imports neither transformers nor torchvision, and every case where the full
encoder must take over (nothing remembered, a probe that no longer matches, an unreadable
memory, the runtime or the model named otherwise)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the [onnx] extra is not installed")
pytest.importorskip("torch")

from imagegen import make_jpegs  # noqa: E402

from indexer import build_index  # noqa: E402
from retrieval import ImageIndex  # noqa: E402
from retrieval.encoders import chooser as CH  # noqa: E402
from retrieval.encoders import memo as M  # noqa: E402
from retrieval.encoders.recorded_tower import RecordedTower, numpy_pixels, open_recorded  # noqa: E402
from retrieval.encoders.runtime import export as E  # noqa: E402
from retrieval.encoders.runtime import image as IR  # noqa: E402
from retrieval.errors import ModelMismatchError  # noqa: E402
from retrieval.images import PreprocessConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("recorded") / "photos"
    make_jpegs(root, 6, size=(160, 120))
    return root


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(E.ONNX_CACHE_ENV, str(tmp_path_factory.getbasetemp() / "onnx-cache-recorded"))
    monkeypatch.delenv(CH.RUNTIME_ENV, raising=False)


def _built(model: Path, photos: Path, dest: Path, precision: str = "fp32") -> ImageIndex:
    """An index whose images ran on a runtime (its checks remembered); skips where none passed here."""
    build_index(photos, dest, model=str(model), workers=0, device="cpu", precision=precision)
    index = ImageIndex.open(dest)
    runtime = index.manifest.model_info.get("image_runtime")
    if runtime not in IR.RUNTIMES:
        pytest.skip(f"no runtime runs the {precision} tower on this CPU ({runtime}: {index.manifest.model_info.get('image_runtime_note')})")
    return index


def _full_path_vector(dest: Path, image: Path, monkeypatch: pytest.MonkeyPatch) -> np.ndarray:
    with monkeypatch.context() as mp:
        mp.setenv(M.CHECKS_ENV, "off")
        index = ImageIndex.open(dest)
        vector = index.encoders.embed_image(image)
        assert index.encoders.image_path()["tower"] == "encoder"
    return vector


def test_an_image_query_reopens_the_recorded_tower_and_matches_the_full_encoder(
    tiny_model: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = _built(tiny_model, photos, tmp_path / "a.idx")
    image = index.files.path(2)
    hit = index.search_image(image, k=1)[0]
    path = index.encoders.image_path()
    assert path["tower"] == "recorded" and index._queries.loaded_encoder is None, path
    assert isinstance(index._queries.image_encoder, RecordedTower)
    assert hit.id == 2 and hit.score == pytest.approx(1.0, abs=1e-6)
    vector = index.encoders.embed_image(image)
    assert np.array_equal(vector, _full_path_vector(tmp_path / "a.idx", image, monkeypatch))
    assert np.array_equal(vector[0], index.vectors.embeddings()[2])


def test_a_cold_process_imports_neither_torch_nor_transformers(
    tiny_model: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = _built(tiny_model, photos, tmp_path / "c.idx")
    image = index.files.path(1)
    script = (
        "import sys, json; from retrieval import ImageIndex; "
        f"i = ImageIndex.open({str(tmp_path / 'c.idx')!r}); v = i.embed_image({str(image)!r}); "
        "print(json.dumps({'v': [float(x) for x in v[0]], 'path': i.image_path(), "
        "'modules': [m for m in ('torch', 'transformers', 'torchvision') if m in sys.modules]}))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True, timeout=300)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # torch too where the numpy preprocessing is torch's bit for bit (bicubic: every CPU).
    unwanted = [] if numpy_pixels(PreprocessConfig.from_dict(index.manifest.preprocess)) else ["torch"]
    assert got["path"]["tower"] == "recorded" and got["modules"] == unwanted, got
    expected = _full_path_vector(tmp_path / "c.idx", image, monkeypatch)[0]
    assert np.array_equal(np.asarray(got["v"], dtype=np.float32), expected)


def test_the_cli_answers_the_same_from_the_recorded_tower(tiny_model: Path, photos: Path, tmp_path: Path) -> None:
    index = _built(tiny_model, photos, tmp_path / "cli.idx")
    image = str(index.files.path(3))

    def search(*env: tuple[str, str]) -> list[dict[str, object]]:
        run_env = {**os.environ, "PYTHONPATH": str(ROOT), **dict(env)}
        cmd = [sys.executable, "-m", "clipsearch", "search", str(tmp_path / "cli.idx"), "--image", image, "--json"]
        out = subprocess.run(cmd, capture_output=True, text=True, env=run_env, check=True, timeout=300)
        return list(json.loads(out.stdout)["results"])

    recorded, full = search(), search((M.CHECKS_ENV, "off"))
    assert recorded == full and recorded[0]["path"] == Path(image).name


def test_without_remembered_checks_the_full_encoder_runs_and_remembers_them(
    tiny_model: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = _built(tiny_model, photos, tmp_path / "n.idx")
    image = index.files.path(0)
    monkeypatch.setenv(M.CHECKS_ENV, str(tmp_path / "fresh.json"))  # another machine's memory: empty
    first = ImageIndex.open(tmp_path / "n.idx")
    v1 = first.encoders.embed_image(image)
    assert first.encoders.image_path()["tower"] == "encoder"
    assert "no remembered checks" in str(first.encoders.image_path()["reason"])
    second = ImageIndex.open(tmp_path / "n.idx")  # the full encoder's checks were remembered
    assert np.array_equal(second.encoders.embed_image(image), v1)
    assert second.encoders.image_path()["tower"] == "recorded"


def test_a_probe_that_no_longer_matches_or_an_unreadable_memory_sends_it_to_the_full_encoder(
    tiny_model: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = _built(tiny_model, photos, tmp_path / "p.idx")
    image = index.files.path(4)
    expected = _full_path_vector(tmp_path / "p.idx", image, monkeypatch)
    memory = Path(os.environ[M.CHECKS_ENV])
    data = json.loads(memory.read_text())
    for entry in data.values():
        entry["probe"][0] = float(np.nextafter(np.float32(entry["probe"][0]), np.float32(2)))
    memory.write_text(json.dumps(data))
    tampered = ImageIndex.open(tmp_path / "p.idx")
    assert np.array_equal(tampered.encoders.embed_image(image), expected)
    assert "no longer gives the remembered probe vector" in str(tampered.encoders.image_path()["reason"])

    memory.write_text("{not json")
    broken = ImageIndex.open(tmp_path / "p.idx")
    assert np.array_equal(broken.encoders.embed_image(image), expected)
    assert broken.encoders.image_path()["tower"] == "encoder"
    assert isinstance(json.loads(memory.read_text()), dict)  # rewritten by the full encoder's checks


def test_settings_that_leave_image_queries_to_the_full_encoder(
    tiny_model: Path, other_model: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = _built(tiny_model, photos, tmp_path / "s.idx")
    manifest, model = index.manifest, str(tiny_model)
    assert isinstance(open_recorded(manifest, model, "cpu"), RecordedTower)
    assert "runs images with torch" in str(open_recorded(manifest, model, "cuda"))
    assert "not the index's" in str(open_recorded(manifest, str(other_model), "auto"))
    monkeypatch.setenv(CH.RUNTIME_ENV, "torch")
    assert "torch asked for" in str(open_recorded(manifest, model, "auto"))
    # Another model named for queries is still refused by the full encoder, with its message.
    monkeypatch.delenv(CH.RUNTIME_ENV)
    with pytest.raises(ModelMismatchError, match="model mismatch"):
        ImageIndex.open(tmp_path / "s.idx", model=str(other_model)).search_image(index.files.path(0), k=1)
    # A tower that loads and then raises on the probe image (a kernel missing here) is not reopened.
    runtime = str(manifest.model_info["image_runtime"])

    def raising(path: Path, mode: str, group: int) -> IR.Tower:
        def tower(x: object) -> np.ndarray:
            raise RuntimeError("Exception from src/inference/src/cpp/infer_request.cpp:224:\nno kernel for this node")

        return tower

    monkeypatch.setitem(IR.RUNTIMES, runtime, dataclasses.replace(IR.RUNTIMES[runtime], load=raising))
    assert open_recorded(manifest, model, "auto") == "the fp32 tower on " + IR.RUNTIMES[runtime].label + (
        " failed on the probe image: no kernel for this node")


@pytest.mark.parametrize(
    "precision",
    [
        pytest.param("bf16", marks=pytest.mark.skipif(
            bool(IR.RUNTIMES["openvino"].missing()) or not CH.tried_here("bf16"),
            reason="OpenVINO's bf16 tower needs the [openvino] extra and a CPU with AMX",
        )),
        pytest.param("int8", marks=pytest.mark.skipif(
            bool(IR.RUNTIMES["openvino"].missing("int8")) or not CH.tried_here("int8"),
            reason="OpenVINO's int8 tower needs the [openvino] extra (with nncf) and a CPU at the AVX-512 VNNI level",
        )),
    ],
)
def test_a_reduced_index_on_openvino_is_reopened_bit_for_bit(
    precision: str, tiny_model: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = _built(tiny_model, photos, tmp_path / "r.idx", precision=precision)
    assert index.manifest.model_info["precision"] == precision
    image = index.files.path(5)
    vector = index.encoders.embed_image(image)
    assert index.encoders.image_path()["tower"] == "recorded"
    assert np.array_equal(vector, _full_path_vector(tmp_path / "r.idx", image, monkeypatch))
    assert np.array_equal(vector[0], index.vectors.embeddings()[5])


def test_an_update_with_the_same_tower_shares_it(tiny_model: Path, photos: Path, tmp_path: Path) -> None:
    files = sorted(p.name for p in photos.iterdir())
    common = dict(model=str(tiny_model), workers=0, device="cpu", precision="fp32")
    build_index(photos, tmp_path / "u.idx", files=files[:3], **common)
    if ImageIndex.open(tmp_path / "u.idx").manifest.model_info.get("image_runtime") not in IR.RUNTIMES:
        pytest.skip("no runtime runs the fp32 tower on this CPU")
    index = ImageIndex.open(tmp_path / "u.idx")
    index.search_image(index.files.path(0), k=1)
    build_index(photos, tmp_path / "u.idx", **common)
    later = index.reopen()
    assert later is not index and later._queries.image_encoder is index._queries.image_encoder
    later.search_image(later.files.path(4), k=1)
    assert later.encoders.image_path()["tower"] == "recorded"


def test_the_memory_ignores_a_path_it_cannot_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(M.CHECKS_ENV, str(blocker / "checks.json"))  # its parent is a file
    M.record_check("k", M.PassedChecks({"images": 1.0}, np.ones(3, dtype=np.float32)))
    assert M.lookup_check("k") is None
    monkeypatch.setenv(M.CHECKS_ENV, str(tmp_path / "ok.json"))
    probe = np.asarray([0.1, -1e-8, 3.4028235e38], dtype=np.float32)
    M.record_check("k", M.PassedChecks({"images": 1.0}, probe, 768))
    got = M.lookup_check("k")
    assert got is not None and np.array_equal(got.probe, probe) and got.int8_group == 768
