"""Smoke tests of the benchmark scripts on tiny inputs (seconds, not minutes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from imagegen import photo_like
from runtime_fixtures import ONEDNN_CAPPED

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_cli  # noqa: E402
import bench_duplicates  # noqa: E402
import bench_index  # noqa: E402
import bench_int8  # noqa: E402
import bench_query  # noqa: E402
import bench_relevance  # noqa: E402
import bench_search  # noqa: E402
import bench_serve  # noqa: E402
import eval_retrieval  # noqa: E402


def _json_line(out: str) -> dict:
    return json.loads(out.splitlines()[0])


def _coco_like(tmp_path: Path) -> tuple[Path, Path]:
    """Images root with val2014/ JPEGs and a Karpathy file: 3 test images, one train image."""
    root = tmp_path / "coco"
    (root / "val2014").mkdir(parents=True)
    images = []
    for i, split in enumerate(["test", "train", "test", "test"]):
        name = f"COCO_val2014_{i:012d}.jpg"
        photo_like(96, 64, seed=i).save(root / "val2014" / name, quality=85)
        n = 6 if i == 0 else 5
        sentences = [{"raw": f"photo {i} caption {j}", "tokens": []} for j in range(n)]
        images.append({"filepath": "val2014", "filename": name, "split": split, "sentences": sentences, "imgid": i})
    karpathy = tmp_path / "dataset_coco.json"
    karpathy.write_text(json.dumps({"images": images, "dataset": "coco"}))
    return karpathy, root


def _text_to_image_metrics(index_dir: Path, model: Path, queries: list[dict]) -> tuple[float, float]:
    """Recall@1 and MRR worked out here: the stored image vectors, the captions embedded with
    the same model in fp32 (as eval_retrieval loads it), scores in float64, ties by id."""
    from retrieval import ImageIndex
    from retrieval.encoders import load_encoder

    index = ImageIndex.open(index_dir, device="cpu")
    paths, images = index.metadata.paths(), index.vectors.embeddings().astype(np.float64)
    texts = load_encoder(str(model), device="cpu").embed_texts([q["query"] for q in queries]).astype(np.float64)
    hits, reciprocal = 0, 0.0
    for vector, query in zip(texts, queries, strict=True):
        scores = images @ vector
        ranking = sorted(range(len(paths)), key=lambda j: (-scores[j], j))
        first = next(r for r, j in enumerate(ranking, 1) if paths[j] in query["relevant"])
        hits += first == 1
        reciprocal += 1 / first
    return hits / len(queries), reciprocal / len(queries)


def test_eval_retrieval_karpathy_build_update_rebuild(
    tmp_path: Path, tiny_model: Path, other_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("retrieval.tools.evaluation")
    karpathy, root = _coco_like(tmp_path)
    index_dir = tmp_path / "eval" / "coco.idx"
    base = ["--karpathy", str(karpathy), "--images", str(root), "--index-dir", str(index_dir), "--device", "cpu", "--workers", "0"]

    assert eval_retrieval.main([*base, "--model", str(tiny_model)]) == 0
    first = _json_line(capsys.readouterr().out)
    assert (first["dataset"], first["split"], first["n_images"], first["n_queries"]) == ("coco", "test", 3, 15)
    assert first["captions_per_image"] == 5 and first["reference"] is None
    assert first["index"]["embedded"] == 3 and not first["index_rebuilt"]
    assert first["metrics"]["queries"] == 15
    queries = Path(first["queries_file"]).read_text().splitlines()
    assert json.loads(queries[0]) == {"query": "photo 0 caption 0", "relevant": ["val2014/COCO_val2014_000000000000.jpg"]}
    recall_1, mrr = _text_to_image_metrics(index_dir, tiny_model, [json.loads(q) for q in queries])
    assert first["metrics"]["recall@1"] == pytest.approx(recall_1, abs=1e-12)
    assert first["metrics"]["mrr"] == pytest.approx(mrr, abs=1e-12)
    assert Path(first["queries_file"]).parent == index_dir.parent

    # Same model: the index is brought up to date in place, nothing is embedded again.
    assert eval_retrieval.main([*base, "--model", str(tiny_model), "--k", "1,2", "--max-captions", "0"]) == 0
    second = _json_line(capsys.readouterr().out)
    assert second["index"]["embedded"] == 0 and second["n_queries"] == 16
    assert "recall@2" in second["metrics"]

    # Another model's weights: rebuilt rather than refused.
    assert eval_retrieval.main([*base, "--model", str(other_model)]) == 0
    third = _json_line(capsys.readouterr().out)
    assert third["index_rebuilt"] and third["index"]["embedded"] == 3


def test_eval_retrieval_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "caps.jsonl"
    bad.write_text('{"path": "a.png", "caption": "ok"}\n{"path": "b.png"}\n')
    code = eval_retrieval.main(["--captions", str(bad), "--images", str(tmp_path), "--model", str(tmp_path / "nomodel")])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("eval_retrieval: error: ") and "caps.jsonl:2: no caption key" in err
    assert len(err.strip().splitlines()) == 1


def test_reference_only_for_known_model_dataset_and_split() -> None:
    ref = eval_retrieval.reference_for("coco", "test", "openai/clip-vit-base-patch32")
    assert ref is not None and (ref["recall@1"], ref["recall@5"], ref["recall@10"]) == (0.3044, 0.5594, 0.6687)
    assert eval_retrieval.reference_for("flickr30k", "test", "open_clip:ViT-B-32/openai")["recall@5"] == 0.8356
    assert eval_retrieval.reference_for("flickr30k", "test", "/ckpt/clip-vit-base-patch32/")["recall@1"] == 0.5878
    assert eval_retrieval.reference_for("coco", "val", "openai/clip-vit-base-patch32") is None
    assert eval_retrieval.reference_for("coco", "test", "openai/clip-vit-large-patch14") is None
    assert eval_retrieval.reference_for("demo", "test", "openai/clip-vit-base-patch32") is None


def test_bench_cli_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = bench_cli.main(["--preset", "tiny", "--images", "3", "--runs", "1", "--warmup", "0", "--work-dir", str(tmp_path)])
    assert code == 0
    result = _json_line(capsys.readouterr().out)
    assert result["count"] == 3 and result["text_path"]["path"] == "numpy"
    assert set(result["commands"]) == {
        "search", "search (int8)", "search (torch)", "search --image", "search --image (full)", "info", "hf script"
    }
    for row in result["commands"].values():
        assert row["runs"] == 1 and row["wall_s"]["median"] > 0 and row["peak_rss_mb"]["median"] > 0
    # The numpy text path imports no torch: it must take less memory than the torch path.
    assert result["commands"]["search"]["peak_rss_mb"]["median"] < result["commands"]["search (torch)"]["peak_rss_mb"]["median"]
    assert result["goal"]["seconds"] is None and result["goal"]["fraction_of_hf"] > 0
    assert "cpu_level" in result["machine"]
    assert list(tmp_path.iterdir()) == []  # the temp work dir is removed


def test_bench_query_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = bench_query.main(
        ["--preset", "tiny", "--sizes", "300,700", "--queries", "3", "--warmup", "1", "--commit-every", "256", "--work-dir", str(tmp_path)]
    )
    assert code == 0
    result = _json_line(capsys.readouterr().out)
    assert [r["n"] for r in result["sizes"]] == [300, 700]
    big = result["sizes"][1]
    assert big["disk_bytes"]["parts"] == 3 and big["build_seconds"]["commits"] == 3
    assert big["bytes_per_vector"]["faiss"] > 4 * result["dim"]
    for stage in ("encode", "search", "metadata", "end_to_end", "end_to_end_cached"):
        assert big["latency_ms"][stage]["p50"] > 0
    assert list(tmp_path.iterdir()) == []  # the temp work dir is removed


def test_bench_search_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from retrieval import ImageIndex

    # Each type's recall@10 worked out here while its index exists: its answers to the
    # benchmark's queries against exact search in numpy (float64) over the stored vectors.
    recalls: dict[str, float] = {}
    measure = bench_search.measure_type

    def checking_measure(index_dir: Path, queries: np.ndarray, truth: np.ndarray, k: int, *args: object) -> dict:
        index = ImageIndex.open(index_dir)
        stored = index.vectors.embeddings().astype(np.float64)
        overlaps = []
        for q in queries:
            scores = stored @ q.astype(np.float64)
            exact = sorted(range(len(stored)), key=lambda j: (-scores[j], j))[:10]
            _, found = index.vectors.search_ids(q[None], 10)
            overlaps.append(len(set(found[0].tolist()) & set(exact)) / 10)
        recalls[index.info()["index_type"]] = float(np.mean(overlaps))
        return measure(index_dir, queries, truth, k, *args)

    monkeypatch.setattr(bench_search, "measure_type", checking_measure)
    code = bench_search.main(
        ["--preset", "tiny", "--dim", "48", "--sizes", "2000", "--text-precisions", "fp32,hf", "--types", "flat,hnsw,ivf-sq8",
         "--e2e", "flat", "--queries", "20", "--text-queries", "3", "--warmup", "1", "--commit-every", "500", "--work-dir", str(tmp_path)]
    )
    assert code == 0
    out = capsys.readouterr().out
    result = _json_line(out)
    rows = {t["type"]: t for t in result["sizes"][0]["types"]}
    assert rows["flat"]["factory"] == "Flat" and rows["flat"]["recall_at_10"] == 1.0
    assert rows["hnsw"]["factory"] == "HNSW32" and "efSearch" in rows["hnsw"]["search_params"]
    assert rows["ivf-sq8"]["factory"].endswith(",SQ8")
    assert set(recalls) == {row["factory"] for row in rows.values()}
    for row in rows.values():
        assert row["recall_at_10"] == round(recalls[row["factory"]], 4), row["type"]
    assert rows["flat"]["end_to_end_ms"]["fp32"]["p50"] > 0 and "end_to_end_ms" not in rows["hnsw"]
    timed = rows["flat"]["end_to_end_ms"]
    assert rows["flat"]["x_hf_p50"] == {"fp32": round(timed["hf"]["p50"] / timed["fp32"]["p50"], 2)}
    assert "flat end to end against the HF text tower (p50): fp32 " in out
    assert "recall@10" in out and list(tmp_path.iterdir()) == []
    flat = [json.loads(line) for line in out.splitlines()[1:4]]
    assert [f["type"] for f in flat] == ["flat", "hnsw", "ivf-sq8"] and all(f["bench"] == "search-row" for f in flat)
    for f in flat:
        row = rows[f["type"]]
        assert (f["vectors"], f["factory"], f["recall_at_10"]) == (2000, row["factory"], row["recall_at_10"])
        assert (f["p50_ms"], f["p99_ms"]) == (row["search_ms"]["p50"], row["search_ms"]["p99"])
        assert f["rss_open_mb"] == row["open_rss_mb"] and f["rss_after_query_mb"] == row["rss_after_query_mb"]
        assert f["build_s"] == row["build_seconds"] and f["bytes_per_vector"] == row["faiss_bytes_per_vector"]
    assert flat[0]["end_to_end_p50_ms"]["fp32"] == rows["flat"]["end_to_end_ms"]["fp32"]["p50"]



def test_bench_search_text_towers_of_the_peers(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)  # one peer not installed: a skipped entry, not a crash
    code = bench_search.main(
        ["--preset", "tiny", "--dim", "48", "--sizes", "300", "--text-precisions", "fp32,hf,onnxruntime,openvino",
         "--types", "flat", "--e2e", "flat", "--queries", "5", "--text-queries", "3", "--warmup", "1", "--work-dir", str(tmp_path)]
    )
    assert code == 0
    out = capsys.readouterr().out
    row = _json_line(out)["sizes"][0]["types"][0]
    if "onnxruntime" in row.get("text_skipped", {}):
        pytest.skip(f"onnxruntime is not installed: {row['text_skipped']['onnxruntime']}")
    assert row["end_to_end_ms"]["onnxruntime"]["p50"] > 0 and row["text_cosine_to_fp32"]["onnxruntime"]["min"] >= 0.99999
    assert "openvino" not in row["end_to_end_ms"] and "pip install" in row["text_skipped"]["openvino"]
    assert "text path openvino: skipped" in out


def test_bench_search_small_budget_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The row at smoke size: auto under a small --max-memory (a re-ranked index, opened
    # mapped), anonymous RSS at open and after queries, and the text paths side by side.
    code = bench_search.main(
        ["--preset", "tiny", "--dim", "48", "--sizes", "3000", "--types", "auto@100KB", "--e2e", "auto@100KB",
         "--text-precisions", "default,fp32,hf", "--target-recall", "0.8", "--queries", "20", "--text-queries", "3",
         "--warmup", "1", "--commit-every", "1000", "--work-dir", str(tmp_path)]
    )
    assert code == 0
    out = capsys.readouterr().out
    row = _json_line(out)["sizes"][0]["types"][0]
    assert row["type"] == "auto@100KB" and row["factory"].endswith(",Refine(SQfp16)")
    assert row["tuning"]["mapped_bytes"] == 3000 * 48 * 2
    assert row["faiss_mmap"] is True and "re-ranking vectors" in row["faiss_mmap_reason"]
    assert isinstance(row["anon_open_mb"], float) and isinstance(row["anon_after_queries_mb"], float)
    assert set(row["end_to_end_ms"]) == {"default", "fp32", "hf"}
    assert row["text_precision"]["default"]["requested"] == "auto" and row["text_precision"]["fp32"]["mode"] == "fp32"
    cos = row["text_cosine_to_fp32"]
    assert cos["fp32"]["min"] == pytest.approx(1.0, abs=1e-6) and cos["hf"]["min"] >= 0.99999 and cos["default"]["min"] >= 0.99
    flat = json.loads(out.splitlines()[1])
    assert flat["anon_open_mb"] == row["anon_open_mb"] and flat["faiss_mmap"] is True
    assert "anon MB open/q" in out and "text vectors' cosine to fp32" in out


def test_bench_cold_on_a_kept_index(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import bench_cold

    keep = tmp_path / "keep"
    argv = [*_PEER_ARGV, "--types", "ivf-sq4-refine", "--work-dir", str(tmp_path / "work"), "--keep", str(keep)]
    (tmp_path / "work").mkdir()
    assert bench_search.main(argv) == 0
    kept = keep / "synthetic-2000.idx"
    assert kept.is_dir() and list((tmp_path / "work").iterdir()) == []
    capsys.readouterr()
    monkeypatch.setattr(bench_cold, "drop_page_cache", lambda: False)  # not the test machine's page cache
    assert bench_cold.main([str(kept), "--queries", "5"]) == 0
    out = capsys.readouterr().out
    report = _json_line(out)
    passes = report["passes"]
    assert [p["pass"] for p in passes] == list(bench_cold.PASSES) and report["factory"].endswith(",Refine(SQfp16)")
    assert not any(p["dropped"] for p in passes) and all(0 < p["recall_at_10"] <= 1 for p in passes)
    assert 0 < passes[2]["warm_bytes"] < report["faiss_bytes"] and passes[3]["warm_bytes"] == report["faiss_bytes"]
    assert "| cached |" in out
    assert bench_cold.main([str(tmp_path / "nothing")]) == 1
    assert capsys.readouterr().err.startswith(f"bench_cold: error: {tmp_path / 'nothing'}: ")

    # The kept index measured again by bench_search --index: as it stands (type current, no
    # rebuild), its file read through first, text search with a model of the same weights.
    from retrieval import ImageIndex

    before = ImageIndex.open(kept).info()
    again = [*_PEER_ARGV, "--index", str(kept), "--types", "current", "--e2e", "current", "--text-queries", "2", "--cached"]
    assert bench_search.main(again) == 0
    out = capsys.readouterr().out
    result = _json_line(out)
    (size,) = result["sizes"]
    (row,) = size["types"]
    assert size["n"] == 2000 and size["index"] == str(kept) and size["write"] is None and result["cached"]
    assert (row["type"], row["factory"], row["search_params"]) == ("current", before["index_type"], before["search_params"])
    assert row["build_seconds"] is None and row["build_rss_growth_mb"] is None and row["cache_read_seconds"] >= 0
    assert row["faiss_bytes_per_vector"] == round(before["faiss_bytes"] / 2000, 1) and 0 < row["recall_at_10"] <= 1
    assert row["end_to_end_ms"]["fp32"]["p50"] > 0
    assert ImageIndex.open(kept).info()["generation"] == before["generation"]  # not rebuilt, not moved
    assert any(line.split()[:2] == ["2,000", "current"] and " - " in line for line in out.splitlines())
    # Bad --index uses are usage errors in one line, before anything is built.
    for argv, message in (
        ([*_PEER_ARGV, "--index", str(tmp_path / "nothing")], "--index"),
        ([*_PEER_ARGV, "--index", str(kept), "--keep", str(tmp_path / "k2")], "--index measures one in place"),
        ([*_PEER_ARGV, "--index", str(kept), "--dim", "64"], "48-d vectors, not --dim 64"),
    ):
        with pytest.raises(SystemExit) as exc:
            bench_search.main(argv)
        assert exc.value.code == 2 and message in capsys.readouterr().err


# A stand-in for autofaiss, put first on the subprocesses' PYTHONPATH: it reads the .npy folder
# as autofaiss does (files sorted by name, vectors numbered in that order), records what it was
# asked, and returns an exhaustive index (one IVF list) with a search parameter to set, so that
# recall against exact truth must come out 1.0 if the export kept our ids.
_FAKE_AUTOFAISS = """
import glob, json, os
import faiss, numpy as np
__version__ = "0.0-fake"
def build_index(embeddings, **kwargs):
    files = sorted(glob.glob(os.path.join(embeddings, "**", "*.npy"), recursive=True))
    x = np.concatenate([np.load(f) for f in files])
    index = faiss.index_factory(x.shape[1], "IVF1,Flat", faiss.METRIC_INNER_PRODUCT)
    index.train(x)
    index.add(x)
    with open(os.environ["FAKE_AUTOFAISS_CALLS"], "w") as f:
        json.dump({"embeddings": embeddings, "files": [os.path.basename(p) for p in files], **kwargs}, f)
    return index, {"index_key": "IVF1,Flat", "index_param": "nprobe=1", "index_path": None, "nb vectors": len(x)}
