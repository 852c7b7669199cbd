"""Evaluation: queries files, exact and ANN ranking against brute-force references, reports,
the per-query file and the ``clipsearch eval`` command."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_here, run_cli
from helpers import assert_one_line_error
from imagegen import Collection, photo_like

from clipsearch.cli import main as cli_main
from indexer import build_index
from retrieval import ImageIndex
from retrieval.errors import EvaluationError, InvalidArgumentError, QueriesFileError
from retrieval.tools.evaluation import (
    Query,
    canonical_scores,
    evaluate,
    exact_ranks,
    load_queries,
    parse_ks,
)

TEXTS = ["a dog on a beach", "red", "日本語のテキスト", "a photo of a cat", "sunset over the sea", "x"]


@pytest.fixture(scope="module")
def index(built_index: Path) -> ImageIndex:
    """One open index per module, so the query model loads once; fp32 text, so that evaluate's
    batches (the torch tower) and search (the numpy tower) give the same exact scores."""
    return ImageIndex.open(built_index, device="cpu", precision="fp32")


@pytest.fixture(scope="module")
def dup_index(tmp_path_factory: pytest.TempPathFactory, index: ImageIndex) -> Path:
    """Six images, three of them byte-identical copies of ``a.png`` (ids 0, 1 and 5)."""
    root = tmp_path_factory.mktemp("dups")
    photos = root / "photos"
    (photos / "zz").mkdir(parents=True)
    for name, seed in (("a.png", 1), ("b.png", 2), ("c.png", 3), ("d.png", 4)):
        photo_like(48, 40, seed).save(photos / name)
    shutil.copyfile(photos / "a.png", photos / "a_copy.png")
    shutil.copyfile(photos / "a.png", photos / "zz" / "a_copy2.png")
    out = root / "dups.idx"
    # batch_size=1: every image goes through the model alone, so equal files embed equally.
    build_index(photos, out, batch_size=1, workers=0, device="cpu", encoder=index.encoders.encoder)
    return out


def _exact_scores(emb: np.ndarray, q: np.ndarray) -> list[float]:
    """Correctly rounded dot products: a reference independent of BLAS and of the code tested."""
    q64 = q.astype(np.float64)
    return [math.fsum((row.astype(np.float64) * q64).tolist()) for row in emb]


def _reference_order(emb: np.ndarray, q: np.ndarray) -> list[int]:
    scores = _exact_scores(emb, q)
    return sorted(range(len(emb)), key=lambda i: (-scores[i], i))


def _write_queries(path: Path, lines: list[object]) -> Path:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x, ensure_ascii=False) for x in lines) + "\n", encoding="utf-8")
    return path


# -- queries file --------------------------------------------------------------------------------


def test_load_queries_text_image_and_extra_keys(tmp_path: Path) -> None:
    (tmp_path / "imgs").mkdir()
    photo_like(20, 20, 0).save(tmp_path / "imgs" / "q.png")
    absolute = tmp_path / "abs.png"
    photo_like(20, 20, 1).save(absolute)
    path = tmp_path / "sub" / "queries.jsonl"
    path.parent.mkdir()
    content = "\n".join(
        [
            json.dumps({"query": "a dog", "relevant": ["x/a.jpg", "x/b.jpg", "x/a.jpg"], "id": 7, "category": "pets"}),
            "",
            json.dumps({"image": "../imgs/q.png", "relevant": ["x/c.jpg"]}),
            "   ",
            json.dumps({"image": str(absolute), "relevant": ["x/d.jpg"]}),
        ]
    )
    path.write_bytes(b"\xef\xbb\xbf" + content.replace("\n", "\r\n").encode())  # BOM and CRLF
    queries = load_queries(path)
    assert [q.line for q in queries] == [1, 3, 5]
    assert queries[0] == Query(relevant=("x/a.jpg", "x/b.jpg"), text="a dog", line=1)  # repeat dropped
    assert queries[1].image == tmp_path / "imgs" / "q.png" and queries[1].text is None
    assert queries[2].image == absolute


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("{not json", "not valid JSON"),
        ('["a dog", ["x.jpg"]]', "expected a JSON object, got list"),
        ('{"relevant": ["x.jpg"]}', "found neither"),
        ('{"query": "a", "image": "q.png", "relevant": ["x.jpg"]}', "not both"),
        ('{"query": "   ", "relevant": ["x.jpg"]}', '"query" must be a non-empty text'),
        ('{"query": 5, "relevant": ["x.jpg"]}', '"query" must be a non-empty text'),
        ('{"query": "a dog"}', '"relevant" is missing'),
        ('{"query": "a dog", "relevant": "x.jpg"}', '"relevant" must be a list'),
        ('{"query": "a dog", "relevant": []}', '"relevant" is empty'),
        ('{"query": "a dog", "relevant": ["x.jpg", 3]}', '"relevant"[1] must be a non-empty path string'),
        ('{"query": "a dog", "relevant": [""]}', '"relevant"[0] must be a non-empty path string'),
        ('{"image": "", "relevant": ["x.jpg"]}', '"image" must be a non-empty path'),
        ('{"image": "nowhere.png", "relevant": ["x.jpg"]}', "query image not found"),
    ],
)
def test_bad_query_line_names_file_and_line(tmp_path: Path, line: str, needle: str) -> None:
    path = _write_queries(tmp_path / "q.jsonl", [{"query": "fine", "relevant": ["a.jpg"]}, "", line])
    with pytest.raises(QueriesFileError) as err:
        load_queries(path)
    assert err.value.line == 3
    assert str(err.value).startswith(f"{path}:3: ") and needle in str(err.value), str(err.value)


def test_bad_queries_file(tmp_path: Path) -> None:
    with pytest.raises(QueriesFileError, match="not found"):
        load_queries(tmp_path / "missing.jsonl")
    with pytest.raises(QueriesFileError, match="is a directory"):
        load_queries(tmp_path)
    for content in (b"", b"\n  \n\r\n"):
        (tmp_path / "empty.jsonl").write_bytes(content)
        with pytest.raises(QueriesFileError, match="holds no queries"):
            load_queries(tmp_path / "empty.jsonl")
    (tmp_path / "latin1.jsonl").write_bytes(b'{"query": "caf\xe9", "relevant": ["a"]}\n')
    with pytest.raises(QueriesFileError, match=r":1: not valid UTF-8"):
        load_queries(tmp_path / "latin1.jsonl")


def test_parse_ks() -> None:
    assert parse_ks("1,5,10") == (1, 5, 10)
    assert parse_ks(" 10, 1,5,5 ") == (1, 5, 10)
    for bad in ("", "0", "a", "1,,5", "-1", "1.5", "5,0"):
        with pytest.raises(InvalidArgumentError):
            parse_ks(bad)


# -- exact ranking -------------------------------------------------------------------------------


def test_canonical_scores_ignore_row_position() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, 37)).astype(np.float32)
    q = rng.standard_normal(37).astype(np.float32)
    stacked = np.repeat(x[:1], 9, axis=0)
    assert len(set(canonical_scores(stacked, np.tile(q, (9, 1))).tolist())) == 1
    expected = [math.fsum((row.astype(np.float64) * q.astype(np.float64)).tolist()) for row in x]
    assert canonical_scores(x, np.tile(q, (9, 1))) == pytest.approx(expected, rel=1e-13, abs=1e-14)


def test_exact_ranks_with_many_exact_ties() -> None:
    # Multiples of 1/4 in [-0.5, 0.5]: every dot product is exact in any arithmetic, so the
    # integer reference is the truth, with many ties broken by id.
    rng = np.random.default_rng(3)
    items = rng.integers(-2, 3, size=(40, 6))
    items[7] = items[30] = items[12]  # duplicates too
    queries = rng.integers(-2, 3, size=(5, 6))
    relevant = [np.arange(40)] * 5  # every item: compares the whole ranking
    vectors, qvecs = (items * 0.25).astype(np.float32), (queries * 0.25).astype(np.float32)
    expected = []
    for q in queries:
        scores = items @ q
        order = sorted(range(40), key=lambda i: (-scores[i], i))
        expected.append(np.argsort(order) + 1)

    def source(rows: int):
        return ((s, vectors[s : s + rows]) for s in range(0, len(vectors), rows))

    for chunk_rows, batch_size in ((1, 1), (3, 2), (7, 5), (40, 3), (1000, 256)):
        ranks, top_ids, top_scores = exact_ranks(source, 40, qvecs, relevant, batch_size=batch_size, chunk_rows=chunk_rows, top_n=10)
        for j in range(5):
            assert ranks[j].tolist() == expected[j].tolist(), (chunk_rows, batch_size, j)
            assert top_ids[j].tolist() == list(np.argsort(expected[j])[:10])
            assert top_scores[j].tolist() == (items[top_ids[j]] @ queries[j] * 0.0625).tolist()


def test_exact_ranks_checks_the_stream() -> None:
    vectors = np.eye(4, dtype=np.float32)
    with pytest.raises(EvaluationError, match="expected 5"):
        exact_ranks(lambda rows: [(0, vectors)], 5, vectors[:1], [np.array([0])])
    with pytest.raises(EvaluationError, match="do not stream as expected"):
        exact_ranks(lambda rows: [(0, vectors[:2]), (3, vectors[2:])], 4, vectors[:1], [np.array([0])])
    with pytest.raises(InvalidArgumentError):
        exact_ranks(lambda rows: [(0, vectors)], 4, vectors[:1], [np.array([4])])


def _random_queries(index: ImageIndex, n: int, seed: int) -> list[Query]:
    rng = np.random.default_rng(seed)
    paths = index.metadata.paths()
    queries = [
        Query(relevant=tuple(rng.choice(paths, size=int(rng.integers(1, 4)), replace=False)), text=TEXTS[i % len(TEXTS)], line=i + 1)
        for i in range(n)
    ]
    # a.jpg and the symlink to it are the same file: their embeddings tie.
    queries.append(Query(relevant=("photos/a.jpg", "link_to_photo.jpg"), text="a photo", line=n + 1))
    return queries


def test_exact_evaluation_equals_naive_full_sort(index: ImageIndex) -> None:
    queries = _random_queries(index, 12, seed=0)
    report = evaluate(index, queries)
    emb = index.vectors.embeddings()
    qvecs = index.encoders.encoder.embed_texts([q.text for q in queries])  # one batch, as evaluate does
    paths = index.metadata.paths()
    firsts, ndcgs = [], []
    for q, vec, result in zip(queries, qvecs, report.results, strict=True):
        order = _reference_order(emb, vec)
        position = {item: rank for rank, item in enumerate(order, 1)}
        ranks = [position[paths.index(p)] for p in q.relevant]
        assert list(result.ranks) == ranks, q
        assert [h.id for h in result.top] == order[:10]
        firsts.append(min(ranks))
        dcg = sum(1 / math.log2(r + 1) for r in ranks if r <= 10)
        ndcgs.append(dcg / sum(1 / math.log2(i + 1) for i in range(1, min(len(ranks), 10) + 1)))
    assert report.queries == len(queries) and report.ranking == "exact"
    assert report.mrr == pytest.approx(sum(1 / r for r in firsts) / len(firsts))
    for k in (1, 5, 10):
        assert report.recall[k] == pytest.approx(sum(r <= k for r in firsts) / len(firsts))
    assert report.ndcg == pytest.approx(sum(ndcgs) / len(ndcgs))
    assert report.mean_rank == pytest.approx(np.mean(firsts)) and report.median_rank == np.median(firsts)


def test_chunked_evaluation_gives_identical_results(index: ImageIndex) -> None:
    queries = _random_queries(index, 7, seed=1)
    whole = evaluate(index, queries)
    small = evaluate(index, queries, chunk_rows=3, batch_size=2)
    # Ranks do not depend on chunking (query vectors from 2-query encoder batches may differ
    # in the last bits, which moves scores, not ranks, here).
    assert [r.ranks for r in small.results] == [r.ranks for r in whole.results]
    assert [[h.id for h in r.top] for r in small.results] == [[h.id for h in r.top] for r in whole.results]
    # With the very same vectors, everything is bit-identical.
    qvecs = index.encoders.encoder.embed_texts([q.text for q in queries])
    rel = [np.array([index.metadata.paths().index(p) for p in q.relevant]) for q in queries]
    a = exact_ranks(index.vectors.iter_embeddings, index.count, qvecs, rel)
    b = exact_ranks(index.vectors.iter_embeddings, index.count, qvecs, rel, chunk_rows=3, batch_size=2)
    assert all(np.array_equal(x, y) for x, y in zip(a[0], b[0], strict=True))
    assert np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2])


def test_exact_ranks_agree_with_flat_search_order(index: ImageIndex) -> None:
    everything = tuple(index.metadata.paths())
    queries = [Query(relevant=everything, text=t) for t in TEXTS[:3]]
    report = evaluate(index, queries)
    for q, result in zip(queries, report.results, strict=True):
        hits = index.search(q.text, k=len(index), mode="vector")  # type: ignore[arg-type]  # text queries: q.text is not None
        assert [int(r) for r in result.ranks] == [[h.id for h in hits].index(i) + 1 for i in result.relevant_ids]
        assert [h.id for h in result.top] == [h.id for h in hits[:10]]
        assert [h.score for h in result.top] == pytest.approx([h.score for h in hits[:10]], abs=1e-6)


def test_ties_between_identical_images_go_by_id(dup_index: Path, index: ImageIndex) -> None:
    dups = ImageIndex.open(dup_index, encoder=index.encoders.encoder)
    paths = dups.metadata.paths()
    assert paths == ["a.png", "a_copy.png", "b.png", "c.png", "d.png", "zz/a_copy2.png"]
    emb = dups.vectors.embeddings()
    assert np.array_equal(emb[0], emb[1]) and np.array_equal(emb[0], emb[5])  # same bytes, same vector
    copies = ("a.png", "a_copy.png", "zz/a_copy2.png")
    queries = [Query(relevant=(p,), text="a picture") for p in copies]
    queries += [Query(relevant=tuple(reversed(copies)), text="a picture")]
    queries += [Query(relevant=(p,), image=dup_index.parent / "photos" / "a.png") for p in copies]
    report = evaluate(dups, queries, chunk_rows=2, batch_size=2)
    text_ranks = [r.ranks[0] for r in report.results[:3]]
    assert text_ranks[1] == text_ranks[0] + 1 and text_ranks[2] == text_ranks[0] + 2  # id order
    assert report.results[3].ranks == tuple(reversed(text_ranks)) and report.results[3].first_rank == text_ranks[0]
    hits = [h.id for h in dups.search("a picture", k=6)]
    assert [hits.index(i) + 1 for i in (0, 1, 5)] == text_ranks
    # The image itself as the query: its three copies share the top score; ids decide.
    assert [r.ranks[0] for r in report.results[4:]] == [1, 2, 3]
    assert [h.id for h in report.results[4].top[:3]] == [0, 1, 5]


# -- ANN, missing paths, per-query file -----------------------------------------------------------


def test_ann_equals_exact_within_top_k_on_flat_index(index: ImageIndex) -> None:
    queries = _random_queries(index, 10, seed=2)
    exact = evaluate(index, queries, ks=(1, 3))
    # K = the whole index: the flat FAISS ranking is the exact one, ties included.
    whole = evaluate(index, queries, ks=(1, 3, len(index)), ann=True)
    assert whole.cutoff == len(index)
    assert [r.ranks for r in whole.results] == [r.ranks for r in exact.results]
    assert [[h.id for h in r.top] for r in whole.results] == [[h.id for h in r.top] for r in exact.results]
    assert whole.mrr == pytest.approx(exact.mrr) and whole.ndcg == pytest.approx(exact.ndcg)
    # K = 10: ranks beyond 10 are unknown (inf). FAISS's float32 scores of items tied with the
    # 10th can differ from the canonical scores in the last bits, so those are left out here.
    ann = evaluate(index, queries, ks=(1, 3), ann=True)
    assert ann.ranking == "ann" and ann.cutoff == 10  # max(3, 10)
    for e, a in zip(exact.results, ann.results, strict=True):
        tenth = e.top[9].score
        assert [h.score for h in a.top] == pytest.approx([h.score for h in e.top], abs=1e-6)
        for exact_rank, ann_rank, item in zip(e.ranks, a.ranks, e.relevant_ids, strict=True):
            score = next((h.score for h in e.top if h.id == item), None)
            if score is not None and abs(score - tenth) < 1e-6:
                continue
            assert ann_rank == (exact_rank if exact_rank <= 10 else math.inf)
    firsts = [r.first_rank for r in ann.results]
    assert ann.mrr == pytest.approx(np.mean([1 / f for f in firsts]))  # 1/inf = 0: MRR@10
    assert ann.recall[1] == pytest.approx(np.mean([f <= 1 for f in firsts]))
    summary = ann.to_dict()
    assert summary["ranking"] == "ann" and summary["mrr@10"] == summary["mrr"]
    assert summary["mean_rank"] is None and summary["median_rank"] is None and summary["chance_mean_rank"] is None
    assert set(summary) >= {"recall@1", "recall@3"} and "recall@5" not in summary
    assert summary["chance_mrr"] < exact.chance_mrr  # MRR@10 at chance counts misses as 0


def test_missing_relevant_paths_are_reported(index: ImageIndex) -> None:
    queries = [
        Query(relevant=("photos/a.jpg",), text="complete", line=1),
        Query(relevant=("gone/1.jpg", "gone/2.jpg"), text="all missing", line=2),
        Query(relevant=("gone/3.jpg", "photos/panorama.jpg"), text="one missing", line=3),
    ]
    report = evaluate(index, queries)
    assert report.queries == 2 and [r.query.line for r in report.results] == [1, 3]
    assert report.results[1].relevant == ("photos/panorama.jpg",) and report.results[1].missing == ("gone/3.jpg",)
    assert len(report.results[1].ranks) == 1  # evaluated on the present path only
    summary = report.to_dict()
    assert summary["queries"] == 2 and summary["skipped_queries"] == 1 and summary["missing_relevant"] == 3
    assert summary["skipped"] == [{"line": 2, "query": "all missing", "missing": ["gone/1.jpg", "gone/2.jpg"]}]
    assert summary["partially_missing"] == [{"line": 3, "query": "one missing", "missing": ["gone/3.jpg"]}]
    with pytest.raises(EvaluationError, match="none of the 1 queries"):
        evaluate(index, [queries[1]])


def test_per_query_file(index: ImageIndex, tmp_path: Path) -> None:
    queries = _random_queries(index, 5, seed=4)
    out = tmp_path / "per_query.jsonl"
    report = evaluate(index, queries, ks=(1, 5), per_query_path=out)
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == report.queries == len(queries)
    for line, q, result in zip(lines, queries, report.results, strict=True):
        assert line["line"] == q.line and line["query"] == q.text and line["relevant"] == list(q.relevant)
        first = min(line["ranks"])
        assert line["first_rank"] == first == result.first_rank
        assert line["reciprocal_rank"] == pytest.approx(1 / first)
        assert (line["hit@1"], line["hit@5"]) == (first <= 1, first <= 5) and "hit@10" not in line
        assert [t["rank"] for t in line["top"]] == list(range(1, 11))
        assert [t["id"] for t in line["top"]] == [h.id for h in result.top]
        scores = [t["score"] for t in line["top"]]
        assert scores == sorted(scores, reverse=True)
        for rank, item in zip(line["ranks"], line["relevant"], strict=True):  # consistent with top
            if rank <= 10:
                assert line["top"][rank - 1]["path"] == item
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        evaluate(index, queries, per_query_path=tmp_path / "no" / "such" / "dir.jsonl")


def test_image_queries_relative_to_queries_file(index: ImageIndex, collection: Collection, tmp_path: Path) -> None:
    (tmp_path / "q").mkdir()
    shutil.copyfile(collection.root / "photos" / "a.jpg", tmp_path / "q" / "query.jpg")
    path = _write_queries(
        tmp_path / "queries.jsonl",
        [
            {"image": "q/query.jpg", "relevant": ["photos/a.jpg", "link_to_photo.jpg"]},
            {"query": "a photo", "relevant": ["photos/a.jpg"]},
        ],
    )
    report = evaluate(index, load_queries(path))
    image_result = report.results[0]
    assert image_result.first_rank == 1  # the image itself (or its symlink twin) comes first
    assert image_result.top[0].score == pytest.approx(1.0, abs=1e-4)
    assert image_result.query.describe() == {"image": str(tmp_path / "q" / "query.jpg")}
    (tmp_path / "q" / "query.jpg").write_bytes(b"not an image")
    with pytest.raises(QueriesFileError, match="line 1: cannot decode query image"):
        evaluate(index, load_queries(path))


def test_texts_are_embedded_as_searches_embed_them(built_index: Path, index: ImageIndex, monkeypatch: pytest.MonkeyPatch) -> None:
    # A few queries under the default precision: the one-shot rule keeps the text tower in fp32
    # (no torch, no gate), as for `search`; so the metrics equal fp32's on every CPU level, and
    # the texts never go through the torch encoder when the numpy tower applies.
    queries = _random_queries(index, 4, seed=5)
    few = ImageIndex.open(built_index, device="cpu", text_queries=len(queries))
    assert few.encoders.text_path().path == "numpy"
    monkeypatch.setattr(type(few.encoders.encoder), "embed_texts", lambda *a, **k: pytest.fail("texts went to the torch encoder"))
    got = evaluate(few, queries, ks=(1, 3), batch_size=2).to_dict()
    want = evaluate(index, queries, ks=(1, 3), batch_size=2).to_dict()
    for key in ("mrr", "recall@1", "recall@3", "ndcg@10", "mean_rank"):
        assert got[key] == want[key], key
    assert few.info()["text_precision"]["mode"] == "fp32"


# -- command line --------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_eval_json_and_per_query(built_index: Path, index: ImageIndex, tmp_path: Path) -> None:
    queries = _random_queries(index, 4, seed=5)
    path = _write_queries(tmp_path / "queries.jsonl", [{"query": q.text, "relevant": list(q.relevant)} for q in queries])
    out = tmp_path / "pq.jsonl"
    proc = run_cli(["eval", built_index, path, "--json", "--k", "1,3", "--per-query", out, "--device", "cpu", "--batch-size", "2"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == ""
    summary = json.loads(proc.stdout)  # exactly one object
    assert {"queries", "mrr", "recall@1", "recall@3", "ndcg@10", "mean_rank", "median_rank", "chance_mrr",
            "ranking", "skipped_queries", "missing_relevant", "index_size", "seconds"} <= set(summary)
    assert "recall@5" not in summary and summary["ranking"] == "exact" and summary["queries"] == 5
    api = evaluate(index, queries, ks=(1, 3), batch_size=2).to_dict()
    for key in ("mrr", "recall@1", "recall@3", "ndcg@10", "mean_rank", "median_rank", "chance_mrr"):
        assert summary[key] == pytest.approx(api[key]), key
    assert len(out.read_text().splitlines()) == 5


@pytest.mark.slow
def test_cli_eval_human_table_and_missing_paths(built_index: Path, tmp_path: Path) -> None:
    path = _write_queries(
        tmp_path / "queries.jsonl",
        [
            {"query": "a dog", "relevant": ["photos/a.jpg"]},
            {"query": "a cat", "relevant": ["not/there.jpg"]},
            {"query": "a car", "relevant": ["photos/a.jpg", "also/not/there.jpg"]},
        ],
    )
    proc = cli_here(["eval", built_index, path, "--ann", "--device", "cpu"])
    assert proc.returncode == 0, proc.stderr
    assert "2 queries, ANN ranking (top 10)" in proc.stdout
    for row in ("MRR@10", "Recall@1", "Recall@5", "Recall@10", "nDCG@10", "chance"):
        assert row in proc.stdout
    assert "mean rank" not in proc.stdout  # unknown with ANN ranking
    assert "skipped queries: 1; relevant paths not in the index: 2" in proc.stdout
    assert "line 2: not/there.jpg" in proc.stderr and "line 3: also/not/there.jpg" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--k", "0"], ["--k", "0"]),
        (["--k", "a,5"], ["--k"]),
        (["--queries-missing"], ["missing.jsonl", "not found"]),
    ],
)
def test_cli_eval_bad_input_is_one_line(built_index: Path, tmp_path: Path, args: list[str], needles: list[str]) -> None:
    path = _write_queries(tmp_path / "queries.jsonl", [{"query": "a dog", "relevant": ["photos/a.jpg"]}])
    if args == ["--queries-missing"]:
        path, args = tmp_path / "missing.jsonl", []
    proc = cli_here(["eval", built_index, path, *args])
    assert_one_line_error(proc.returncode, proc.stderr, *needles)
    assert proc.stdout == ""


@pytest.mark.parametrize(
    ("content", "args", "needles"),
    [
        ("", [], ["holds no queries"]),
        ('{"query": "a"}\n', [], [":1:", '"relevant" is missing']),
        ('{"query": "a", "relevant": ["x"]}\n[1]\n', [], [":2:", "expected a JSON object"]),
        ('{"query": "a", "relevant": ["x"]}\n', ["--k", ""], ["--k"]),
        ('{"query": "a", "relevant": ["nope.jpg"]}\n', [], ["none of the 1 queries", "nope.jpg"]),
        ('{"query": "a", "relevant": ["photos/a.jpg"]}\n', ["--per-query", "/no/such/dir/out.jsonl"], ["does not exist"]),
    ],
)
def test_cli_eval_errors_in_process(built_index: Path, tmp_path: Path, capsys, content: str, args: list[str], needles: list[str]) -> None:
    (tmp_path / "q.jsonl").write_text(content, encoding="utf-8")
    code = cli_main(["eval", str(built_index), str(tmp_path / "q.jsonl"), "--device", "cpu", *args])
    captured = capsys.readouterr()
    assert captured.out == ""
    assert_one_line_error(code, captured.err, *needles)


def test_readme_import_paths_re_export_the_evaluation_package() -> None:
    """README documents ``retrieval.evaluate`` and ``retrieval.metrics``; the code lives in
    ``retrieval.tools.evaluation``: the old paths must hand out the very same objects."""
    import retrieval.evaluate as documented
    import retrieval.metrics as documented_metrics
    from retrieval.tools import evaluation

    for name in documented.__all__:
        assert getattr(documented, name) is getattr(evaluation, name), name
    for name in documented_metrics.__all__:
        assert getattr(documented_metrics, name) is getattr(evaluation.metrics, name), name
