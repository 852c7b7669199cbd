"""WebDataset shards in S3 (issue 36), over the real S3 wire protocol: moto's threaded server on
a loopback port, reached through ``AWS_ENDPOINT_URL`` as any S3-compatible store is. The same
images from a folder, local shards and S3 shards give the same vectors and captions; what a
store can do wrong (no bucket, no key, refused credentials, no answer) is one line and exit 1.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from helpers import assert_one_line_error, local_ray, moto_s3
from shardgen import Sample, make_samples, write_shards
from test_shards import by_key

from indexer import build_index
from retrieval import ImageIndex
from retrieval.errors import ShardSourceError
from retrieval.layout import SAMPLE_COLUMNS

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

BUCKET = "laion"
N = 5
# A store that does not answer is given up on quickly (the defaults retry for minutes).
FAST = json.dumps({"config_kwargs": {"connect_timeout": 1, "read_timeout": 1, "retries": {"max_attempts": 1}}})


@pytest.fixture(scope="module")
def samples() -> list[Sample]:
    return make_samples(N, seed=7)


@pytest.fixture(scope="module")
def local_shards(tmp_path_factory: pytest.TempPathFactory, samples: list[Sample]) -> Path:
    root = tmp_path_factory.mktemp("s3-local") / "shards"
    write_shards(root, samples, 2)
    return root


@pytest.fixture(scope="module")
def endpoint(local_shards: Path) -> Iterator[str]:
    """moto's S3 on loopback holding ``s3://laion/data/0000{0,1,2}.tar``; the AWS_* variables
    point at it for the module."""
    with moto_s3() as (s3, url):
        s3.create_bucket(Bucket=BUCKET)
        for shard in sorted(local_shards.glob("*.tar")):
            s3.upload_file(str(shard), BUCKET, f"data/{shard.name}")
        yield url


def _opts(model: Path) -> dict[str, object]:
    return {"model": str(model), "device": "cpu", "workers": 0, "precision": "fp32", "batch_size": 4}


@pytest.fixture(scope="module")
def s3_index(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, endpoint: str) -> Path:
    out = tmp_path_factory.mktemp("s3") / "s3.idx"
    build_index(f"s3://{BUCKET}/data/{{00000..00002}}.tar", out, **_opts(tiny_model))
    return out


def test_s3_shards_equal_local_shards_and_a_folder(tmp_path: Path, tiny_model: Path, local_shards: Path, s3_index: Path,
                                                    samples: list[Sample]) -> None:
    from shardgen import write_folder

    build_index(local_shards, tmp_path / "local.idx", **_opts(tiny_model))
    build_index(write_folder(tmp_path / "photos", samples, 2), tmp_path / "folder.idx", **_opts(tiny_model))
    remote = ImageIndex.open(s3_index)
    assert remote.manifest.source_root == f"s3://{BUCKET}/data"
    got = by_key(remote)
    for other in ("local.idx", "folder.idx"):
        want = by_key(ImageIndex.open(tmp_path / other))
        assert sorted(want) == sorted(got) and len(got) == N
        assert min(float(np.dot(got[k], want[k])) for k in got) >= 0.99999
    local = ImageIndex.open(tmp_path / "local.idx")
    assert remote.metadata.paths() == local.metadata.paths()
    assert remote.rows(range(N), columns=("caption", "url", "sha256")) == local.rows(range(N), columns=("caption", "url", "sha256"))
    hit = remote.search("a photo", k=1)[0]
    assert hit.caption in {s.caption for s in samples}
    # The image's bytes come back out of the shard in the bucket.
    assert remote.files.shard_bytes(hit.id) == next(s.jpeg for s in samples if s.caption == hit.caption)


def test_a_prefix_is_its_shards_and_an_update_reads_only_new_ones(tmp_path: Path, tiny_model: Path, endpoint: str,
                                                                  local_shards: Path) -> None:
    out = tmp_path / "p.idx"
    first = build_index(f"s3://{BUCKET}/data/{{00000..00001}}.tar", out, **_opts(tiny_model))
    assert first.added == 4
    again = build_index(f"s3://{BUCKET}/data/", out, **_opts(tiny_model))
    assert (again.added, again.unchanged, again.embedded) == (1, 4, 1)


def test_cli_with_aws_endpoint_url(tmp_path: Path, tiny_model: Path, endpoint: str) -> None:
    out = tmp_path / "cli.idx"
    done = run_cli(["index", f"s3://{BUCKET}/data/", out, "--model", tiny_model, "--device", "cpu", "--precision", "fp32",
                    "--json", "--no-progress", "--storage-options", FAST])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["indexed"] == N


@pytest.mark.parametrize("source", ["s3://nobucket/data/", f"s3://{BUCKET}/data/00009.tar", f"s3://{BUCKET}/none/"])
def test_no_bucket_or_key(tmp_path: Path, tiny_model: Path, endpoint: str, source: str) -> None:
    with pytest.raises(ShardSourceError, match=f"{source}: no such"):
        build_index(source, tmp_path / "bad.idx", **_opts(tiny_model))
    assert not (tmp_path / "bad.idx").exists()


def test_an_endpoint_that_does_not_answer(tmp_path: Path, tiny_model: Path, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts connections into its backlog and never answers
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    refused = closed.getsockname()[1]
    closed.close()
    try:
        for port in (silent.getsockname()[1], refused):
            monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
            started = time.monotonic()
            with pytest.raises(ShardSourceError, match="does not answer"):
                build_index(f"s3://{BUCKET}/data/", tmp_path / "x.idx", **_opts(tiny_model), storage_options=FAST)
            assert time.monotonic() - started < 30
            assert not (tmp_path / "x.idx").exists()
    finally:
        silent.close()


def test_refused_credentials_are_a_403(tmp_path: Path, tiny_model: Path, endpoint: str) -> None:
    # A second moto that checks signatures (INITIAL_NO_AUTH_ACTION_COUNT=0): unknown keys get 403.
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"}
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        out = tmp_path / "denied.idx"
        failed = run_cli(["index", f"s3://{BUCKET}/data/", out, "--model", tiny_model, "--device", "cpu", "--no-progress"],
                         env={"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "nobody"})
        assert_one_line_error(failed.returncode, failed.stderr, "access denied", "403")
        assert not out.exists()
    finally:
        server.terminate()
        server.wait(10)


def test_import_reads_clip_retrieval_output_from_the_bucket(tmp_path: Path, tiny_model: Path, endpoint: str) -> None:
    import boto3
    import pyarrow as pa
    import pyarrow.parquet as pq

    from indexer.importer import import_embeddings
    from retrieval.errors import ImportSourceError

    rng = np.random.default_rng(3)
    local = tmp_path / "clip-output"
    (local / "img_emb").mkdir(parents=True)
    (local / "metadata").mkdir()
    vectors = {n: rng.standard_normal((4, 48)).astype(np.float16) for n in (0, 1)}
    s3 = boto3.client("s3", endpoint_url=endpoint)
    for n, v in vectors.items():
        np.save(local / "img_emb" / f"img_emb_{n}.npy", v)
        pq.write_table(pa.table({"image_path": [f"img_{n}_{j}.jpg" for j in range(4)]}), local / "metadata" / f"metadata_{n}.parquet")
        s3.upload_file(str(local / "img_emb" / f"img_emb_{n}.npy"), BUCKET, f"emb/img_emb/img_emb_{n}.npy")
        s3.upload_file(str(local / "metadata" / f"metadata_{n}.parquet"), BUCKET, f"emb/metadata/metadata_{n}.parquet")
    out = tmp_path / "imported.idx"
    report = import_embeddings(f"s3://{BUCKET}/emb/", out, model=str(tiny_model))
    assert report.imported == 8 and report.source == f"s3://{BUCKET}/emb/" and report.source_format == "clip-retrieval"
    index = ImageIndex.open(out)
    assert index.metadata.paths()[:2] == ["img_0_0.jpg", "img_0_1.jpg"]
    assert index.manifest.model_info["imported_source"] == f"s3://{BUCKET}/emb/"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".import-")]  # the staged copy is gone
    with pytest.raises(ImportSourceError, match="no such file"):
        import_embeddings(f"s3://{BUCKET}/nothing-here/", tmp_path / "none.idx", model=str(tiny_model))
    assert not (tmp_path / "none.idx").exists()


def test_ray_actors_read_the_shards_straight_from_the_store(tmp_path: Path, tiny_model: Path, s3_index: Path) -> None:
    pytest.importorskip("ray")
    out = tmp_path / "ray.idx"
    with local_ray():
        report = build_index(f"s3://{BUCKET}/data/", out, **_opts(tiny_model), engine="ray", actors=1, cpus_per_actor=1)
    # The actor wrote the part itself, with every shard column the driver would have written.
    assert report.engine == "ray" and report.added == N and report.ray_write == "actors"
    want, got = ImageIndex.open(s3_index), ImageIndex.open(out)
    assert got.metadata.paths() == want.metadata.paths()
    assert float(np.min(np.sum(got.vectors.embeddings() * want.vectors.embeddings(), axis=1))) >= 0.99999
    columns = [f.name for f in SAMPLE_COLUMNS]
    assert got.rows(range(N), columns=columns) == want.rows(range(N), columns=columns)
