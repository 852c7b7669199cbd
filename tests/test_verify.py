"""Corruption is detected, never served: damaged files of every kind, on open and in ``verify``.

Each kind of file of a generation (Parquet parts, path files, FAISS file, skip list, manifest)
gets a flipped bit, a truncation and a deletion. What happens is exact and differs by case:

- cheap on open: a missing or truncated file (recorded sizes), any change to the manifest
  (its digest), a path file's header, Parquet footers: ``ImageIndex.open`` raises
  ``IndexCorruptError`` naming the file and the repair;
- on read: a flipped bit in a Parquet data page fails the page's CRC whenever that page is read
  (filtered search, rows, embeddings, the skip list, vectors added to FAISS on open): the same
  error, never the changed values;
- on read of a path: its CRC (a search's hits; a damaged path is raised, not returned);
- only in ``verify``: a flipped bit in a FAISS file's vectors, which open does not check (opening
  stays O(files)); ``verify`` names the file, and ``reindex`` repairs it.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import cli_here, run_cli
from imagegen import Collection

from indexer.commit import GenerationWriter, IndexMeta
from indexer.lock import IndexLock
from indexer.reindex import reindex
from indexer.sides.registry import side_writers
from indexer.writer import FileRecord, SkipRecord
from retrieval import ImageIndex, IndexCorruptError, NotAnIndexError, faiss_index, verify_index
from retrieval.errors import IndexFormatError
from retrieval.filters import Filter
from retrieval.layout import (
    MANIFEST_DIGEST_KEY,
    MANIFEST_FILE,
    PATHS_CRC_MAGIC,
    Manifest,
    checksum_file,
    read_manifest,
)

DIM = 16
ROWS = 300
PART_ROWS = 150
SKIPS = [SkipRecord(f"broken/{i:03d}.jpg".encode(), "cannot identify image file", 10 + i, i, f"{i:032x}") for i in range(40)]


def unit_vectors(n: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def records(start: int, n: int) -> list[FileRecord]:
    return [
        FileRecord(f"dir{i % 3}/img{i:05d}.jpg".encode(), 100 + i, 50 + i % 7, 1000 + i, i, f"{i:032x}") for i in range(start, start + n)
    ]


def write_index(out: Path, vectors: np.ndarray, finish: bool = True, index_type: str = "flat") -> Manifest:
    """Two parts of PART_ROWS rows, a skip list, and (``finish``) a FAISS file: no model needed."""
    meta = IndexMeta(
        model="synthetic",
        model_fingerprint="sha256:" + "0" * 64,
        backend="hf",
        dim=DIM,
        preprocess={"shortest_edge": 8, "crop_size": [8, 8], "resample": 3, "mean": [0.5] * 3, "std": [0.5] * 3, "rescale_factor": 1 / 255},
        source_root="/photos",
        index_options={"index_type": index_type},
    )
    out.mkdir(parents=True)
    with IndexLock(out):
        writer = GenerationWriter(out, meta, None, side_writers)
        writer.record_skips(SKIPS)
        for start in range(0, len(vectors), PART_ROWS):
            writer.append(records(start, PART_ROWS), vectors[start : start + PART_ROWS])
            manifest = writer.commit()
        if finish:
            manifest = writer.finish()
    return manifest


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    return unit_vectors(ROWS)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory, vectors: np.ndarray) -> Path:
    out = tmp_path_factory.mktemp("verify") / "clean.idx"
    write_index(out, vectors)
    return out


@pytest.fixture()
def idx(clean: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy.idx"
    shutil.copytree(clean, dst)
    return dst


def file_of(index_dir: Path, kind: str) -> str:
    """The relative path of a file of the current generation: part0, part1, paths0, paths1, faiss, skipped."""
    m = read_manifest(index_dir)
    if kind == "faiss":
        return m.faiss.path if m.faiss is not None else ""
    if kind == "skipped":
        return m.skipped_file
    part = m.parts[int(kind[-1])]
    return part.path if kind.startswith("part") else str(part.paths)


def flip(path: Path, offset: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def page_offset(path: Path, column: str) -> int:
    """A byte inside the (compressed) data of the last data page of ``column`` in row group 0,
    past the page header: a flip there changes values, not the page structure."""
    meta = pq.ParquetFile(path).metadata
    names = [meta.schema.column(i).path.split(".")[0] for i in range(meta.num_columns)]
    chunk = meta.row_group(0).column(names.index(column))
    # The chunk's pages run from its dictionary page (if any) for total_compressed_size bytes.
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    return start + chunk.total_compressed_size - 8


def problems(index_dir: Path) -> list[tuple[str, str]]:
    return [(p.file, p.check) for p in verify_index(index_dir).problems]


def strip_checksums(index_dir: Path) -> None:
    """Make the manifest look written before checksums existed (no checksums, no digest)."""
    path = index_dir / MANIFEST_FILE
    data = json.loads(path.read_text())
    data.pop("checksums")
    data.pop("keywords", None)  # (which came later still)
    data.pop(MANIFEST_DIGEST_KEY)
    path.write_text(json.dumps(data, indent=2))


# -- a clean index --------------------------------------------------------------------------------


def test_clean_index_verifies_clean(clean: Path) -> None:
    report = verify_index(clean)
    m = read_manifest(clean)
    assert report.ok and report.problems == () and report.notes == ()
    assert report.checksums and report.count == ROWS and report.generation == m.generation
    expected = {**m.files(), **({m.keywords.path: "keywords"} if m.keywords is not None else {})}
    assert [(f.path, f.kind, f.digest) for f in report.files] == [(rel, kind, "ok") for rel, kind in expected.items()]
    assert [f.kind for f in report.files] == ["part", "paths", "part", "paths", "faiss", "skipped", "keywords"]
    assert report.faiss_sampled == 64
    # The recorded checksums are those of the files.
    for rel, recorded in m.checksums.items():
        assert checksum_file(clean / rel) == recorded


def test_cli_verify_clean_exits_0_with_json_report(clean: Path) -> None:
    proc = run_cli(["verify", clean, "--json"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    report = json.loads(proc.stdout)
    assert set(report) == {"index_dir", "ok", "generation", "count", "checksums", "files", "faiss_sampled", "problems", "notes", "seconds"}
    assert report["ok"] is True and report["problems"] == [] and report["count"] == ROWS and report["checksums"] is True
    assert {f["kind"] for f in report["files"]} == {"part", "paths", "faiss", "skipped", "keywords"}
    assert all(set(f) == {"path", "kind", "size", "digest"} and f["digest"] == "ok" for f in report["files"])
    text = cli_here(["verify", clean])
    assert text.returncode == 0 and text.stdout.startswith(f"{clean}: ok (300 images, 7 files, file checksums verified")


def test_parquet_pages_carry_checksums(clean: Path) -> None:
    # Without CRCs a flipped bit in a data page reads back as another value (the case).
    for rel in (file_of(clean, "part0"), file_of(clean, "skipped")):
        meta = pq.ParquetFile(clean / rel).metadata
        assert meta.num_rows > 0
    path = clean / file_of(clean, "part0")
    damaged = path.parent / "damaged.parquet.tmp"
    try:
        shutil.copy(path, damaged)
        flip(damaged, page_offset(damaged, "embedding"), 3)
        plain = pq.read_table(damaged, columns=["embedding"])  # no CRC check: reads changed values
        assert not plain.equals(pq.read_table(path, columns=["embedding"]))
        with pytest.raises(OSError, match="CRC"):
            pq.read_table(damaged, columns=["embedding"], page_checksum_verification=True)
    finally:
        damaged.unlink()


# -- Parquet parts ----------------------------------------------------------------------------------


@pytest.mark.parametrize("part", ["part0", "part1"])
def test_flipped_bit_in_a_part_page_is_raised_on_read_and_named_by_verify(idx: Path, clean: Path, part: str, vectors: np.ndarray) -> None:
    rel = file_of(idx, part)
    flip(idx / rel, page_offset(idx / rel, "embedding"), 3)
    index = ImageIndex.open(idx)  # sizes and footers are intact: opening is cheap and succeeds
    # An unfiltered search reads no Parquet page (FAISS and the path files, both intact).
    assert index.search_vectors(vectors[:2], 5) == ImageIndex.open(clean).search_vectors(vectors[:2], 5)
    with pytest.raises(IndexCorruptError, match="CRC") as exc:
        index.vectors.embeddings()
    assert exc.value.path == str(idx / rel) and "--rebuild" in exc.value.fix
    assert problems(idx) == [(rel, "checksum")]


def test_flipped_bit_in_a_filtered_column_fails_the_search(idx: Path, vectors: np.ndarray) -> None:
    rel = file_of(idx, "part1")
    flip(idx / rel, page_offset(idx / rel, "width"), 0)
    index = ImageIndex.open(idx)
    with pytest.raises(IndexCorruptError, match="part-00001.parquet is damaged"):
        index.search_vectors(vectors[:1], 5, where=Filter(min_width=120))
    with pytest.raises(IndexCorruptError, match="part-00001.parquet is damaged"):
        index.rows([PART_ROWS + 3], columns=("width",))


def test_flipped_bit_in_a_part_fails_open_when_faiss_is_filled_from_it(tmp_path: Path, vectors: np.ndarray) -> None:
    # An interrupted build has no FAISS file: opening adds the stored vectors, reading every page.
    out = tmp_path / "partial.idx"
    write_index(out, vectors, finish=False)
    assert read_manifest(out).faiss is None
    ImageIndex.open(out)
    rel = file_of(out, "part1")
    flip(out / rel, page_offset(out / rel, "embedding"), 3)
    with pytest.raises(IndexCorruptError, match="part-00001.parquet is damaged .*CRC.*--rebuild"):
        ImageIndex.open(out)
    assert problems(out) == [(rel, "checksum")]


@pytest.mark.parametrize("kind", ["part0", "part1", "paths0", "paths1", "skipped"])
@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_truncated_or_deleted_file_fails_open(idx: Path, kind: str, damage: str) -> None:
    rel = file_of(idx, kind)
    truncate(idx / rel) if damage == "truncate" else (idx / rel).unlink()
    what = "missing" if damage == "delete" else "bytes, the manifest records"
    with pytest.raises(IndexCorruptError, match=f"{rel.rpartition('/')[2]} is damaged \\(.*{what}.*--rebuild") as exc:
        ImageIndex.open(idx)
    assert exc.value.path == str(idx / rel)
    assert exc.value.fix == "rebuild the index with `clipsearch index /photos " + str(idx) + " --rebuild`"
    assert problems(idx) == [(rel, "missing" if damage == "delete" else "size")]


# -- path files ---------------------------------------------------------------------------------------


def paths_data_end(path: Path) -> int:
    """Where a path file's UTF-8 bytes end (its CRC trailer follows: a u32 per row, a magic)."""
    return path.stat().st_size - len(PATHS_CRC_MAGIC) - 4 * PART_ROWS


