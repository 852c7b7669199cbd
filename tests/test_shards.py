"""WebDataset shards on the local disk as a build source (issue 36): the same vectors as a folder
of the same images, captions and img2dataset's fields kept as columns and returned by every
front end, updates and resume by shard, and every bad input as one line and exit 1.

The object-store half (moto's S3 server) is tests/test_shards_s3.py.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_here
from faultctl import run_killed_at
from helpers import assert_one_line_error, cosines
from shardgen import Sample, make_samples, write_folder, write_shards

from indexer import build_index
from retrieval import ImageIndex
from retrieval.errors import ShardSourceError
from retrieval.layout import is_index_dir

N = 7
PER_SHARD = 3  # shards 00000 (3), 00001 (3), 00002 (1)
OPTS = {"model": None, "device": "cpu", "workers": 0, "precision": "fp32", "batch_size": 4}


@pytest.fixture(scope="module")
def samples() -> list[Sample]:
    return make_samples(N)


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory: pytest.TempPathFactory, samples: list[Sample]) -> Path:
    root = tmp_path_factory.mktemp("shards") / "shards"
    write_shards(root, samples, PER_SHARD)
    return root


def _opts(model: Path) -> dict[str, object]:
    return {**OPTS, "model": str(model)}


def by_key(index: ImageIndex) -> dict[str, np.ndarray]:
    """Each image's vector by its sample key (a shard member's name, or a file's name)."""
    names = [p.rpartition("#")[2].rsplit(".", 1)[0] for p in index.metadata.paths()]
    return dict(zip(names, index.vectors.embeddings(), strict=True))


@pytest.fixture(scope="module")
def folder_index(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, samples: list[Sample]) -> Path:
    base = tmp_path_factory.mktemp("folder")
    write_folder(base / "photos", samples, PER_SHARD)
    build_index(base / "photos", base / "f.idx", **_opts(tiny_model))
    return base / "f.idx"


