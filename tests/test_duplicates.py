"""Near-duplicate groups: planted copies of real images (byte copy, resized, re-encoded JPEG,
cropped) found with the demo model, pairs equal to brute force on a flat index, an approximate
index missing pairs but never inventing them, filters, the keep rule, and the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_here
from PIL import Image

from indexer import build_index
from indexer.reindex import reindex
from retrieval.duplicates import MAX_PAIRS, components, duplicate_pairs, find_duplicates
from retrieval.errors import InvalidArgumentError
from retrieval.filters import Filter
from retrieval.index import ImageIndex

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo" / "images"
DEMO_MODEL = Path(__file__).resolve().parents[1] / "data" / "models" / "demo-clip"
COPIES = ("bytecopy", "resized", "reencoded", "cropped")


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 demo stamps; the first 4 also as a byte copy, resized to half, re-encoded as JPEG
    (quality 70) and cropped by 5% on each side; indexed with the demo model in fp32."""
    root = tmp_path_factory.mktemp("planted")
    photos = root / "photos"
    photos.mkdir()
    for i, src in enumerate(sorted(DEMO.rglob("*.png"))[::60][:12]):
        shutil.copy(src, photos / f"{i:02d}_orig.png")
        if i >= 4:
            continue
        shutil.copy(src, photos / f"{i:02d}_bytecopy.png")
        with Image.open(src) as im:
            rgba = im.convert("RGBA")
        w, h = rgba.size
        rgba.resize((w // 2, h // 2), Image.Resampling.LANCZOS).save(photos / f"{i:02d}_resized.png")
        flat = Image.new("RGB", rgba.size, "white")
        flat.paste(rgba, mask=rgba.getchannel("A"))
        flat.save(photos / f"{i:02d}_reencoded.jpg", quality=70)
        rgba.crop((w // 20, h // 20, w - w // 20, h - h // 20)).save(photos / f"{i:02d}_cropped.png")
    # fp32: the cosines below must not depend on which mode `auto` picks on this CPU.
    build_index(photos, root / "idx", model=str(DEMO_MODEL), workers=0, device="cpu", precision="fp32")
    return root / "idx"


def test_planted_copies_of_real_images_are_grouped_with_their_original(planted: Path) -> None:
    index = ImageIndex.open(planted)
    report = find_duplicates(index, threshold=0.94)  # clip-retrieval's dedup threshold
    assert report.exact and len(report.groups) == 4
    groups = sorted(sorted([g.keep.path] + [d.path for d in g.duplicates]) for g in report.groups)
    names = [[f"{i:02d}_orig.png"] + [f"{i:02d}_{c}.{'jpg' if c == 'reencoded' else 'png'}" for c in COPIES] for i in range(4)]
    assert groups == [sorted(n) for n in names]
    assert report.images_in_groups == 20
    rows = {r["path"]: r for r in index.rows(range(index.count), columns=("path", "width", "height", "size"))}
    vectors = index.vectors.embeddings()
    for group in report.groups:
        members = [group.keep.path] + [d.path for d in group.duplicates]
        # The kept image: most pixels, then largest file, then first path.
        assert group.keep.path == min(members, key=lambda p: (-rows[p]["width"] * rows[p]["height"], -rows[p]["size"], p))
        assert [d.score for d in group.duplicates] == sorted((d.score for d in group.duplicates), reverse=True)
        for dup in group.duplicates:
            assert dup.score == pytest.approx(float(vectors[group.keep.id] @ vectors[dup.id]), abs=1e-6)
    # A stricter threshold splits off the weakest copies (the crops), never adds images.
    strict = find_duplicates(index, threshold=0.99)
    assert {d.path for g in strict.groups for d in g.duplicates} | {g.keep.path for g in strict.groups} <= {
        p for g in report.groups for p in [g.keep.path] + [d.path for d in g.duplicates]
    }


def test_pairs_equal_brute_force_on_a_flat_index(built_index: Path) -> None:
    index = ImageIndex.open(built_index)
    vectors = index.vectors.embeddings().astype(np.float64)
    sims = vectors @ vectors.T
    for threshold in (0.8, 0.9, 0.97):
        a, b, scores = duplicate_pairs(index, threshold, batch_rows=5)
        ea, eb = np.nonzero(np.triu(sims >= threshold, k=1))
        # Float32 FAISS and float64 numpy may disagree on pairs within 1e-6 of the threshold.
        borderline = np.abs(sims - threshold) < 1e-6
        assert {(x, y) for x, y in zip(a.tolist(), b.tolist(), strict=True)} ^ {
            (x, y) for x, y in zip(ea.tolist(), eb.tolist(), strict=True)
        } <= {(x, y) for x, y in zip(*np.nonzero(borderline), strict=True)}
        assert np.allclose(scores, sims[a, b], atol=1e-6) and np.all(a < b)
    where = Filter(path_glob="*.png")
    allowed = index.metadata.mask(where)
    a, b, _ = duplicate_pairs(index, 0.8, where=where)
    assert allowed[a].all() and allowed[b].all()
    ea, eb = np.nonzero(np.triu((sims >= 0.8) & np.outer(allowed, allowed), k=1))
    assert len(a) == len(ea)


@pytest.mark.parametrize("factory", ["HNSW16,Flat", "IVF4,SQ8", "IVF4,PQ4x4,Refine(SQfp16)"])
def test_an_approximate_index_can_miss_pairs_but_never_invents_them(planted: Path, tmp_path: Path, factory: str) -> None:
    copy = tmp_path / "idx"
    shutil.copytree(planted, copy)
    exact = duplicate_pairs(ImageIndex.open(copy), 0.9)
    reindex(copy, index_type=factory)
    index = ImageIndex.open(copy)
    assert not index.vectors.exact_scores
    a, b, scores = duplicate_pairs(index, 0.9)
    found = set(zip(a.tolist(), b.tolist(), strict=True))
    assert found <= set(zip(exact[0].tolist(), exact[1].tolist(), strict=True))
    assert len(found) >= 0.8 * len(exact[0])
    # Candidates are re-scored against the stored vectors: exact cosines whatever the codes.
    vectors = index.vectors.embeddings().astype(np.float64)
    assert np.allclose(scores, np.einsum("ij,ij->i", vectors[a], vectors[b]), atol=1e-6)


def test_components_link_transitively() -> None:
    got = components(np.array([5, 1, 7, 3, 9, 20]), np.array([6, 2, 8, 5, 10, 9]))
    assert [g.tolist() for g in got] == [[1, 2], [3, 5, 6], [7, 8], [9, 10, 20]]
    chain = np.arange(1000)
    assert [g.tolist() for g in components(chain[:-1][::-1], chain[1:][::-1])] == [chain.tolist()]
    assert components(np.empty(0, np.int64), np.empty(0, np.int64)) == []


def test_bad_thresholds_and_too_many_pairs(built_index: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = ImageIndex.open(built_index)
    for bad in (0, -0.5, 1.01, float("nan"), True, "0.9"):
        with pytest.raises(InvalidArgumentError, match=r"cosine in \(0, 1\]"):
            find_duplicates(index, bad)  # type: ignore[arg-type]
    import retrieval.duplicates as dup

    monkeypatch.setattr(dup, "MAX_PAIRS", 3)
    with pytest.raises(InvalidArgumentError, match="raise the threshold"):
        find_duplicates(index, 0.01)
    assert MAX_PAIRS >= 1_000_000


@pytest.mark.slow
def test_cli_duplicates(planted: Path) -> None:
    out = cli_here(["duplicates", planted, "--threshold", "0.94", "--json"])
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["threshold"] == 0.94 and doc["groups_count"] == 4 and doc["images_in_groups"] == 20
    assert set(doc["groups"][0]) == {"keep", "duplicates"} and set(doc["groups"][0]["keep"]) == {"id", "path"}
    assert set(doc["groups"][0]["duplicates"][0]) == {"id", "path", "score"}
    text = cli_here(["duplicates", planted, "--threshold", "0.94", "--path-glob", "00_*"])
    assert text.returncode == 0 and text.stdout.startswith("1 groups, 5 images in groups"), text.stdout
    assert text.stdout.count("keep    ") == 1
    for bad, code, message in [(["--threshold", "0"], 1, "cosine in (0, 1]"), (["--threshold", "x"], 2, "expected a number")]:
        res = cli_here(["duplicates", planted, *bad])
        assert res.returncode == code and message in res.stderr and res.stderr.count("\n") == 1, res.stderr


def test_hnsw_range_search_over_many_query_blocks_does_not_abort() -> None:
    # FAISS's HNSW range search aborts the process when one call spans more than one block of
    # queries (1e8 / (max_level * d * efSearch) of them): 200 queries at d=512, efSearch=1024.
    import faiss

    from retrieval import faiss_index

    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 512)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x[150:] = x[:150] + 0.01 * rng.standard_normal((150, 512)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    index = faiss.index_factory(512, "HNSW32", faiss.METRIC_INNER_PRODUCT)
    index.add(x)
    index.hnsw.efSearch = 1024
    assert faiss_index.searching._hnsw_range_chunk(index) < 200
    lims, scores, ids = faiss_index.range_search(index, x[:200], 0.9)
    sims = x[:200].astype(np.float64) @ x.T.astype(np.float64)
    for q in range(200):
        found = ids[lims[q] : lims[q + 1]]
        assert set(found.tolist()) <= set(np.flatnonzero(sims[q] >= 0.9 - 1e-6).tolist())
        assert q in found.tolist() and np.all(scores[lims[q] : lims[q + 1]] >= 0.9)