def test_flipped_bit_in_a_path_is_raised_when_read(idx: Path, clean: Path, vectors: np.ndarray) -> None:
    rel = file_of(idx, "paths1")
    flip(idx / rel, paths_data_end(idx / rel) - 5, 0)  # a character of the part's last path (img00299.jpg)
    index = ImageIndex.open(idx)  # opening reads the header only (memory-mapped)
    with pytest.raises(IndexCorruptError, match="part-00001.paths is damaged \\(the path of row 149 fails its CRC\\)"):
        index.metadata.paths_of([ROWS - 1])
    with pytest.raises(IndexCorruptError, match="part-00001.paths is damaged"):
        index.search_vectors(vectors[ROWS - 1 :], 1)  # its top hit is id 299
    # Searches whose hits avoid that row are answered (from intact data).
    assert index.search_vectors(vectors[:1], 3) == ImageIndex.open(clean).search_vectors(vectors[:1], 3)
    assert problems(idx) == [(rel, "checksum")]
    # Without file checksums (an older index) the content check compares it with the part's column.
    strip_checksums(idx)
    assert problems(idx) == [(rel, "paths")]
    assert verify_index(idx).problems[0].detail == "path of row 149 differs from the part's path column"


def test_flipped_bit_in_a_path_crc_is_raised_when_read(idx: Path) -> None:
    rel = file_of(idx, "paths0")
    flip(idx / rel, paths_data_end(idx / rel) + 4 * 7, 0)  # row 7's CRC
    index = ImageIndex.open(idx)
    assert index.metadata.paths_of([6, 8]) == ["dir0/img00006.jpg", "dir2/img00008.jpg"]
    with pytest.raises(IndexCorruptError, match="the path of row 7 fails its CRC"):
        index.metadata.paths_of([7])
    strip_checksums(idx)
    assert [(p.file, p.check, p.detail) for p in verify_index(idx).problems] == [(rel, "paths", "the path of row 7 fails its CRC")]


