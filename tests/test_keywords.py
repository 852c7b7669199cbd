"""The keyword side (issue 42): words from file names, embedded EXIF/XMP metadata, captions and
OCR, matched by SQLite FTS5 and fused with the vector ranking, through every front end.

A tiny random model: these tests check mechanics (what matches, what is stored, what each mode
returns), never ranking quality.
"""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import sqlite3
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_here
from PIL import Image, ImageDraw, ImageFont

from indexer import build_index
from retrieval import ImageIndex
from retrieval.errors import EngineError, InvalidArgumentError
from retrieval.filters import Filter
from retrieval.images.embedded_text import MAX_XMP_BYTES, parse_xmp, read_embedded_text
from retrieval.keywords import (
    EDGE_CREDIT,
    INSIDE_CREDIT,
    KEYWORD_WEIGHT,
    MAX_QUERY_CHARS,
    Z_FLOOR,
    CosineScale,
    fold,
    fuse,
    matched_words,
    query_terms,
    word_credit,
    words_of,
)
from retrieval.layout import read_manifest, write_manifest
from retrieval.tools.verify import verify_index

XMP = (
    '<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
    '<rdf:Description xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:subject><rdf:Bag><rdf:li>Café</rdf:li>'
    "<rdf:li>birthday</rdf:li></rdf:Bag></dc:subject><dc:description><rdf:Alt><rdf:li xml:lang=\"x-default\">"
    "Grandma at the party</rdf:li></rdf:Alt></dc:description></rdf:Description></rdf:RDF></x:xmpmeta>"
).encode()
BOMB = (
    b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">]>'
    b'<x:xmpmeta xmlns:x="adobe:ns:meta/">&lol2;</x:xmpmeta>'
)
EXTERNAL = b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]><x>&e;</x>'


def _noise(seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (48, 64, 3), dtype=np.uint8))


def _with_exif_text(img: Image.Image) -> bytes:
    exif = Image.Exif()
    exif[0x010E] = "Sunset over the harbour"
    exif[0x9C9E] = "lighthouse;Portugal".encode("utf-16-le")
    buf = io.BytesIO()
    img.save(buf, "JPEG", exif=exif)
    return buf.getvalue()