"""


def _fake_package(root: Path, body: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``root/autofaiss/__init__.py`` with ``body``, first on PYTHONPATH of every subprocess."""
    (root / "autofaiss").mkdir(parents=True)
    (root / "autofaiss" / "__init__.py").write_text(body)
    monkeypatch.setenv("PYTHONPATH", str(root))


_PEER_ARGV = ["--preset", "tiny", "--dim", "48", "--sizes", "2000", "--text-precisions", "fp32", "--types", "flat", "--e2e", "",
              "--queries", "20", "--text-queries", "0", "--warmup", "1", "--commit-every", "500", "--max-memory", "1GB"]


def test_bench_search_peer_autofaiss_plumbing(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_package(tmp_path / "fake", _FAKE_AUTOFAISS, monkeypatch)
    calls = tmp_path / "calls.json"
    monkeypatch.setenv("FAKE_AUTOFAISS_CALLS", str(calls))
    work = tmp_path / "work"
    work.mkdir()
    code = bench_search.main([*_PEER_ARGV, "--peer", "autofaiss", "--work-dir", str(work), "--peer-memory-available", "8GB"])
    assert code == 0
    out = capsys.readouterr().out
    result = _json_line(out)
    assert result["peers"] == ["autofaiss"]
    rows = {t["type"]: t for t in result["sizes"][0]["types"]}
    ours, peer = rows["flat"], rows["autofaiss"]
    assert set(ours) <= set(peer)  # the same keys, plus the peer's own
    assert peer["factory"] == "IVF1,Flat" and peer["search_params"] == {"nprobe": 1}
    assert peer["recall_at_10"] == 1.0 and ours["recall_at_10"] == 1.0  # ids kept in order by the export
    assert peer["search_ms"]["p50"] > 0 and peer["build_seconds"] > 0 and peer["export_seconds"] >= 0
    assert peer["faiss_bytes_per_vector"] > 48 * 4 and peer["version"] == "0.0-fake" and not peer["mmap"]
    asked = json.loads(calls.read_text())
    # The same budget, in bytes; inner product; k as the neighbours to tune for.
    assert asked["max_index_memory_usage"] == f"{1 << 30}B" and asked["current_memory_available"] == f"{8 << 30}B"
    assert asked["metric_type"] == "ip" and asked["min_nearest_neighbors_to_retrieve"] == 10
    assert asked["max_index_query_time_ms"] == 10.0
    # Several chunks (parts of 500 rows), so recall 1.0 above also proves their order.
    assert len(asked["files"]) > 1 and asked["files"] == sorted(asked["files"])
    assert any(line.split()[:2] == ["2,000", "autofaiss"] and "IVF1,Flat" in line for line in out.splitlines())
    assert list(work.iterdir()) == []  # export, index and temp dir removed


def test_bench_search_peer_autofaiss_real(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    why = bench_search.peer_missing("autofaiss")
    if why is not None:
        pytest.skip(f"autofaiss is not installed ({why}); optional, for benchmarks only: {bench_search.AUTOFAISS_INSTALL}")
    # 1 ms instead of its 10 ms default: autofaiss's parameter search is shorter at a tighter bound.
    code = bench_search.main([*_PEER_ARGV, "--peer", "autofaiss", "--peer-query-time-ms", "1", "--work-dir", str(tmp_path)])
    assert code == 0
    rows = {t["type"]: t for t in _json_line(capsys.readouterr().out)["sizes"][0]["types"]}
    peer = rows["autofaiss"]
    # Below 10,000 vectors autofaiss always picks HNSW and tunes efSearch.
    assert peer["factory"].startswith("HNSW") and peer["search_params"]["efSearch"] >= 16
    assert peer["recall_at_10"] >= 0.9 and peer["tuning"]["nb vectors"] == 2000
    assert list(tmp_path.iterdir()) == []


def test_bench_search_unknown_peer_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_search.main(["--peer", "nonsense"])
    assert exc.value.code == 2 and "unknown peer 'nonsense'" in capsys.readouterr().err


def test_bench_search_peer_not_installed(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # Shadows a real autofaiss if one is installed: the check must not depend on this machine.
    _fake_package(tmp_path / "fake", "raise ModuleNotFoundError(\"No module named 'autofaiss'\")\n", monkeypatch)

    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("wrote an index before checking the peer")

    monkeypatch.setattr(bench_search, "build_synthetic_index", no_work)
    work = tmp_path / "work"
    work.mkdir()
    assert bench_search.main([*_PEER_ARGV, "--peer", "autofaiss", "--work-dir", str(work)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No module named 'autofaiss'" in err[0] and bench_search.AUTOFAISS_INSTALL in err[0]
    assert list(work.iterdir()) == []


def test_bench_int8_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_int8.main(["--preset", "tiny", "--batch", "6", "--reps", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    results = _json_line(out)["results"]
    assert results["fp32"]["x_fp32"] == 1.0 and results["fp32"]["batch_dependence"] < 1e-5
    ours = results["int8 per-row (clipsearch)"]
    assert ours["batch_dependence"] == 0.0 and ours["mean_cosine"] > 0.999
    assert "moves with batch" in out
    assert _json_line(out)["products"] == [] and "int8 product" not in out  # only with --products


def test_bench_int8_products_time_every_linear_shape(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--preset", "tiny", "--batch", "2", "--reps", "1", "--threads", "1", "--products"]
    assert bench_int8.main(argv) == 0
    out = capsys.readouterr().out
    products = _json_line(out)["products"]
    from retrieval.tools.random_model import clip_config

    vision = clip_config("tiny").vision_config
    hidden, inner = vision.hidden_size, vision.intermediate_size
    tokens = (vision.image_size // vision.patch_size) ** 2 + 1
    # Every encoder shape once, with q/k/v's fused product: what the int8 tower multiplies.
    assert sorted((p["in"], p["out"]) for p in products) == sorted(
        {(hidden, hidden), (hidden, 3 * hidden), (hidden, inner), (inner, hidden)})
    for p in products:
        assert p["rows"] == 2 * tokens
        assert p["fp32_gflops"] > 0 and p["int8_product_gops"] > 0 and p["int8_layer_gops"] > 0
        # Every figure follows from the measured times (the rounded GOP/s alone cannot give the
        # ratios exactly: at ~1 GOP/s on a slow host, 0.1 of rounding is 10 %).
        ops = 2.0 * p["rows"] * p["in"] * p["out"]
        assert p["fp32_gflops"] == float(f"{ops / p['fp32_seconds'] / 1e9:.3g}")
        assert p["int8_product_gops"] == float(f"{ops / p['int8_product_seconds'] / 1e9:.3g}")
        assert p["int8_layer_gops"] == float(f"{ops / p['int8_layer_seconds'] / 1e9:.3g}")
        assert p["product_x_fp32"] == round(p["fp32_seconds"] / p["int8_product_seconds"], 2)
        assert p["layer_x_fp32"] == round(p["fp32_seconds"] / p["int8_layer_seconds"], 2)
    assert "int8 product" in out


def test_bench_index_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_index.main(["--preset", "tiny", "--images", "6", "--batch-size", "4", "--modes", "int8,auto", "--workers", "0"]) == 0
    out = capsys.readouterr().out
    result = _json_line(out)
    assert list(result["modes"]) == ["fp32", "int8", "auto"]
    assert result["modes"]["int8"]["gate"]["passed"] and result["modes"]["fp32"]["gate"] is None
    assert result["baseline_images_per_second"] > 0 and "(default: " in out


_PEER_PIPELINES = ["onnxruntime-fp32", "onnxruntime-int8", "openvino-fp32", "openvino-bf16", "openvino-int8"]


def test_bench_index_peers_model_only_rows() -> None:
    import subprocess

    argv = ["--preset", "tiny", "--images", "6", "--batch-size", "4", "--peers", "onnxruntime,openvino", "--skip-builds",
            "--rounds", "1"]
    # In its own process: OpenVINO's thread pools, loaded into the test process, made a later
    # test's forked DataLoader worker take the whole pytest process down (SIGSEGV).
    proc = subprocess.run([sys.executable, str(Path(bench_index.__file__)), *argv], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    rows = {r["pipeline"]: r for r in _json_line(out)["model_only"]["rows"]}
    assert set(rows) == {"naive", "default", "fp32", "fp32-torch", "bf16-torch", "int8-torch", *_PEER_PIPELINES}
    for name, row in rows.items():
        if row.get("skipped"):  # a runtime not installed here, or one a oneDNN ISA cap leaves without kernels: why, no figures
            assert name.startswith(("onnxruntime", "openvino")), row
            assert "pip install" in row["skipped"] or (ONEDNN_CAPPED and " here: " in row["skipped"]), row
            continue
        assert row["images_per_second"] > 0 and row["x_naive"] > 0, row
        assert row["mean_cosine"] >= row["min_cosine"] > 0.99, row
        assert row["page_faults_per_image"] >= 0, row
    assert rows["naive"]["mean_cosine"] == 1.0 and rows["naive"]["x_naive"] == 1.0
    assert rows["fp32-torch"]["image_runtime"] == "torch" and rows["fp32"]["min_cosine"] >= 0.99999
    assert rows["int8-torch"]["image_runtime"] == "torch" and rows["int8-torch"]["precision"] == "int8"
    assert rows["bf16-torch"]["image_runtime"] == "torch" and rows["bf16-torch"]["precision"] == "bf16"
    # Ours never depends on the batch (int8 quantises each row on its own); ONNX Runtime's
    # dynamic int8 takes one activation scale per tensor, so it does.
    assert rows["default"]["batch_dependence"] < 1e-6 and rows["fp32"]["batch_dependence"] < 1e-6
    if not rows["onnxruntime-int8"].get("skipped"):
        assert rows["onnxruntime-int8"]["batch_dependence"] > 1e-5
    assert "model only, steady state" in out and "onnxruntime-fp32" in out and "batch dep" in out and "faults/img" in out


def test_bench_index_peer_not_installed_is_a_skipped_row(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino now fails
    argv = ["--preset", "tiny", "--images", "4", "--batch-size", "4", "--peers", "openvino", "--skip-builds", "--rounds", "1"]
    assert bench_index.main(argv) == 0
    out = capsys.readouterr().out
    rows = {r["pipeline"]: r for r in _json_line(out)["model_only"]["rows"]}
    assert rows["openvino-fp32"]["images_per_second"] is None and "openvino" in rows["openvino-int8"]["skipped"]
    assert "skipped" in out


def test_bench_index_unknown_peer_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_index.main(["--peers", "tensorrt"])
    assert "unknown peer 'tensorrt'" in capsys.readouterr().err


def test_bench_index_siglip_preset(capsys: pytest.CaptureFixture[str]) -> None:
    # SigLIP 2 NaFlex shapes: ours (the default auto included) beside SigLIP's own processor loop.
    argv = ["--preset", "siglip2-naflex-tiny", "--images", "4", "--batch-size", "4", "--modes", "auto", "--workers", "0"]
    assert bench_index.main(argv) == 0
    result = _json_line(capsys.readouterr().out)
    assert result["preset"] == "siglip2-naflex-tiny" and list(result["modes"]) == ["fp32", "auto"]
    assert result["baseline_images_per_second"] > 0 and result["modes"]["auto"]["gate"]["mean_cosine"] > 0.99


def test_bench_index_steady_state_is_the_marginal_rate(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--preset", "tiny", "--images", "8", "--batch-size", "4", "--modes", "int8", "--workers", "0", "--steady"]
    assert bench_index.main(argv) == 0
    out = capsys.readouterr().out
    result = _json_line(out)
    base = result["baseline_steady_images_per_second"]
    for mode in ("fp32", "int8"):
        steady = result["modes"][mode]["steady"]
        assert steady["half_images"] == 4 and steady["half_seconds"] > 0
        rate = bench_index.marginal_rate(8, result["modes"][mode]["seconds"], 4, steady["half_seconds"])
        assert steady["images_per_second"] == (None if rate is None else round(rate, 2))
        if rate is not None and base is not None:
            assert steady["speedup"] == round(steady["images_per_second"] / base, 3)
        else:  # the longer run was not slower: no rate rather than a negative or infinite one
            assert steady["speedup"] is None
    assert "steady state: marginal rate between 4 and 8 images" in out


def test_marginal_rate_cancels_fixed_costs_and_refuses_noise() -> None:
    # 2 s of fixed cost + 0.1 s per image: 10 images/s whatever the fixed cost.
    assert bench_index.marginal_rate(100, 12.0, 50, 7.0) == pytest.approx(10.0)
    assert bench_index.marginal_rate(100, 7.0, 50, 7.0) is None  # not slower: noise
    assert bench_index.marginal_rate(100, 6.0, 50, 7.0) is None
    assert bench_index.marginal_rate(50, 12.0, 50, 7.0) is None  # no more images


def test_bench_index_steady_needs_enough_images(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        bench_index.main(["--preset", "tiny", "--images", "2", "--steady"])
    assert info.value.code == 2 and "--steady needs --images >= 4" in capsys.readouterr().err


def test_bench_index_copies_and_baseline_subset(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["--preset", "tiny", "--images", "10", "--unique", "4", "--baseline-images", "3", "--batch-size", "4",
            "--modes", "bf16", "--workers", "0", "--sample-stacks", str(tmp_path / "stacks")]
    assert bench_index.main(argv) == 0
    captured = capsys.readouterr()
    result = _json_line(captured.out)
    assert (result["images"], result["unique_images"], result["baseline_images"]) == (10, 4, 3)
    # The gate compares the distinct images only: copies would tie in the top-10.
    assert result["modes"]["bf16"]["gate"]["samples"] == 4
    # Each build's threads sampled: collapsed stacks, main thread through build_index.
    for mode in ("fp32", "bf16"):
        stacks = result["modes"][mode]["stack_samples"]
        assert stacks["file"] == str(tmp_path / "stacks" / f"stacks-{mode}.txt") and f"stacks of the {mode} build" in captured.err
        lines = Path(stacks["file"]).read_text().splitlines()
        counts = [int(line.rsplit(" ", 1)[1]) for line in lines]
        assert stacks["samples"] >= 1 and sum(counts) >= stacks["samples"] and counts == sorted(counts, reverse=True)
        assert any(line.startswith("MainThread;") and ":build_index:" in line for line in lines)


def test_stack_sampler_sees_a_thread_where_it_waits(tmp_path: Path) -> None:
    import threading

    from _common import StackSampler

    release = threading.Event()

    def parked_here() -> None:
        release.wait(60)

    worker = threading.Thread(target=parked_here, name="parked")
    with StackSampler(interval=0.001) as sampler:
        worker.start()
        for _ in range(60_000):  # until the parked thread has been sampled (at most ~60 s)
            if any(":parked_here:" in stack for stack in list(sampler.counts)):  # list(): one atomic copy
                break
            release.wait(0.001)
        release.set()
        worker.join()
    text = sampler.write(tmp_path / "s.txt").read_text()
    assert any(line.startswith("parked;") and "test_benchmarks.py:parked_here:" in line for line in text.splitlines())
    with pytest.raises(ValueError):
        StackSampler(interval=0)


def test_synthetic_queries_share_the_clusters_but_not_the_vectors() -> None:
    import numpy as np

    spec = bench_query.SyntheticSpec(clusters=4, noise=0.5, seed=1)
    vecs = np.concatenate(list(bench_query.synthetic_chunks(500, 32, spec)))
    queries = bench_query.synthetic_queries(50, 32, spec)
    sims = queries @ vecs.T
    assert sims.max() < 0.9999 and np.median(sims.max(axis=1)) > 0.7


def test_synthetic_vectors_are_clustered_and_normalised() -> None:
    import numpy as np

    spec = bench_query.SyntheticSpec(clusters=4, noise=0.5, seed=1)
    chunks = list(bench_query.synthetic_chunks(1000, 32, spec, rows_per_chunk=300))
    assert [len(c) for c in chunks] == [300, 300, 300, 100]
    vecs = np.concatenate(chunks)
    assert vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, rtol=1e-5)
    # 4 clusters: each vector's nearest neighbours are mostly very close, unlike uniform noise.
    sims = vecs @ vecs.T
    np.fill_diagonal(sims, -1)
    assert np.median(sims.max(axis=1)) > 0.7
    with pytest.raises(ValueError):
        bench_query.SyntheticSpec(clusters=0)


def _serve_rows(out: str) -> list[dict]:
    """bench_serve's row lines, after its record (which holds the same rows)."""
    record, *lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert record["bench"] == "serve-run"
    assert record["rows"] == [{k: v for k, v in r.items() if k not in ("date", "machine")} for r in lines]
    return lines


def test_bench_serve_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Both indexes, every kind, two concurrencies, against real `clipsearch serve` subprocesses.
    args = ["--demo-limit", "24", "--synthetic-n", "3000", "--clients", "1,3", "--requests", "5", "--warmup", "1"]
    code = bench_serve.main([*args, "--distinct", "6", "--baseline-repeat", "1", "--work-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = _serve_rows(out)
    assert [(r["index"], r["kind"], r["clients"]) for r in rows] == [
        (index, kind, clients) for index in ("demo", "synthetic") for kind in bench_serve.KINDS for clients in (1, 3)
    ]
    for r in rows:
        sent = {1: 5, 3: 6}[r["clients"]]  # 5 requests per run, split over the clients, rounded up
        assert (r["errors"], r["mismatches"], r["requests"], r["completed"]) == (0, 0, sent, sent), r
        assert r["statuses"] == {"200": sent} and r["latency_ms"]["p50"] > 0 and r["requests_per_s"] > 0
        assert r["count"] == {"demo": 24, "synthetic": 3000}[r["index"]] and r["dim"] == 128
        assert r["server"]["exit_code"] == 0 and r["server"]["peak_rss_mb"] > 0
        if r["kind"] == "health":
            assert r["in_process_ms"] is None and r["overhead_p50_ms"] is None
        else:
            assert r["in_process_ms"]["p50"] > 0 and r["in_process_ms"]["cpu_ms"] > 0
            # The baseline pairs: 6 distinct queries, one pass, each in-process and over HTTP.
            assert r["paired_server_ms"]["p50"] > 0
            assert r["overhead_p50_ms"] == pytest.approx(r["paired_server_ms"]["p50"] - r["in_process_ms"]["p50"], abs=2e-3)
        assert r["machine"]["cores"] and r["machine"]["cpu"]
    assert "overhead p50" in out and "client CPU ms/req" in out
    assert list(tmp_path.iterdir()) == []  # the temp work dir is removed


def test_bench_serve_workers_and_knn_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # /knn-service answers checked against in-process search, under 1 and 2 server workers.
    args = ["--indexes", "demo", "--demo-limit", "8", "--kinds", "knn_text,knn_vector", "--clients", "2", "--requests", "4"]
    args += ["--warmup", "1", "--distinct", "3", "--baseline-repeat", "1", "--workers", "1,2"]
    code = bench_serve.main([*args, "--work-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = _serve_rows(out)
    assert [(r["workers"], r["kind"]) for r in rows] == [(w, k) for w in (1, 2) for k in ("knn_text", "knn_vector")]
    for r in rows:
        assert (r["errors"], r["mismatches"], r["completed"]) == (0, 0, 4), r
        assert len(r["server"]["rss_mb"]) >= r["workers"] + (r["workers"] > 1) and r["server"]["pss_total_mb"] > 0
    assert "PSS MB" in out


def test_bench_serve_client_counts_every_failure() -> None:
    """The load client against a scripted server: non-200s, a dropped connection and a chunked
    body are counted as they happened, and the run still completes its requests."""
    import asyncio
    import os

    served = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            served += 1
            if served == 3:  # drop the connection without an answer
                writer.close()
                return
            if served % 4 == 0:
                writer.write(b"HTTP/1.1 503 Busy\r\nContent-Length: 2\r\n\r\n{}")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
            await writer.drain()
        writer.close()

    async def scenario() -> bench_serve.LoadResult:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        raw = [bench_serve.Query("GET", "/api/health").encode(f"127.0.0.1:{port}", "t")]
        async with server:
            return await bench_serve.run_load("127.0.0.1", port, raw, 2, 5, 0, 5.0, os.getpid())

    result = asyncio.run(scenario())
    assert served == 10
    assert sum(result.statuses.values()) == 9 and result.statuses[503] == 2
    assert sum(result.exceptions.values()) == 1 and result.errors == 3
    assert len(result.latencies) == 9 and result.wall_s > 0


def test_bench_serve_reports_a_server_that_does_not_start() -> None:
    code = "import sys; print('clipsearch: error: no index here', file=sys.stderr); sys.exit(1)"
    with pytest.raises(RuntimeError, match=r"exit code 1\).*no index here"):
        bench_serve.Server([sys.executable, "-c", code], start_timeout=30)


def test_bench_serve_verification_reports_answers_unlike_in_process() -> None:
    import asyncio

    from retrieval.index import Hit

    answers = [
        b'{"results": [{"id": 2, "score": 0.5}, {"id": 1, "score": 0.25}]}',  # as in-process
        b'{"results": [{"id": 1, "score": 0.25}, {"id": 2, "score": 0.5}]}',  # another order
        b'{"results": [{"id": 2, "score": 0.5}, {"id": 1, "score": 0.2}]}',  # another score
        b'{"error": "no"}',
    ]

    class Index:
        def search(self, text: str, k: int, mode: str | None = None) -> list[Hit]:
            return [Hit(2, "b.png", 0.5), Hit(1, "a.png", 0.25)]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for i, body in enumerate(answers):
            await reader.readuntil(b"\r\n\r\n")
            status = b"200 OK" if i < 3 else b"404 Not Found"
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
        writer.close()

    async def scenario() -> list[str]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        queries = [bench_serve.Query("GET", f"/api/search?q={i}", text=f"q{i}") for i in range(4)]
        async with server:
            return await bench_serve.verify("127.0.0.1", port, queries, None, Index(), 2, 5.0)

    problems = asyncio.run(scenario())
    assert [p.split(":")[0] for p in problems] == ["q1", "q2", "q3"]
    assert "HTTP 404" in problems[2]


def test_bench_duplicates_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = bench_duplicates.main(["--sizes", "3000", "--types", "flat,ivf-sq8", "--dim", "32", "--fraction", "0.02",
                                  "--work-dir", str(tmp_path)])
    assert code == 0
    result = _json_line(capsys.readouterr().out)
    flat, ivf = result["sizes"][0]["types"]
    assert flat["exact"] and flat["planted_pairs"] == 60 and flat["recall"] == 1.0 and flat["unplanted_in_groups"] == 0
    assert not ivf["exact"] and "SQ8" in ivf["factory"] and 0.5 <= ivf["recall"] <= 1.0
    assert list(tmp_path.iterdir()) == []


def test_bench_keywords_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import bench_keywords

    code = bench_keywords.main(["--images", "600", "--dim", "16", "--queries", "5", "--work-dir", str(tmp_path)])
    assert code == 0
    result = _json_line(capsys.readouterr().out)
    rows = {(r["queries"], r["mode"]): r for r in result["rows"]}
    assert set(rows) == {(q, m) for q in ("hit", "miss") for m in ("vector", "keyword", "hybrid")}
    assert all(r["p50_ms"] > 0 for r in rows.values())
    assert rows[("hit", "keyword")]["keyword_found_share"] > 0 and rows[("miss", "keyword")]["keyword_found_share"] == 0
    summary = result["summary"]
    assert summary["keyword_bytes_per_image"] > 0 and summary["rebuild_s"] > 0 and "extend_1pct_s" in summary
    assert set(summary["hybrid_minus_vector_ms"]) == {"hit", "miss"}
    assert list(tmp_path.iterdir()) == []


def test_bench_ocr_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import bench_ocr

    # One sign per row and no build: OCR is slow on CPU.
    code = bench_ocr.main(["--signs", "1", "--sizes", "40", "--engines", "rapidocr", "--index", "0", "--work-dir", str(tmp_path)])
    assert code == 0
    result = _json_line(capsys.readouterr().out)
    rows = result["engines"]
    assert [(r["text_px"], r["jpeg75"]) for r in rows] == [(40, False), (40, True), (0, False)]
    # Three words per sign; PP-OCR may read an O as a 0 on one of them.
    assert rows[0]["word_recall"] >= 0.6 and all(r["images_per_s"] > 0 for r in rows)
    assert bench_ocr.main(["--engines", "nope"]) == 2


def test_bench_ocr_build_rows_add_ocr_without_embedding_again(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import bench_ocr

    code = bench_ocr.main(["--signs", "1", "--sizes", "40", "--engines", "rapidocr", "--index", "1", "--work-dir", str(tmp_path)])
    assert code == 0
    rows = {(r["photos"], r["ocr"]): r for r in _json_line(capsys.readouterr().out)["index"]}
    assert set(rows) == {(kind, ocr) for kind in ("with_text", "without_text") for ocr in ("off", "on", "added later")}
    for kind in ("with_text", "without_text"):
        assert rows[(kind, "off")]["embedded"] == rows[(kind, "on")]["embedded"] == 1 and rows[(kind, "off")]["text_read"] == 0
        later = rows[(kind, "added later")]
        assert later["embedded"] == 0 and later["text_read"] == 1 and later["images_per_s"] > 0
    assert rows[("with_text", "added later")]["with_ocr_text"] == rows[("with_text", "on")]["with_ocr_text"] == 1


def test_bench_shards_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("moto.server")
    import bench_shards

    assert bench_shards.main(["--images", "6", "--per-shard", "4", "--size", "48", "--preset", "tiny", "--rounds", "1",
                              "--ray-write-rows", "0"]) == 0
    out = capsys.readouterr().out
    result = _json_line(out)
    assert [r["source"] for r in result["results"]] == ["folder", "local shards", "S3 shards (moto)"]
    assert all(r["images"] == 6 and r["min_cosine_vs_folder"] >= 0.99999 for r in result["results"])
    assert [r["captions"] for r in result["results"]] == [0, 6, 6]
    assert "vs folder" in out and "CPU:" in out and result["ray_write"] == []


def test_bench_shards_ray_write_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    """Ray's write path, driver-written against actor-written (the same index, checked inside)."""
    pytest.importorskip("ray.data")
    import bench_shards

    assert bench_shards.main(["--ray-write-only", "--ray-write-rows", "200", "--ray-commit-every", "64", "--batch-size", "16",
                              "--rounds", "1", "--ray-actors", "2"]) == 0
    out = capsys.readouterr().out
    rows = _json_line(out)["ray_write"]
    assert [(r["actors"], r["mode"], r["written_by"]) for r in rows] == [
        (2, "driver", "driver"), (2, "driver", "driver"), (2, "actors", "actors")]
    # 200 rows in parts of 64: four parts, three linked after the first (format 4), no merge.
    assert [r["ray_batch"] for r in rows] == [16, 64, 64]
    assert [r["format_version"] for r in rows] == [2, 2, 4] and all(r["parts_before_finish"] == 4 for r in rows)
    assert all(r["stream_rows_per_s"] > 0 for r in rows) and "driver CPU us/row" in out


def test_bench_relevance_measures_the_three_modes(tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from indexer import build_index

    photos = tmp_path / "photos"
    photos.mkdir()
    for i, name in enumerate(["harbour_boat", "red_bus", "forest_path", "IMG_0001"]):
        photo_like(64, 48, seed=i).save(photos / f"{name}.jpg", quality=85)
    build_index(photos, tmp_path / "p.idx", model=str(tiny_model), workers=0, device="cpu", precision="fp32")
    queries = tmp_path / "named.jsonl"
    queries.write_text('{"query": "a boat in the harbour", "relevant": ["harbour_boat.jpg"]}\n'
                       '{"query": "a red bus", "relevant": ["red_bus.jpg"]}\n')
    assert bench_relevance.main(["--index", str(tmp_path / "p.idx"), "--queries", str(queries), "--cache", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    record = _json_line(out)["results"]["named"]
    assert set(record) == {"vector", "hybrid", "keyword"}
    # Every query names its image: the keyword side and the fusion put it first.
    assert record["keyword"]["mrr@10"] == 1.0 and record["hybrid"]["mrr@10"] == 1.0
    assert "| named |" in out and "hybrid - best side" in out
    # The demo's trained set: distinct training captions, each with every image that carries it.
    trained = [json.loads(line) for line in bench_relevance.trained_queries(tmp_path / "t.jsonl").read_text().splitlines()]
    train = set((bench_relevance.DEMO / "splits" / "train.txt").read_text().split())
    assert len(trained) == bench_relevance.TRAINED_QUERIES == len({q["query"] for q in trained})
    assert all(set(q["relevant"]) <= train for q in trained)
    with pytest.raises(SystemExit):  # the demo's sets go with the demo's index
        bench_relevance.main(["--queries", str(queries)])


def test_bench_decode_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    import bench_decode

    assert bench_decode.main(["--photos", "2", "--width", "400", "--height", "300", "--rounds", "1", "--models", "clip-tiny-64"]) == 0
    out = capsys.readouterr().out
    result = _json_line(out)
    assert all(result["speed"][d]["images_per_s"] > 0 for d in ("full", "draft"))
    [row] = result["quality"]
    assert row["model"] == "clip-tiny-64" and 0.99 < row["min_cosine"] <= row["mean_cosine"] <= 1.000001
    assert "draft is" in out and "CPU:" in out
    with pytest.raises(SystemExit):
        bench_decode.main(["--models", "nope"])


def test_harness_record_first_then_table_and_json_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from _harness import Bench

    bench = Bench("bench_x", "Measures x.\n\nMore words.", "seed", "work_dir")
    bench.parser.add_argument("--rows", type=int, default=1)
    out_file = tmp_path / "out" / "x.json"
    args = bench.parse(["--rows", "3", "--work-dir", str(tmp_path), "--json-out", str(out_file)])
    assert (args.rows, args.seed, args.work_dir) == (3, 0, tmp_path) and bench.parser.description == "Measures x."
    with bench.scratch() as work:
        assert work.parent == tmp_path and work.is_dir()
    assert list(tmp_path.iterdir()) == []
    record = bench.report({"bench": "x", "rows": [1, 2, 3]}, ["| a | b |", "| 1 | 2 |"])
    lines = capsys.readouterr().out.splitlines()
    # The record is the first line, whole; the table follows, the machine in words last.
    assert json.loads(lines[0]) == record == json.loads(out_file.read_text())
    assert record["rows"] == [1, 2, 3] and record["machine"]["cores"] and record["date"]
    assert record["command"].startswith("python benchmarks/bench_x.py --rows 3 --work-dir ")
    assert lines[1:4] == ["", "| a | b |", "| 1 | 2 |"] and lines[-1].startswith("CPU: ")
    assert bench.fail("no rows measured") == 1
    assert capsys.readouterr().err == "bench_x: error: no rows measured\n"


def test_harness_shared_options_are_named() -> None:
    from _harness import parser

    with pytest.raises(KeyError):
        parser("bench_x", None, "nonsense")
    assert {"--json-out", "--threads"} <= set(parser("bench_x", None, "threads")._option_string_actions)


def test_bench_faces_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("dlib", reason="the faces extra")
    import bench_faces
    from PIL import Image

    folder = tmp_path / "photos"
    folder.mkdir()
    Image.new("RGB", (200, 150), (90, 90, 90)).save(folder / "nobody1.png")  # no face: a person never found
    people = len(bench_faces.labelled_photos(None))  # the astronaut, and Grace Hopper where matplotlib is installed
    code = bench_faces.main(["--photos", str(folder), "--min-sizes", "32", "--min-scores", "0.5", "--distances", "0.5", "--siblings", "0"])
    assert code == 0
    result = _json_line(capsys.readouterr().out)
    (row,) = result["detection"]
    assert row["views"] == 12 * (people + 1) and row["found"] == 12 * people and row["min_size"] == 32
    (group,) = result["grouping"]
    assert group["true_people"] == people and group["people"] == people and group["precision"] == 1.0
    assert bench_faces.main(["--photos", str(tmp_path / "missing")]) == 1


def test_bench_video_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("av", reason="the video extra")
    import bench_video

    code = bench_video.main(["--seconds", "3", "--heights", "64", "--codecs", "h264,vp9", "--rounds", "1",
                             "--quality-videos", "2", "--queries", "4", "--work-dir", str(tmp_path)])
    assert code == 0
    result = _json_line(capsys.readouterr().out)
    assert [(r["codec"], r["height"]) for r in result["cost"]] == [("h264", 64), ("vp9", 64)]
    for row in result["cost"]:
        # rate keeps one frame a second of a 3 s video; keyframes at most one per keyframe (2 s) plus the start.
        assert row["rate 1 fps"]["frames"] == 3 and 1 <= row["keyframes"]["frames"] <= 3
    assert [r["sampling"] for r in result["quality"]][:2] == ["keyframes (default)", "shots"]
    assert all(0 <= r["right_shot"] <= 1 for r in result["quality"])
    assert bench_video.main(["--seconds", "1"]) == 2
def test_bench_person_filter_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import bench_person_filter

    code = bench_person_filter.main(["--photos", "600", "--dim", "32", "--people", "20", "--queries", "4",
                                     "--work-dir", str(tmp_path)])
    assert code == 0
    result = _json_line(capsys.readouterr().out)
    rows = {r["search"]: r for r in result["rows"]}
    photos_of = result["summary"]["photos_of_named"]
    assert rows["no filter"]["hits"] == 10 and rows["no filter"]["x_no_filter_p50"] == 1.0
    # The filters really select: the rarest person's photos are all there is, the listing stops at k=50.
    assert rows["person, rare"]["hits"] == min(10, photos_of["Carol"])
    assert rows["listing (no query)"]["hits"] == min(50, photos_of["Alice"])
    assert rows["two people, only"]["hits"] <= rows["two people"]["hits"] <= rows["person, popular"]["hits"]
    assert result["summary"]["named"]["Alice"] == "#0"
    assert bench_person_filter.main(["--photos", "5"]) == 2


def test_bench_faces_scores_look_alikes() -> None:
    import bench_faces

    # Two look-alikes (a, b: 0.3 apart) and a third person far away; each person three faces.
    centre = {"a": np.zeros(4), "b": np.array([0.3, 0, 0, 0]), "c": np.array([0, 2.0, 0, 0])}
    faces = [(p, SimpleNamespace(descriptor=(centre[p] + [0, 0, 0.01 * i, 0]).astype(np.float32))) for p in "abc" for i in range(3)]
    loose, strict = bench_faces.grouping_rows(faces, [0.5, 0.2], 2, [("a", "b"), ("a", "c")])[0]
    assert (loose["lookalike_pairs"], loose["lookalike_pairs_merged"], loose["lookalike_merged"]) == (2, 1, 0.5)
    assert (loose["precision"], loose["recall"], loose["people"]) == (0.5, 1.0, 2)  # a and b one person: 18 of its 36 pairs right
    assert (strict["lookalike_pairs_merged"], strict["lookalike_merged"], strict["precision"], strict["ari"]) == (0, 0.0, 1.0, 1.0)


def test_bench_faces_makes_a_sibling(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("dlib", reason="the faces extra")
    import bench_faces
    from PIL import Image

    folder = tmp_path / "photos"
    folder.mkdir()
    twin = bench_faces.labelled_photos(None)[0][1].transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    twin.save(folder / "twin1.png")  # a second person to have a sibling with: the astronaut mirrored
    code = bench_faces.main(["--photos", str(folder), "--min-sizes", "32", "--min-scores", "0.5", "--distances", "0.5",
                             "--siblings", "1"])
    assert code == 0
    result = _json_line(capsys.readouterr().out)
    assert len(result["siblings"]) == 1 and set(result["siblings"][0].split("+")) == {"astronaut", "twin"}
    (group,) = result["grouping"]
    assert group["lookalike_pairs"] == 2 and group["true_people"] == len(bench_faces.labelled_photos(folder)) + 1