def test_path_files_without_a_crc_trailer_are_read(idx: Path) -> None:
    # Path files of an older format have no trailer: read unchecked.
    strip_checksums(idx)
    rel = file_of(idx, "paths0")
    (idx / rel).write_bytes((idx / rel).read_bytes()[: paths_data_end(idx / rel)])
    assert ImageIndex.open(idx).metadata.paths_of([0, 149]) == ["dir0/img00000.jpg", "dir2/img00149.jpg"]
    assert verify_index(idx).ok


def test_flipped_bit_in_a_path_file_header_fails_open(idx: Path) -> None:
    rel = file_of(idx, "paths0")
    flip(idx / rel, 12, 0)  # inside the file id
    with pytest.raises(IndexCorruptError, match="part-00000.paths is damaged \\(its header"):
        ImageIndex.open(idx)
    assert problems(idx) == [(rel, "checksum")]


# -- skip list ----------------------------------------------------------------------------------------


def test_flipped_bit_in_the_skip_list_is_raised_on_read(idx: Path) -> None:
    rel = file_of(idx, "skipped")
    flip(idx / rel, page_offset(idx / rel, "reason"), 1)
    index = ImageIndex.open(idx)
    with pytest.raises(IndexCorruptError, match="skipped.parquet is damaged .*CRC"):
        index.metadata.skipped()
    proc = cli_here(["info", idx])
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "skipped.parquet is damaged" in proc.stderr
    assert problems(idx) == [(rel, "checksum")]