@pytest.fixture(scope="module")
def shard_index(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, shard_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("built") / "s.idx"
    build_index(shard_dir, out, **_opts(tiny_model))
    return out


def test_shards_give_the_folder_vectors_and_keep_captions(folder_index: Path, shard_index: Path, samples: list[Sample]) -> None:
    folder, shards = ImageIndex.open(folder_index), ImageIndex.open(shard_index)
    a, b = by_key(folder), by_key(shards)
    assert sorted(a) == sorted(b) and len(a) == N
    keys = sorted(a)
    assert cosines(np.stack([a[k] for k in keys]), np.stack([b[k] for k in keys])).min() >= 0.99999
    assert shards.metadata.paths()[:2] == ["00000.tar#000000000.jpg", "00000.tar#000000001.jpg"]
    rows = shards.rows(range(N), columns=("shard", "key", "caption", "url", "original_width", "original_height", "sha256", "width"))
    import hashlib

    by_caption = {s.caption: s for s in samples}
    for row in rows:
        sample = by_caption[row["caption"]]
        assert row["url"] == sample.url and row["width"] == sample.width
        assert row["original_width"] == sample.width * 4 and row["original_height"] == sample.height * 4
        assert row["sha256"] == hashlib.sha256(sample.jpeg).hexdigest()
        assert row["shard"].endswith(".tar") and row["key"].startswith(row["shard"][:5])
    hit = shards.search("a photo", k=N)[0]
    assert hit.caption in by_caption and hit.url == by_caption[hit.caption].url
    assert {"caption", "url"} <= set(hit.to_dict())
    # A folder's index has no shard columns' values: its hits say nothing of captions.
    assert folder.search("a photo", k=1)[0].caption is None and "caption" not in folder.search("a photo", k=1)[0].to_dict()
    assert shards.files.shard_bytes(hit.id) == by_caption[hit.caption].jpeg
    assert folder.files.shard_bytes(0) is None


@pytest.mark.parametrize("spec", ["00001.tar", "{00000..00002}.tar", "{00000,00002}.tar"])
def test_a_tar_or_a_brace_pattern_is_a_source(tmp_path: Path, tiny_model: Path, shard_dir: Path, shard_index: Path, spec: str) -> None:
    report = build_index(f"{shard_dir}/{spec}", tmp_path / "x.idx", **_opts(tiny_model))
    expected = {"00001.tar": 3, "{00000..00002}.tar": N, "{00000,00002}.tar": 4}[spec]
    assert report.added == expected
    want = by_key(ImageIndex.open(shard_index))
    got = by_key(ImageIndex.open(tmp_path / "x.idx"))
    assert all(float(np.dot(v, want[k])) >= 0.99999 for k, v in got.items())


def test_cli_index_search_json_and_skips(tmp_path: Path, tiny_model: Path, samples: list[Sample]) -> None:
    root = tmp_path / "shards"
    write_shards(root, samples[:3], 3)
    # A sample with a caption and no image, and a corrupt image, in a second shard.
    with tarfile.open(root / "00001.tar", "w") as tar:
        for name, data in (("000010000.txt", b"a caption alone"), ("000010001.jpg", b"\xff\xd8 not a jpeg"),
                           ("000010001.txt", b"broken"), ("000010002.jpg", samples[3].jpeg)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out = tmp_path / "s.idx"
    done = cli_here(["index", root, out, "--model", tiny_model, "--device", "cpu", "--precision", "fp32", "--json", "--no-progress"])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["indexed"] == 4
    skipped = {s.path: s.reason for s in ImageIndex.open(out).metadata.skipped()}
    assert "00001.tar#000010001.jpg" in skipped
    assert "00001.tar#000010000.txt" in skipped and "no image" in skipped["00001.tar#000010000.txt"]
    found = cli_here(["search", out, "a photo", "-k", "4", "--json", "--device", "cpu"])
    assert found.returncode == 0, found.stderr
    results = json.loads(found.stdout)["results"]
    assert {r.get("caption") for r in results} == {s.caption for s in samples[:3]} | {None}
    assert all(r["url"] == next(s.url for s in samples if s.caption == r["caption"]) for r in results if r.get("caption"))


def test_update_by_shard_adds_replaces_and_removes(tmp_path: Path, tiny_model: Path, samples: list[Sample],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from indexer import shards

    read: list[str] = []
    listing = shards.list_shard
    monkeypatch.setattr(shards, "list_shard", lambda shard, *rest: (read.append(shard.name), listing(shard, *rest))[1])
    root = tmp_path / "shards"
    write_shards(root, samples[:6], 3)
    out = tmp_path / "u.idx"
    first = build_index(root, out, **_opts(tiny_model))
    assert first.added == 6 and read == ["00000.tar", "00001.tar"]
    # A new shard: only its images are embedded, and only it is read (the others are unchanged).
    write_shards(tmp_path / "more", samples, 3)
    shutil.copy(tmp_path / "more" / "00002.tar", root / "00002.tar")
    again = build_index(root, out, **_opts(tiny_model))
    assert (again.added, again.unchanged, again.embedded) == (1, 6, 1)
    assert read[2:] == ["00002.tar"]
    # A shard rewritten with other images (same names): re-embedded; a shard gone: its rows leave.
    write_shards(tmp_path / "other", make_samples(3, seed=50), 3)
    shutil.copy(tmp_path / "other" / "00000.tar", root / "00000.tar")
    (root / "00001.tar").unlink()
    last = build_index(root, out, **_opts(tiny_model))
    assert (last.updated, last.removed, last.embedded, last.total) == (3, 3, 3, 4)
    index = ImageIndex.open(out)
    assert sorted({p.split("#")[0] for p in index.metadata.paths()}) == ["00000.tar", "00002.tar"]
    assert index.search("x", k=4)[0].caption is not None


def test_a_killed_run_resumes_within_a_shard(tmp_path: Path, tiny_model: Path, shard_dir: Path, shard_index: Path) -> None:
    out = tmp_path / "k.idx"
    args = ["index", shard_dir, out, "--model", tiny_model, "--device", "cpu", "--precision", "fp32", "--batch-size", "2",
            "--commit-every", "2", "--no-progress"]
    killed = run_killed_at(args, "embed", 3)  # two batches of two committed, inside shard 00001
    assert killed.killed
    assert ImageIndex.open(out).count == 4
    report = build_index(shard_dir, out, **{**_opts(tiny_model), "batch_size": 2, "commit_every": 2})
    assert report.resumed and report.embedded == N - 4 and report.total == N
    want = by_key(ImageIndex.open(shard_index))
    got = by_key(ImageIndex.open(out))
    assert sorted(got) == sorted(want) and all(float(np.dot(v, want[k])) >= 0.99999 for k, v in got.items())


def _bad(tmp_path: Path, source: str | Path, tiny_model: Path, *needles: str, extra: tuple[str, ...] = ()) -> None:
    out = tmp_path / "bad.idx"
    done = cli_here(["index", source, out, "--model", tiny_model, "--device", "cpu", "--no-progress", *extra])
    assert_one_line_error(done.returncode, done.stderr, *needles)
    assert not out.exists()


def test_a_truncated_tar_is_one_line_and_no_index(tmp_path: Path, tiny_model: Path, shard_dir: Path) -> None:
    data = (shard_dir / "00000.tar").read_bytes()
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "00000.tar").write_bytes(data[: len(data) // 2])
    _bad(tmp_path, tmp_path / "t" / "00000.tar", tiny_model, "00000.tar", "truncated")


def test_a_scheme_without_its_package_names_it(tmp_path: Path, tiny_model: Path) -> None:
    _bad(tmp_path, "gs://bucket/shards/{00000..00002}.tar", tiny_model, "gcsfs", "pip install")


@pytest.mark.parametrize(("spec", "match"), [
    ("{00000..0x2}.tar", "malformed brace range"),
    ("{00000..00002.tar", "brace"),
    ("{00000..00004}.tar", "00003.tar: no such file"),
    ("x.tar", "x.tar: not a readable tar"),
    ("nosuchscheme://bucket/x.tar", "nosuchscheme://"),
])
def test_bad_specs_raise_shard_errors(tmp_path: Path, tiny_model: Path, shard_dir: Path, spec: str, match: str) -> None:
    (tmp_path / "x.tar").write_bytes(b"this is not a tar file at all" * 40)
    base = tmp_path if spec == "x.tar" else shard_dir
    with pytest.raises(ShardSourceError, match=match):
        build_index(spec if "://" in spec else f"{base}/{spec}", tmp_path / "bad.idx", **_opts(tiny_model))
    assert not (tmp_path / "bad.idx").exists()


def test_bad_storage_options_are_refused(tmp_path: Path, tiny_model: Path, shard_dir: Path) -> None:
    from retrieval.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="storage options must be a JSON object"):
        build_index(shard_dir, tmp_path / "bad.idx", **_opts(tiny_model), storage_options="[1, 2]")


def test_library_errors_are_typed(tmp_path: Path, tiny_model: Path) -> None:
    with pytest.raises(ShardSourceError, match="no such file"):
        build_index(f"{tmp_path}/missing.tar", tmp_path / "a.idx", **_opts(tiny_model))
    empty = tmp_path / "empty"
    empty.mkdir()
    with tarfile.open(empty / "0.tar", "w"):
        pass
    with pytest.raises(ShardSourceError, match="no images"):
        build_index(empty / "0.tar", tmp_path / "b.idx", **_opts(tiny_model))
    assert not is_index_dir(tmp_path / "a.idx") and not (tmp_path / "b.idx").exists()


def test_the_server_serves_captions_and_bytes_out_of_the_shard(tmp_path: Path, shard_index: Path, samples: list[Sample]) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from clipsearch.server import create_app

    app = create_app([shard_index], cache_dir=tmp_path, device="cpu", warm=False)
    with TestClient(app) as client:
        found = client.get("/api/search", params={"q": "a photo", "k": 3})
        assert found.status_code == 200, found.text
        results = found.json()["results"]
        by_caption = {s.caption: s for s in samples}
        assert all(r["caption"] in by_caption and r["url"] == by_caption[r["caption"]].url for r in results)
        image = client.get(results[0]["image_url"])
        assert image.status_code == 200 and image.headers["content-type"] == "image/jpeg"
        assert image.content == by_caption[results[0]["caption"]].jpeg
        again = client.get(results[0]["image_url"], headers={"If-None-Match": image.headers["etag"]})
        assert again.status_code == 304
        thumb = client.get(results[0]["thumbnail_url"])
        assert thumb.status_code == 200 and thumb.content[:2] == b"\xff\xd8"
        knn = client.post("/knn-service", json={"text": "a photo", "num_images": 2, "indice_name": "s.idx", "modality": "image"})
        assert knn.status_code == 200, knn.text
        first = knn.json()[0]
        assert first["caption"] in by_caption and first["url"] == by_caption[first["caption"]].url


def test_eval_without_a_queries_file_uses_the_stored_captions(shard_index: Path, folder_index: Path, samples: list[Sample]) -> None:
    from retrieval.errors import EvaluationError
    from retrieval.evaluate import caption_queries, evaluate

    index = ImageIndex.open(shard_index)
    queries = caption_queries(index)
    assert len(queries) == N and {q.text for q in queries} == {s.caption for s in samples}
    assert all(len(q.relevant) == 1 and q.relevant[0] in index.metadata.paths() for q in queries)
    drawn = caption_queries(index, limit=3)
    assert len(drawn) == 3 and drawn == caption_queries(index, limit=3)  # the fixed seed draws the same
    report = evaluate(index, drawn)
    assert report.queries == 3 and 0 < report.mrr <= 1 and report.chance_mrr > 0
    with pytest.raises(EvaluationError, match="no captions"):
        caption_queries(ImageIndex.open(folder_index))
    done = cli_here(["eval", shard_index, "--limit", "4", "--json", "--device", "cpu"])
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["queries"] == 4 and {"mrr", "ndcg@10", "recall@5", "chance_mrr"} <= set(out)


def test_what_is_a_shard_spec(tmp_path: Path, shard_dir: Path) -> None:
    from indexer.shards import is_shard_spec

    photos = tmp_path / "{holiday}"
    photos.mkdir()
    (photos / "a.jpg").write_bytes(b"")
    (photos / "backup.tar").write_bytes(b"")
    assert not is_shard_spec(str(photos))  # a folder with images, braces in its name
    assert is_shard_spec(str(shard_dir)) and is_shard_spec(f"{shard_dir}/00000.tar")
    assert is_shard_spec(f"{shard_dir}/{{00000..00001}}.tar") and is_shard_spec("s3://b/p/")
    assert not is_shard_spec(str(tmp_path / "missing"))


def test_cli_refuses_watch_and_files_from_on_shards_and_verify_passes(
    tmp_path: Path, tiny_model: Path, shard_dir: Path, shard_index: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from clipsearch.cli import main

    out = tmp_path / "w.idx"
    assert main(["index", str(shard_dir), str(out), "--model", str(tiny_model), "--watch"]) == 1
    assert_one_line_error(1, capsys.readouterr().err, "--watch", "shards")
    listed = tmp_path / "list.txt"
    listed.write_text("00000.tar#000000000.jpg\n")
    assert main(["index", str(shard_dir), str(out), "--model", str(tiny_model), "--files-from", str(listed)]) == 1
    assert_one_line_error(1, capsys.readouterr().err, "files")
    assert not out.exists()
    assert main(["verify", str(shard_index)]) == 0, capsys.readouterr().err


def test_keyword_search_reads_the_captions(shard_index: Path, samples: list[Sample]) -> None:
    index = ImageIndex.open(shard_index)
    by_caption = {s.caption: s for s in samples}
    hits = index.search("number", k=3, mode="keyword")
    assert len(hits) == 3
    assert all(h.matched == {"caption": ("number",)} and by_caption[h.caption].url == h.url for h in hits if h.caption)
    assert all(h.caption is not None for h in index.search("number", k=3, mode="hybrid"))