def make_photos(root: Path) -> Path:
    (root / "Venice trip").mkdir(parents=True)
    _noise(0).save(root / "Venice trip" / "venice_gondola_2019.jpg")
    _noise(1).save(root / "concatenate.jpg")
    _noise(2).save(root / "cat.jpg")
    _noise(3).save(root / "TokyoMarathon2026.jpg")
    _noise(4).save(root / "INVOICE4711.png")
    _noise(5).save(root / "party.jpg", xmp=XMP)
    _noise(6).save(root / "bomb.jpg", xmp=BOMB)
    (root / "harbour.jpg").write_bytes(_with_exif_text(_noise(7)))
    for i in range(4):
        _noise(10 + i).save(root / f"IMG_{i:04d}.jpg")
    (root / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    return root


@pytest.fixture(scope="module")
def kw_index(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> tuple[Path, Path]:
    photos = make_photos(tmp_path_factory.mktemp("kw") / "photos")
    out = photos.parent / "photos.idx"
    build_index(photos, out, model=str(tiny_model), batch_size=8, workers=0, device="cpu", precision="fp32")
    return photos, out


def _paths(hits: list) -> list[str]:
    return [h.path for h in hits]


# -- words ------------------------------------------------------------------------------------------


def test_words_split_runs_fold_case_and_accents() -> None:
    assert {"tokyo", "marathon", fold("2026")} <= set(words_of("TokyoMarathon2026"))
    assert {"invoice", "4711"} <= set(words_of("INVOICE4711"))
    assert {"venice", "gondola", fold("2019")} <= set(words_of("venice_gondola_2019"))
    assert "cafe" in words_of("CAFÉ")
    # OCR reads O as 0: both sides fold the digit 0 to the letter o; results show the query's own words.
    assert "invoice" in words_of("INV0ICE") and fold("2019") == "2o19"
    assert matched_words(query_terms("invoice 2019"), "INV0ICE 2019") == ["invoice", "2019"]


def test_a_query_is_text_never_syntax() -> None:
    for query in ['"unbalanced', "a AND b OR NOT c", "(x) [y] {z}", "*", "-minus", "col:on", "back\\slash", "NEAR(a b)", "^"]:
        query_terms(query)  # never raises
    assert query_terms('"Invoice" AND (4711) -cat* : \\').words == ("invoice", "4711", "cat")
    # One-letter words and stop words alone match nothing.
    assert query_terms("a the of I x").words == ()
    with pytest.raises(InvalidArgumentError, match=f"at most {MAX_QUERY_CHARS}"):
        query_terms("x" * 10_000)


def test_matching_rules() -> None:
    terms = query_terms("marathon 4711 cat")
    assert matched_words(terms, "TOKYOMARATHON2026 INVOICE4711") == ["marathon", "4711"]
    # A short fragment matches whole words, the end of a run and its plural; not the start or the
    # inside of longer ones.
    assert matched_words(query_terms("cat"), "concatenate") == []
    assert matched_words(query_terms("cat"), "cathedral") == []
    assert matched_words(query_terms("cat"), "a cat.jpg") == ["cat"]
    assert matched_words(query_terms("cat"), "blackcat") == ["cat"]
    assert matched_words(query_terms("cat"), "cats/tiger") == ["cat"]


@pytest.mark.parametrize(
    ("word", "text", "credit"),
    [
        ("cat", "cat", 1.0), ("marathon", "TokyoMarathon2026", 1.0), ("black", "rhino_black", 1.0),
        ("cat", "blackcat", EDGE_CREDIT), ("cat", "cats", EDGE_CREDIT), ("guinea", "guineafowl", EDGE_CREDIT),
        ("black", "blackbuck", EDGE_CREDIT), ("marathon", "TOKYOMARATHONRUN", INSIDE_CREDIT),
        ("cat", "concatenate", 0.0), ("car", "cartoon", 0.0), ("cat", None, 0.0), ("dog", "a cat", 0.0),
    ],
)
def test_a_whole_word_counts_more_than_a_part(word: str, text: str | None, credit: float) -> None:
    assert word_credit(word, text) == credit


def test_fusion_weighs_the_keyword_share_against_standard_deviations_of_cosine() -> None:
    scale = CosineScale(mean=0.1, std=0.2)
    ids = np.array([1, 3, 5, 9])
    cosines = np.array([0.1, 0.8, 0.9, -0.9])  # z: 0, 3.5, 4, -5
    # No words matched: the vector order, exactly.
    order, score = fuse(ids, cosines, np.zeros(4), scale)
    assert ids[order].tolist() == [5, 3, 1, 9]
    # Cosines below the floor count the same: the words decide among them, then the cosine.
    assert score[0] == score[3] == Z_FLOOR
    # A full match (8 standard deviations) lifts an image above the vector side's best; a small
    # share does not.
    order, score = fuse(ids, cosines, np.array([0.0, 0.0, 0.0, 1.0]), scale)
    assert ids[order].tolist() == [9, 5, 3, 1] and score[3] == pytest.approx(Z_FLOOR + KEYWORD_WEIGHT)
    order, _ = fuse(ids, cosines, np.array([0.2, 0.0, 0.0, 0.0]), scale)
    assert ids[order].tolist() == [5, 3, 1, 9]


# -- embedded metadata ------------------------------------------------------------------------------


def test_xmp_exif_keywords_are_read(tmp_path: Path) -> None:
    _noise(0).save(tmp_path / "a.jpg", xmp=XMP)
    with Image.open(tmp_path / "a.jpg") as img:
        text = read_embedded_text(img)
    assert text.description == "Grandma at the party" and text.keywords == "Café\nbirthday" and text.note is None
    with Image.open(io.BytesIO(_with_exif_text(_noise(1)))) as img:
        text = read_embedded_text(img)
    assert text.description == "Sunset over the harbour" and text.keywords == "lighthouse\nPortugal"


def _with_iptc(jpeg: bytes, records: list[tuple[int, bytes]]) -> bytes:
    """``jpeg`` with an APP13 Photoshop block holding IPTC IIM dataset-2 ``records``, laid out as
    Photoshop and digiKam write it (Pillow cannot write IPTC)."""
    iim = b"".join(b"\x1c\x02" + bytes([dataset]) + struct.pack(">H", len(data)) + data for dataset, data in records)
    iim += b"\x00" * (len(iim) % 2)
    resource = b"8BIM" + struct.pack(">H", 0x0404) + b"\x00\x00" + struct.pack(">I", len(iim)) + iim
    payload = b"Photoshop 3.0\x00" + resource
    return jpeg[:2] + b"\xff\xed" + struct.pack(">H", len(payload) + 2) + payload + jpeg[2:]


def test_iptc_keywords_and_caption_are_read_utf8_or_latin1(tmp_path: Path) -> None:
    buf = io.BytesIO()
    _noise(3).save(buf, "JPEG")
    records = [(25, "Café".encode()), (25, "Z\xfcrich".encode("latin-1")), (120, b"Old town at dusk")]
    (tmp_path / "iptc.jpg").write_bytes(_with_iptc(buf.getvalue(), records))
    with Image.open(tmp_path / "iptc.jpg") as img:
        text = read_embedded_text(img)
    assert text.keywords == "Café\nZürich" and text.description == "Old town at dusk" and text.note is None
    # A block whose record claims more bytes than it holds: that file's note, never an error.
    broken = _with_iptc(buf.getvalue(), [(25, b"ok")]).replace(b"\x1c\x02\x19\x00\x02ok", b"\x1c\x02\x19\xff\xf0ok")
    (tmp_path / "bad.jpg").write_bytes(broken)
    with Image.open(tmp_path / "bad.jpg") as img:
        text = read_embedded_text(img)
    assert text.keywords is None and text.note is not None and "IPTC" in text.note


@pytest.mark.parametrize(
    ("packet", "why"),
    [(BOMB, "XMP refused"), (EXTERNAL, "XMP refused"), (b"<x:xmpmeta><unclosed>", "malformed XMP"),
     (b"<a>" + b"k" * (MAX_XMP_BYTES + 1) + b"</a>", "over the")],
)
def test_bad_xmp_is_refused_with_a_note(tmp_path: Path, packet: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_xmp(packet)
    from PIL.PngImagePlugin import PngInfo

    # PNG: its iTXt chunk holds an XMP packet of any size (a JPEG segment stops at 64 KB).
    info = PngInfo()
    info.add_itxt("XML:com.adobe.xmp", packet.decode("utf-8"))
    _noise(0).save(tmp_path / "a.png", pnginfo=info)
    with Image.open(tmp_path / "a.png") as img:
        text = read_embedded_text(img)
    assert text.description is None and text.keywords is None and text.note is not None and why in text.note


# -- the index ------------------------------------------------------------------------------------


def test_columns_manifest_and_info(kw_index: tuple[Path, Path]) -> None:
    import pyarrow.parquet as pq

    _, out = kw_index
    m = read_manifest(out)
    assert m.keywords is not None and m.keywords.rows == m.count and not m.keywords.ocr
    assert m.keywords.sources == ("path", "embedded") and m.keywords.with_text == 2
    table = pq.read_table(out / m.parts[0].path, columns=["path", "description", "keywords", "ocr_text"]).to_pylist()
    by_path = {r["path"]: r for r in table}
    assert by_path["party.jpg"]["keywords"] == "Café\nbirthday"
    assert by_path["bomb.jpg"]["description"] is None and by_path["cat.jpg"]["ocr_text"] is None
    info = ImageIndex.open(out, device="cpu").info()["keywords"]
    assert info["with_text"] == 2 and info["by_source"]["embedded"] == 2 and info["ocr"] is False


def test_keyword_mode_returns_only_matching_images(kw_index: tuple[Path, Path]) -> None:
    idx = ImageIndex.open(kw_index[1], device="cpu")
    assert _paths(idx.search("4711", mode="keyword")) == ["INVOICE4711.png"]
    assert _paths(idx.search("marathon", mode="keyword")) == ["TokyoMarathon2026.jpg"]
    assert _paths(idx.search("CAFE", mode="keyword")) == ["party.jpg"]
    assert _paths(idx.search("lighthouse harbour", mode="keyword")) == ["harbour.jpg"]
    assert _paths(idx.search("venice", mode="keyword")) == ["Venice trip/venice_gondola_2019.jpg"]
    assert _paths(idx.search("cat", mode="keyword")) == ["cat.jpg"]  # not concatenate.jpg
    assert idx.search("the a of", mode="keyword") == []
    hit = idx.search("grandma birthday", mode="keyword")[0]
    assert hit.matched == {"embedded": ("grandma", "birthday")}
    cosine = idx.vectors.vectors_of([hit.id])[0] @ idx.encoders.embed_texts(["grandma birthday"])[0]
    assert hit.score == pytest.approx(float(cosine), abs=1e-5)


def test_hybrid_is_the_default_and_exactly_vector_without_a_match(kw_index: tuple[Path, Path]) -> None:
    idx = ImageIndex.open(kw_index[1], device="cpu")
    for query in ("zebra crossing", '"AND" (x) * - : \\'):
        hybrid, vector = idx.search(query, k=5), idx.search(query, k=5, mode="vector")
        assert [(h.id, h.score) for h in hybrid] == [(h.id, h.score) for h in vector]
        assert all(h.matched == {} for h in hybrid) and all(h.matched is None for h in vector)
    fused = idx.search("invoice 4711", k=5)
    assert fused[0].path == "INVOICE4711.png" and fused[0].matched == {"path": ("invoice", "4711")}
    assert len(fused) == 5


def test_filters_k_and_bad_input_apply_to_both_sides(kw_index: tuple[Path, Path]) -> None:
    idx = ImageIndex.open(kw_index[1], device="cpu")
    assert idx.search("4711", mode="keyword", where=Filter(path_glob="IMG_*")) == []
    hits = idx.search("4711", k=3, where=Filter(path_glob="IMG_*"))
    assert len(hits) == 3 and all(h.path.startswith("IMG_") for h in hits)
    assert len(idx.search("venice", k=1)) == 1
    with pytest.raises(InvalidArgumentError, match="mode must be one of"):
        idx.search("x", mode="fuzzy")
    with pytest.raises(InvalidArgumentError, match="characters long"):
        idx.search("word " * 2000)


def test_an_older_index_gets_its_keyword_side_without_embedding(kw_index: tuple[Path, Path], tmp_path: Path, tiny_model: Path) -> None:
    photos, built = kw_index
    out = tmp_path / "old.idx"
    shutil.copytree(built, out)
    write_manifest(out, dataclasses.replace(read_manifest(out), keywords=None))
    old = ImageIndex.open(out, device="cpu")
    assert old.keywords is None and old.info()["keywords"] is None
    assert [h.id for h in old.search("venice", k=3)] == [h.id for h in old.search("venice", k=3, mode="vector")]
    with pytest.raises(InvalidArgumentError, match="no keyword side"):
        old.search("venice", mode="keyword")
    report = build_index(photos, out, model=str(tiny_model), batch_size=8, workers=0, device="cpu")
    assert report.embedded == 0
    assert _paths(ImageIndex.open(out, device="cpu").search("venice", mode="keyword")) == ["Venice trip/venice_gondola_2019.jpg"]


def test_updates_add_and_remove_words(kw_index: tuple[Path, Path], tmp_path: Path, tiny_model: Path) -> None:
    photos = tmp_path / "photos"
    shutil.copytree(kw_index[0], photos)
    out = tmp_path / "upd.idx"
    shutil.copytree(kw_index[1], out)
    _noise(40).save(photos / "zanzibar_beach.jpg")
    report = build_index(photos, out, model=str(tiny_model), batch_size=8, workers=0, device="cpu")
    assert report.added == 1
    idx = ImageIndex.open(out, device="cpu")
    assert _paths(idx.search("zanzibar", mode="keyword")) == ["zanzibar_beach.jpg"]
    assert _paths(idx.search("marathon", mode="keyword")) == ["TokyoMarathon2026.jpg"]
    (photos / "TokyoMarathon2026.jpg").unlink()
    report = build_index(photos, out, model=str(tiny_model), batch_size=8, workers=0, device="cpu")
    assert report.removed == 1 and report.embedded == 0
    idx = ImageIndex.open(out, device="cpu")
    assert idx.search("marathon", mode="keyword") == []
    assert _paths(idx.search("zanzibar", mode="keyword")) == ["zanzibar_beach.jpg"]
    assert verify_index(out).ok


def test_verify_covers_the_keyword_file(kw_index: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "v.idx"
    shutil.copytree(kw_index[1], out)
    m = read_manifest(out)
    assert m.keywords is not None
    path = out / m.keywords.path
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    report = verify_index(out)
    assert not report.ok and [(p.file, p.check) for p in report.problems] == [(m.keywords.path, "checksum")]
    path.write_bytes(b"short")
    from retrieval.errors import IndexCorruptError

    with pytest.raises(IndexCorruptError, match="keywords.sqlite"):
        ImageIndex.open(out)


def test_the_keyword_file_is_sqlite_fts5_readable_as_is(kw_index: tuple[Path, Path]) -> None:
    m = read_manifest(kw_index[1])
    assert m.keywords is not None
    con = sqlite3.connect(kw_index[1] / m.keywords.path)
    assert con.execute("SELECT count(*) FROM texts").fetchone()[0] == m.count
    assert con.execute("SELECT count(*) FROM words WHERE words MATCH 'gondola'").fetchone()[0] == 1


def test_eval_mode(kw_index: tuple[Path, Path], tmp_path: Path) -> None:
    from retrieval.tools.evaluation import Query, evaluate

    idx = ImageIndex.open(kw_index[1], device="cpu")
    queries = [
        Query(text="invoice 4711", relevant=("INVOICE4711.png",)),
        Query(text="gondola", relevant=("Venice trip/venice_gondola_2019.jpg",)),
    ]
    vector = evaluate(idx, queries)
    hybrid = evaluate(idx, queries, mode="hybrid")
    assert vector.ranking == "exact" and hybrid.ranking == "hybrid" and hybrid.mrr == 1.0
    with pytest.raises(InvalidArgumentError):
        evaluate(idx, queries, mode="bogus")


def test_http_mode(kw_index: tuple[Path, Path], tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from clipsearch.server import create_app

    with TestClient(create_app([kw_index[1]], cache_dir=tmp_path, device="cpu", warm=False), raise_server_exceptions=False) as c:
        got = c.get("/api/search", params={"q": "4711", "mode": "keyword"}).json()["results"]
        assert [r["path"] for r in got] == ["INVOICE4711.png"] and got[0]["matched"] == {"path": ["4711"]}
        body = c.post("/api/search", json={"text": "venice", "mode": "hybrid", "k": 2}).json()["results"]
        assert body[0]["path"] == "Venice trip/venice_gondola_2019.jpg" and len(body) == 2
        vector = c.post("/api/search", json={"text": "venice", "mode": "vector", "k": 2}).json()["results"]
        assert all(r["matched"] is None for r in vector)
        bad = c.get("/api/search", params={"q": "x", "mode": "fuzzy"})
        assert bad.status_code == 400 and "mode must be one of" in bad.json()["error"]
        long = c.get("/api/search", params={"q": "x" * 10_000})
        assert 400 <= long.status_code < 500
        assert c.post("/api/search", json={"image_id": 0, "mode": "keyword"}).status_code == 400


def test_cli_mode(kw_index: tuple[Path, Path]) -> None:
    proc = cli_here(["search", kw_index[1], "INVOICE 4711", "--mode", "keyword", "--json", "--device", "cpu"])
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)["results"]
    assert [r["path"] for r in results] == ["INVOICE4711.png"] and results[0]["matched"] == {"path": ["invoice", "4711"]}
    bad = cli_here(["search", kw_index[1], "x", "--mode", "fuzzy"])
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


# -- OCR ----------------------------------------------------------------------------------------------


def test_ocr_reads_rendered_text_records_the_flag_and_counts_unreadable(tmp_path: Path, tiny_model: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    sign = Image.new("RGB", (360, 120), (235, 235, 225))
    font = ImageFont.truetype("DejaVuSans-Bold.ttf", 28) if _has_font() else ImageFont.load_default(28)
    ImageDraw.Draw(sign).text((20, 40), "INVOICE 4711", font=font, fill=(0, 0, 0))
    sign.save(photos / "scan.jpg", quality=90)
    _noise(1).save(photos / "plain.jpg")
    out = tmp_path / "ocr.idx"
    report = build_index(photos, out, model=str(tiny_model), batch_size=8, workers=0, device="cpu", precision="fp32", ocr=True)
    assert report.with_ocr_text == 1
    m = read_manifest(out)
    assert m.keywords is not None and m.keywords.ocr and "ocr" in m.keywords.sources
    hit = ImageIndex.open(out, device="cpu").search("4711", mode="keyword")[0]
    assert hit.path == "scan.jpg" and hit.matched == {"ocr": ("4711",)} and "4711" in (hit.ocr_text or "")
    # A re-run without --ocr keeps it (recorded like --precision); an image OCR cannot read is
    # indexed without text and counted.
    from indexer import ocr

    def fail(image: Image.Image) -> str:
        raise RuntimeError("engine failure")

    monkeypatch.setattr(ocr, "recognise", fail)
    _noise(2).save(photos / "new.jpg")
    report = build_index(photos, out, model=str(tiny_model), batch_size=8, workers=0, device="cpu")
    assert report.added == 1 and report.text_notes == 1
    assert read_manifest(out).keywords.ocr  # type: ignore[union-attr]


def _has_font() -> bool:
    try:
        ImageFont.truetype("DejaVuSans-Bold.ttf", 10)
    except OSError:
        return False
    return True


def test_missing_ocr_engine_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from indexer import ocr

    monkeypatch.setitem(sys.modules, "rapidocr_onnxruntime", None)
    with pytest.raises(EngineError, match="rapidocr-onnxruntime") as exc:
        ocr.check_engine()
    assert "\n" not in str(exc.value)


def test_ray_actor_carries_the_text_to_the_driver() -> None:
    # What a Ray actor sends back (its columns) brings each photo's words and OCR text along,
    # so --engine ray writes the same text columns as the local engine.
    from indexer.dataset import Item
    from indexer.embed import EmbeddedBatch
    from indexer.ray_actor import ActorSpec, from_columns, to_columns
    from retrieval.images import PhotoMeta

    meta = PhotoMeta(description="Grandma", keywords="Café\nbirthday", ocr_text="INVOICE4711", note="XMP refused")
    item = Item(0, None, 4, 3, None, 0.1, 10, 1, "ab", meta=meta)
    back = from_columns(to_columns(np.array([7]), EmbeddedBatch([item], np.ones((1, 2), np.float32), 0.1, 0.2), 2))
    assert back.items[0].meta == meta
    assert {f.name for f in dataclasses.fields(ActorSpec)} >= {"ocr"}