# -- FAISS file ---------------------------------------------------------------------------------------


def test_flipped_bit_in_faiss_is_named_by_verify_and_repaired_by_reindex(idx: Path) -> None:
    rel = file_of(idx, "faiss")
    size = (idx / rel).stat().st_size
    flip(idx / rel, size - 2, 6)  # the exponent of the last vector's last value
    ImageIndex.open(idx)  # the file is read, but its vectors are not checked on open
    report = verify_index(idx)
    assert [(p.file, p.check) for p in report.problems] == [(rel, "checksum")]
    assert report.problems[0].fix == f"rebuild its FAISS index from the stored vectors with `clipsearch reindex {idx}`"
    proc = cli_here(["verify", idx])
    assert proc.returncode == 1
    assert proc.stderr == (
        f"clipsearch: error: {rel} is damaged (its sha256 differs from the one the manifest records); {report.problems[0].fix}\n"
    )
    reindex(idx)
    assert verify_index(idx).ok


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_truncated_or_deleted_faiss_fails_open_naming_reindex(idx: Path, damage: str) -> None:
    rel = file_of(idx, "faiss")
    truncate(idx / rel) if damage == "truncate" else (idx / rel).unlink()
    with pytest.raises(IndexCorruptError, match=f"index.faiss is damaged .*`clipsearch reindex {idx}`"):
        ImageIndex.open(idx)
    proc = cli_here(["search", idx, "a cat"])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert "index.faiss is damaged" in proc.stderr and "clipsearch reindex" in proc.stderr
    assert problems(idx) == [(rel, "missing" if damage == "delete" else "size")]
    reindex(idx)
    assert verify_index(idx).ok and len(ImageIndex.open(idx)) == ROWS


# -- manifest -----------------------------------------------------------------------------------------


def test_any_flipped_bit_in_the_manifest_fails_open(clean: Path, tmp_path: Path) -> None:
    original = (clean / MANIFEST_FILE).read_bytes()
    expected = read_manifest(clean)
    key = original.index(f'"{MANIFEST_DIGEST_KEY}"'.encode())
    target = tmp_path / "m.idx"
    target.mkdir()
    accepted = []
    # Every byte, each with one of the 8 bits (offset % 8: all bit positions, a few seconds).
    for offset in range(len(original)):
        bit = offset % 8
        data = bytearray(original)
        data[offset] ^= 1 << bit
        (target / MANIFEST_FILE).write_bytes(bytes(data))
        try:
            m = read_manifest(target)
        except IndexCorruptError as exc:
            assert exc.path == str(target / MANIFEST_FILE)
        except IndexFormatError:
            pytest.fail(f"bit {bit} of byte {offset} gave an IndexFormatError that is not IndexCorruptError")
        else:
            accepted.append(offset)
            assert m == expected  # only a flip in the digest's own key name leaves the check out
    assert all(key < o <= key + len(MANIFEST_DIGEST_KEY) for o in accepted)


def test_flipped_version_digit_is_damage_not_a_newer_format(idx: Path) -> None:
    path = idx / MANIFEST_FILE
    text = path.read_bytes()
    at = text.index(b'"format_version": 2') + len(b'"format_version": ')
    flip(path, at, 0)  # 2 -> 3
    with pytest.raises(IndexCorruptError, match="manifest.json is damaged \\(its content does not match its digest\\)"):
        ImageIndex.open(idx)
    report = verify_index(idx)
    assert [(p.file, p.check) for p in report.problems] == [("manifest.json", "manifest")]
    proc = cli_here(["verify", idx, "--json"])
    assert proc.returncode == 1 and json.loads(proc.stdout)["problems"][0]["file"] == "manifest.json"
    text = cli_here(["verify", idx])
    assert text.returncode == 1
    assert text.stdout == f"{idx}: 1 damaged file(s) (the manifest cannot be read: nothing else was checked)\n"
    assert text.stderr == f"clipsearch: error: {report.problems[0].message()}\n"
    assert report.problems[0].fix == (
        f"rebuild the index with `clipsearch index PHOTOS_DIR {idx} --rebuild` (add --model MODEL if it was built "
        "with another model than the default: its manifest cannot tell)"
    )


def test_truncated_manifest_fails_open(idx: Path) -> None:
    truncate(idx / MANIFEST_FILE)
    with pytest.raises(IndexCorruptError, match="manifest.json is damaged \\(not valid JSON"):
        ImageIndex.open(idx)
    assert problems(idx) == [("manifest.json", "manifest")]


def test_deleted_manifest_is_not_an_index(idx: Path) -> None:
    (idx / MANIFEST_FILE).unlink()
    with pytest.raises(NotAnIndexError):
        ImageIndex.open(idx)
    with pytest.raises(NotAnIndexError):
        verify_index(idx)
    proc = cli_here(["verify", idx])
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "not a clipsearch index" in proc.stderr


# -- indexes written before checksums ----------------------------------------------------------------


def test_index_without_checksums_opens_verifies_and_gets_them_from_reindex(idx: Path) -> None:
    strip_checksums(idx)
    assert read_manifest(idx).checksums == {}
    assert len(ImageIndex.open(idx)) == ROWS
    report = verify_index(idx)
    assert report.ok and not report.checksums
    assert {f.digest for f in report.files} == {"absent"}
    assert report.notes == (
        "the manifest records no file checksums (the index was written before clipsearch recorded them): "
        f"only the content checks ran; record them with `clipsearch reindex {idx}`",
    )
    proc = cli_here(["verify", idx])
    assert proc.returncode == 0 and "no file checksums recorded" in proc.stdout and "clipsearch reindex" in proc.stdout
    reindex(idx)
    after = verify_index(idx)
    assert after.ok and after.checksums and {f.digest for f in after.files} == {"ok"}


def test_index_without_checksums_content_checks(idx: Path, vectors: np.ndarray) -> None:
    strip_checksums(idx)
    # A part as an older writer left it: no page CRCs, no compression. An exponent bit flipped
    # in a stored embedding makes it ~1e37 (the case): only verify's norms see it.
    rel = file_of(idx, "part0")
    table = pq.read_table(idx / rel)
    pq.write_table(table, idx / rel, compression="none")
    value = np.float32(vectors[7, 3]).tobytes()
    data = (idx / rel).read_bytes()
    assert data.count(value) == 1
    flip(idx / rel, data.index(value) + 3, 6)
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.linalg.norm(ImageIndex.open(idx).vectors.embeddings()[7]))
    report = verify_index(idx)
    assert [(p.file, p.check) for p in report.problems] == [(rel, "norms")]
    assert report.problems[0].detail.startswith("the embedding of id 7 has norm ")
    # The FAISS sample is compared with the stored vectors (ids 0 and ROWS - 1 are in the sample).
    faiss_rel = file_of(idx, "faiss")
    size = (idx / faiss_rel).stat().st_size
    flip(idx / faiss_rel, size - 2, 6)
    assert problems(idx) == [(rel, "norms"), (faiss_rel, "faiss")]


def test_faiss_with_fewer_vectors_is_refused(idx: Path, vectors: np.ndarray) -> None:
    strip_checksums(idx)  # else the recorded size catches it first
    rel = file_of(idx, "faiss")
    faiss_index.write(faiss_index.build(vectors[:-1]), idx / rel)
    with pytest.raises(IndexCorruptError, match="299 vectors of dim 16, the manifest says 300 of dim 16"):
        ImageIndex.open(idx)
    assert problems(idx) == [(rel, "faiss")]


@pytest.mark.parametrize("index_type", ["HNSW8", "IVF4,Flat", "IVF4,SQ8"])
def test_faiss_rows_out_of_id_order_are_found(tmp_path: Path, vectors: np.ndarray, index_type: str) -> None:
    out = tmp_path / "ann.idx"
    write_index(out, vectors, index_type=index_type)
    assert verify_index(out).ok and verify_index(out).faiss_sampled == 64
    strip_checksums(out)
    # The same vectors in another order: every count and size still agrees.
    rel = file_of(out, "faiss")
    index = faiss_index.create(index_type, DIM)
    faiss_index.train(index, vectors)
    faiss_index.add(index, np.roll(vectors, 1, axis=0))
    faiss_index.write(index, out / rel)
    assert problems(out) == [(rel, "faiss")]


# -- writers record checksums ------------------------------------------------------------------------


def test_every_generation_records_checksums_of_all_its_files(tmp_path: Path, vectors: np.ndarray) -> None:
    out = tmp_path / "gen.idx"
    write_index(out, vectors, finish=False)
    first = read_manifest(out)
    assert first.faiss is None and set(first.checksums) == set(first.files())
    base = read_manifest(out)
    meta = IndexMeta(
        base.model, base.model_fingerprint, base.backend, base.dim, base.preprocess, base.source_root, index_options={"index_type": "flat"}
    )
    with IndexLock(out):
        writer = GenerationWriter(out, meta, base, side_writers)
        writer.record_skips(SKIPS)
        writer.append(records(ROWS, 10), unit_vectors(10, seed=1))
        final = writer.finish()
    # Linked parts keep their recorded checksums; new files are hashed as written.
    assert final.checksums[final.parts[0].path] == first.checksums[first.parts[0].path]
    assert len(final.parts) == 3 and set(final.checksums) == set(final.files())
    for rel, recorded in final.checksums.items():
        assert checksum_file(out / rel) == recorded
    assert verify_index(out).ok


def test_an_update_refuses_to_carry_a_damaged_part(idx: Path) -> None:
    rel = file_of(idx, "part0")
    flip(idx / rel, page_offset(idx / rel, "content_hash"), 0)
    base = read_manifest(idx)
    meta = IndexMeta(base.model, base.model_fingerprint, base.backend, base.dim, base.preprocess, base.source_root)
    with IndexLock(idx), pytest.raises(IndexCorruptError, match="part-00000.parquet is damaged .*CRC"):
        GenerationWriter(idx, meta, base, side_writers).facts()


def test_reindex_checks_every_file_but_the_faiss_file_it_replaces(idx: Path) -> None:
    rel = file_of(idx, "part1")
    truncate(idx / rel)
    before = (idx / MANIFEST_FILE).read_bytes()
    with pytest.raises(IndexCorruptError, match="part-00001.parquet is damaged .*bytes, the manifest records.*--rebuild"):
        reindex(idx)
    assert (idx / MANIFEST_FILE).read_bytes() == before


def test_an_update_names_a_truncated_faiss_file_and_reindex(
    built_index: Path, collection: Collection, tiny_model: Path, tmp_path: Path
) -> None:
    from indexer import build_index

    idx = tmp_path / "built.idx"
    shutil.copytree(built_index, idx)
    truncate(idx / file_of(idx, "faiss"))
    with pytest.raises(IndexCorruptError, match=f"index.faiss is damaged .*`clipsearch reindex {idx}`"):
        build_index(collection.root, idx, model=str(tiny_model), workers=0, device="cpu")
    reindex(idx)
    assert build_index(collection.root, idx, model=str(tiny_model), workers=0, device="cpu").unchanged == len(ImageIndex.open(idx))
    assert verify_index(idx).ok


def test_the_named_rebuild_repairs_a_damaged_part(built_index: Path, collection: Collection, tiny_model: Path, tmp_path: Path) -> None:
    from clipsearch.cli import main
    from indexer import build_index

    idx = tmp_path / "built.idx"
    shutil.copytree(built_index, idx)
    rel = file_of(idx, "part0")
    flip(idx / rel, page_offset(idx / rel, "path_bytes"), 2)
    [problem] = verify_index(idx).problems
    assert (problem.file, problem.check) == (rel, "checksum")
    assert problem.fix == f"rebuild the index with `clipsearch index {collection.root.resolve()} {idx} --rebuild`"
    with pytest.raises(IndexCorruptError, match="CRC"):
        build_index(collection.root, idx, model=str(tiny_model), workers=0, device="cpu")  # an update refuses
    # The command as printed (no --model: the rebuild keeps the index's model), run by the CLI.
    command = shlex.split(problem.fix.split("`")[1])
    assert command[0] == "clipsearch"
    assert main([*command[1:], "--workers", "0", "--device", "cpu", "--no-progress"]) == 0
    assert verify_index(idx).ok and ImageIndex.open(idx).manifest.model == str(tiny_model.resolve())


@pytest.mark.parametrize(("model", "gone"), [
    ("openai/clip-vit-base-patch32", None),
    ("open_clip:ViT-B-32/laion2b_s34b_b79k", None),
    ("open_clip:hf-hub:org/name", None),
    ("/no/such/checkpoint", "/no/such/checkpoint"),
    ("open_clip:local-dir:/no/such/dir", "/no/such/dir"),
    ("open_clip:ViT-B-32/tag@/no/such/weights.pt", "/no/such/weights.pt"),
    ("open_clip:/no/such/config.json@/no/such/weights.pt", "/no/such/config.json"),
])
def test_rebuild_hint_asks_for_model_where_its_files_are_gone(model: str, gone: str | None, tmp_path: Path) -> None:
    from retrieval.store import _gone_model_path

    assert _gone_model_path(model) == gone
    assert _gone_model_path(str(tmp_path)) is None
    assert _gone_model_path(f"open_clip:local-dir:{tmp_path}") is None


def test_a_damage_of_several_lines_is_told_in_one(idx: Path) -> None:
    """pyarrow's reason for an undecodable file can run over lines; the error stays one line with
    the fix at its end (the server shows only an error's first line)."""
    exc = IndexCorruptError(idx / "part.parquet", "unreadable: Couldn't deserialize thrift: No more data to read.\n"
                            "Deserializing page header failed.\n", "rebuild the index")
    assert "\n" not in str(exc) and str(exc).endswith("failed.); rebuild the index")
    assert exc.problem == "unreadable: Couldn't deserialize thrift: No more data to read. Deserializing page header failed."
