"""When and with what: ``taken``, ``camera`` and ``gps`` from EXIF, stored in the rows, filtered
(``--taken-after`` / ``--taken-before``), sorted (``--sort taken``) and returned; bad EXIF is
None, and an index written before the columns existed still opens, searches and updates."""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import cli_here
from helpers import assert_one_line_error
from photos import encoded, exif_bytes, photo, save
from PIL import Image

from retrieval.errors import InvalidArgumentError
from retrieval.filters import Filter, LocalTime, parse_taken, parse_time
from retrieval.images import decode_image, iso_taken, read_meta
from retrieval.images.exif import parse_exif_time, read_tiff_meta

UTC = dt.timezone.utc


def _us(*args: int, offset_min: int = 0) -> int:
    when = dt.datetime(*args, tzinfo=dt.timezone(dt.timedelta(minutes=offset_min)))  # type: ignore[misc]  # y, m, d, ...
    return (when - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)


@pytest.mark.parametrize(
    ("value", "offset", "want"),
    [
        ("2021:05:01 10:00:00", None, (_us(2021, 5, 1, 10), None)),
        ("2021:05:01 10:00:00", "+02:00", (_us(2021, 5, 1, 10, offset_min=120), 120)),
        ("2021:05:01 10:00:00", "-05:30", (_us(2021, 5, 1, 10, offset_min=-330), -330)),
        (b"2021:05:01 10:00:00\x00", "   :  ", (_us(2021, 5, 1, 10), None)),
        ("0000:00:00 00:00:00", "+02:00", (None, None)),
        ("    :  :     :  :  ", None, (None, None)),
        ("2021:13:01 10:00:00", None, (None, None)),
        ("yesterday", None, (None, None)),
        (20210501, None, (None, None)),
        (None, None, (None, None)),
        ("2021:05:01 10:00:00", "+99:00", (_us(2021, 5, 1, 10), None)),
    ],
)
def test_exif_times(value: object, offset: object, want: tuple[int | None, int | None]) -> None:
    assert parse_exif_time(value, offset) == want


def test_iso_taken_keeps_the_cameras_clock() -> None:
    assert iso_taken(_us(2021, 5, 1, 10, offset_min=120), 120) == "2021-05-01T10:00:00+02:00"
    assert iso_taken(_us(2021, 5, 1, 10), None) == "2021-05-01T10:00:00"
    assert iso_taken(None, 60) is None


def _meta(**exif: object) -> object:
    data = encoded(photo("coffee.png", max_side=48), "JPEG", exif=exif_bytes(**exif))  # type: ignore[arg-type]  # test values
    return read_meta(Image.open(io.BytesIO(data)))


def test_camera_and_gps_read_and_bad_values_dropped() -> None:
    good = _meta(taken="2023:07:14 18:30:00", offset="+02:00", make="Apple", model="iPhone 13",
                 gps=((33, 51, 0.0), "S", (151, 12, 36.0), "W"))
    assert good.camera == "Apple iPhone 13"  # type: ignore[attr-defined]
    assert good.gps_lat == pytest.approx(-33.85) and good.gps_lon == pytest.approx(-151.21)  # type: ignore[attr-defined]
    assert good.taken_offset == 120  # type: ignore[attr-defined]
    # The model repeats the make: said once.
    assert _meta(make="Canon", model="Canon EOS R5").camera == "Canon EOS R5"  # type: ignore[attr-defined]
    bad = _meta(taken="0000:00:00 00:00:00", gps=((200, 0, 0.0), "N", (10, 0, 0.0), "E"))
    assert (bad.taken_us, bad.gps_lat, bad.gps_lon) == (None, None, None)  # type: ignore[attr-defined]
    assert _meta(gps=((10, 0, 0.0), "N", (190, 0, 0.0), "E")).gps_lat is None  # type: ignore[attr-defined]
    assert _meta().camera is None  # type: ignore[attr-defined]


def test_broken_exif_never_fails_a_decode() -> None:
    img = photo("rocket.jpg", max_side=48)
    # An EXIF block that ends inside its first IFD: the photo decodes, without metadata.
    data = encoded(img, "JPEG", exif=b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\x00\x05\x01\x0f\x00\x02")
    decoded = decode_image(io.BytesIO(data), name="x.jpg")
    assert decoded.image.size == img.size and decoded.meta.taken_us is None
    assert read_tiff_meta(b"II*\x00\xff\xff\xff\xff").camera is None
    assert read_tiff_meta(b"\x89PNG").taken_us is None


def test_taken_filter_declaration() -> None:
    where = Filter(taken_after=parse_time("2021-01-01"), taken_before=parse_time("2022-01-01"))
    assert where.active
    with pytest.raises(InvalidArgumentError, match=r"taken_after \(2022-01-01\) is after taken_before \(2021-01-01\)"):
        Filter(taken_after=parse_time("2022-01-01"), taken_before=parse_time("2021-01-01"))
    with pytest.raises(InvalidArgumentError, match="cannot read time"):
        parse_time("last summer")
    taken = pa.chunked_array([pa.array([_us(2020, 6, 1), None, _us(2021, 6, 1), _us(2022, 1, 1)], pa.timestamp("us", tz="UTC"))])
    mask = where.mask(lambda name: taken, 4)
    assert mask.tolist() == [False, False, True, False]


# paris: 2024-01-01 00:30 on a clock at +02:00 (2023-12-31 22:30 UTC); noz: the same clock time
# with no offset recorded (stored as that time read as UTC); undated: no date at all.
_CLOCKS = {
    "taken": pa.chunked_array([pa.array([_us(2024, 1, 1, 0, 30, offset_min=120), _us(2024, 1, 1, 0, 30), None],
                                        pa.timestamp("us", tz="UTC"))]),
    "taken_offset": pa.chunked_array([pa.array([120, None, None], pa.int16())]),
}


@pytest.mark.parametrize(
    ("after", "before", "want"),
    [
        # Without a zone: the camera's clock, for photos with an offset and without.
        ("2024-01-01", None, [True, True, False]),
        (None, "2024-01-01", [False, False, False]),
        ("2024-01-01T00:30", "2024-01-01T00:31", [True, True, False]),
        (None, "2024-01-01T00:30", [False, False, False]),
        # With a zone: the instant; a photo without an offset is its clock's time read as UTC.
        ("2024-01-01T00:00+00:00", None, [False, True, False]),
        (None, "2024-01-01T00:00+00:00", [True, False, False]),
        ("2023-12-31T22:30Z", "2023-12-31T22:31Z", [True, False, False]),
        ("2024-01-01T02:30+02:00", None, [False, True, False]),  # 00:30 UTC: noz, not paris
        # One of each: paris's clock is from 1 January on, its instant before it.
        ("2024-01-01", "2024-01-01T00:00Z", [True, False, False]),
    ],
)
def test_taken_bounds_without_a_zone_are_the_cameras_clock(after: str | None, before: str | None, want: list[bool]) -> None:
    where = Filter(taken_after=parse_taken(after) if after else None, taken_before=parse_taken(before) if before else None)
    assert where.mask(_CLOCKS.__getitem__, 3).tolist() == want


def test_taken_bound_declarations() -> None:
    assert parse_taken("2024-01-01") == LocalTime(parse_time("2024-01-01"))
    assert parse_taken("2024-01-01T12:30") == LocalTime(parse_time("2024-01-01T12:30"))
    assert parse_taken("2024-01-01T00:00+02:00") == parse_time("2024-01-01T00:00+02:00")
    # A clock bound and an instant are different filters (an opened index keeps a mask per filter).
    assert Filter(taken_after=parse_taken("2024-01-01")) != Filter(taken_after=parse_taken("2024-01-01T00:00Z"))
    for bad in ("last summer", "2024-13-01", ""):
        with pytest.raises(InvalidArgumentError, match="cannot read time"):
            parse_taken(bad)
    with pytest.raises(InvalidArgumentError, match="integer"):
        LocalTime("2024-01-01")  # type: ignore[arg-type]  # the bad value under test
    with pytest.raises(InvalidArgumentError, match="must be an integer"):
        Filter(modified_after=LocalTime(0))  # type: ignore[arg-type]  # only taken bounds read a clock
    with pytest.raises(InvalidArgumentError, match=r"^taken_after \(2024-01-02T10:00:00\) is after taken_before \(2024-01-01\): "):
        Filter(taken_after=parse_taken("2024-01-02T10:00"), taken_before=parse_taken("2024-01-01"))
    # A clock bound against an instant: refused only when no offset can bring them together.
    with pytest.raises(InvalidArgumentError, match=r"taken_after \(2024-01-02\) is after taken_before \(2024-01-01\)"):
        Filter(taken_after=parse_taken("2024-01-02"), taken_before=parse_taken("2024-01-01T00:00Z"))
    Filter(taken_after=parse_taken("2024-01-01T12:00"), taken_before=parse_taken("2024-01-01T00:00Z"))
    Filter(taken_after=parse_taken("2024-01-01T12:00Z"), taken_before=parse_taken("2024-01-01T00:00"))


@pytest.fixture(scope="module")
def zoned(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """The tester's folder: paris.jpg at 00:30 on 1 January on a +02:00 clock, noz.jpg at the
    same clock time without an offset, and its index."""
    from indexer import build_index

    base = tmp_path_factory.mktemp("zoned")
    root = base / "tz"
    root.mkdir()
    save(photo("chelsea.png", max_side=64), root / "paris.jpg", "JPEG", exif=exif_bytes("2024:01:01 00:30:00", "+02:00"))
    save(photo("rocket.jpg", max_side=64), root / "noz.jpg", "JPEG", exif=exif_bytes("2024:01:01 00:30:00"))
    out = base / "tz.idx"
    build_index(root, out, model=str(tiny_model), batch_size=8, workers=0, device="cpu")
    return out


def test_cli_and_http_dates_without_a_zone_are_the_cameras_clock(zoned: Path, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from clipsearch.server import create_app

    def cli(*flags: str) -> list[str]:
        proc = cli_here(["search", zoned, "a photo", *flags, "--json", "--device", "cpu"])
        assert proc.returncode == 0, proc.stderr
        return sorted(r["path"] for r in json.loads(proc.stdout)["results"])

    assert cli("--taken-after", "2024-01-01") == ["noz.jpg", "paris.jpg"]
    assert cli("--taken-before", "2024-01-01") == []
    assert cli("--taken-after", "2024-01-01T00:00+00:00") == ["noz.jpg"]
    assert cli("--taken-before", "2024-01-01T00:00+00:00") == ["paris.jpg"]
    app = create_app([zoned], cache_dir=tmp_path / "thumbs", device="cpu", warm=False, precision="fp32")
    with TestClient(app, raise_server_exceptions=False) as client:
        def http(**filters: str) -> tuple[list[str], list[str]]:
            got = client.get("/api/search", params={"q": "a photo", **filters})
            posted = client.post("/api/search", json={"text": "a photo", "filters": filters})
            assert got.status_code == posted.status_code == 200, (got.text, posted.text)
            return sorted(r["path"] for r in got.json()["results"]), sorted(r["path"] for r in posted.json()["results"])

        assert http(taken_after="2024-01-01") == (["noz.jpg", "paris.jpg"],) * 2
        assert http(taken_before="2024-01-01") == ([], [])
        # The web page's "Taken from 2024-01-01 to 2024-01-01": taken_before the next day.
        assert http(taken_after="2024-01-01", taken_before="2024-01-02") == (["noz.jpg", "paris.jpg"],) * 2
        assert http(taken_before="2024-01-01T00:00+00:00") == (["paris.jpg"],) * 2
        assert client.get("/api/search", params={"q": "a photo", "taken_after": "2024-01-02",
                                                 "taken_before": "2024-01-01"}).status_code == 400


@pytest.fixture(scope="module")
def dated(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> tuple[Path, Path]:
    """Five photos taken on known days (one undated) and their index."""
    from indexer import build_index

    base = tmp_path_factory.mktemp("dated")
    root = base / "photos"
    root.mkdir()
    save(photo("chelsea.png"), root / "cat.heic", "HEIF", quality=80,
         exif=exif_bytes("2023:07:14 18:30:00", "+02:00", "Apple", "iPhone 13", ((48, 51, 29.0), "N", (2, 17, 40.0), "E")))
    save(photo("rocket.jpg"), root / "rocket.jpg", "JPEG", exif=exif_bytes("2019:03:02 10:00:00", make="NIKON", model="D750"))
    save(photo("coffee.png"), root / "coffee.jpg", "JPEG", exif=exif_bytes("2021:11:30 08:15:00"))
    save(photo("astronaut.png"), root / "astronaut.avif", "AVIF", exif=exif_bytes("2020:02:29 23:59:59", "-08:00"))
    save(photo("motorcycle_left.png"), root / "bike.png", "PNG")
    out = base / "dated.idx"
    build_index(root, out, model=str(tiny_model), batch_size=8, workers=0, device="cpu")
    return root, out


def test_columns_and_hits_carry_the_facts(dated: tuple[Path, Path]) -> None:
    from retrieval.index import ImageIndex

    index = ImageIndex.open(dated[1])
    hits = {h.path: h for h in index.search("a photo", k=10)}
    assert hits["cat.heic"].taken == "2023-07-14T18:30:00+02:00"
    assert hits["cat.heic"].camera == "Apple iPhone 13"
    assert hits["cat.heic"].gps == pytest.approx((48.858, 2.2944), abs=1e-3)
    assert hits["rocket.jpg"].taken == "2019-03-02T10:00:00" and hits["rocket.jpg"].camera == "NIKON D750"
    assert hits["bike.png"].taken is None and hits["bike.png"].gps is None
    assert hits["astronaut.avif"].to_dict()["taken"] == "2020-02-29T23:59:59-08:00"


def test_taken_filters_and_sort(dated: tuple[Path, Path]) -> None:
    from retrieval.index import ImageIndex

    index = ImageIndex.open(dated[1])
    since_2021 = index.search("a photo", k=10, where=Filter(taken_after=parse_time("2021-01-01")))
    assert {h.path for h in since_2021} == {"cat.heic", "coffee.jpg"}
    before = index.search("a photo", k=10, where=Filter(taken_before=parse_time("2020-03-01T07:59:59Z")))
    assert {h.path for h in before} == {"rocket.jpg"}  # the AVIF is 2020-03-01T07:59:59 UTC, not before
    newest = index.search("a photo", k=10, sort="taken")
    assert [h.path for h in newest] == ["cat.heic", "coffee.jpg", "astronaut.avif", "rocket.jpg", "bike.png"]
    # k caps the hits the search selects, then they are ordered.
    top2 = index.search("a photo", k=2)
    assert {h.path for h in index.search("a photo", k=2, sort="taken")} == {h.path for h in top2}
    with pytest.raises(InvalidArgumentError, match="sort must be one of score, taken"):
        index.search("a photo", sort="date")


@pytest.mark.slow
def test_cli_taken_json_and_bad_dates(dated: tuple[Path, Path]) -> None:
    out = dated[1]
    proc = cli_here(["search", out, "a photo", "--taken-after", "2021-01-01", "--sort", "taken", "--json", "--device", "cpu"])
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)["results"]
    assert [r["path"] for r in results] == ["cat.heic", "coffee.jpg"]
    assert results[0]["taken"] == "2023-07-14T18:30:00+02:00" and results[0]["camera"] == "Apple iPhone 13"
    assert results[0]["gps"] == pytest.approx([48.858, 2.2944], abs=1e-3)
    text = cli_here(["search", out, "a photo", "--sort", "taken", "--device", "cpu"])
    assert text.returncode == 0 and text.stdout.splitlines()[-1].endswith("bike.png  undated")
    bad = cli_here(["search", out, "a photo", "--taken-after", "last summer"])
    assert_one_line_error(bad.returncode, bad.stderr, "cannot read time", "last summer")
    inverted = cli_here(["search", out, "a photo", "--taken-after", "2022-01-01", "--taken-before", "2021-01-01"])
    assert_one_line_error(inverted.returncode, inverted.stderr, "taken_after")


@pytest.mark.slow
def test_index_without_the_columns_opens_searches_and_updates(tmp_path: Path, tiny_model: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import indexer.writer
    from indexer import build_index
    from retrieval.index import ImageIndex
    from retrieval.layout import PHOTO_COLUMNS, embeddings_schema

    photos = tmp_path / "p"
    photos.mkdir()
    save(photo("rocket.jpg"), photos / "rocket.jpg", "JPEG", exif=exif_bytes("2019:03:02 10:00:00"))
    save(photo("coffee.png"), photos / "coffee.png", "PNG")
    new = {f.name for f in PHOTO_COLUMNS}
    # The parts as the code before these columns wrote them.
    def old_schema(dim: int) -> pa.Schema:
        return pa.schema([f for f in embeddings_schema(dim) if f.name not in new])

    monkeypatch.setattr(indexer.writer, "embeddings_schema", old_schema)
    out = tmp_path / "old.idx"
    build_index(photos, out, model=str(tiny_model), workers=0, device="cpu")
    monkeypatch.undo()
    old = ImageIndex.open(out)
    assert not new & set(old._rows.parts[0].schema_arrow.names)
    assert all(h.taken is None for h in old.search("a rocket", k=5))
    assert old.search("a rocket", k=5, where=Filter(taken_after=parse_time("2000-01-01"))) == []
    # Every photo undated: the newest-first order is the score order.
    assert [h.path for h in old.search("a rocket", sort="taken", min_score=-1)] == [h.path for h in old.search("a rocket")]
    assert old.rows([0], columns=("path", "taken", "camera"))[0]["taken"] is None
    # An update writes the new columns for its new rows; the old rows stay null.
    save(photo("chelsea.png"), photos / "cat.jpg", "JPEG", exif=exif_bytes("2023:07:14 18:30:00", make="Fujifilm", model="X100V"))
    build_index(photos, out, model=str(tiny_model), workers=0, device="cpu")
    updated = ImageIndex.open(out)
    dated = updated.search("a cat", k=5, where=Filter(taken_after=parse_time("2000-01-01")))
    assert [(h.path, h.camera) for h in dated] == [("cat.jpg", "Fujifilm X100V")]
    assert [h.path for h in updated.search("a cat", k=5, sort="taken")][0] == "cat.jpg"
    # A rebuild of the FAISS side and a merge of the parts keep every row.
    proc = cli_here(["reindex", out, "--index-type", "flat"])
    assert proc.returncode == 0, proc.stderr
    again = ImageIndex.open(out)
    assert sorted(again.metadata.paths()) == ["cat.jpg", "coffee.png", "rocket.jpg"]
    since = Filter(taken_after=parse_time("2000-01-01"))
    assert np.array_equal(again.metadata.mask(since), updated.metadata.mask(since))
    from retrieval import verify_index

    assert verify_index(out).ok


def test_ray_columns_carry_the_facts() -> None:
    # A Ray actor's answer travels as Arrow-friendly columns: the facts survive the trip.
    from indexer.dataset import Item
    from indexer.embed import EmbeddedBatch
    from indexer.ray_actor import from_columns, to_columns
    from retrieval.images import PhotoMeta

    meta = PhotoMeta(_us(2021, 5, 1, 10), 120, "Apple iPhone 13", 48.8, 2.3, None)
    items = [Item(0, None, 4, 3, None, 0.1, 10, 1, "ab", meta=meta), Item(1, None, 0, 0, "empty file", 0.0)]
    done = EmbeddedBatch(items, np.ones((1, 2), np.float32), 0.1, 0.2)
    back = from_columns(to_columns(np.array([0, 1]), done, 2))
    assert back.items[0].meta == meta and back.items[1].error == "empty file"


def test_rows_of_an_older_part_are_copied_with_null_facts(tmp_path: Path) -> None:
    # A merge or an update copies rows of parts written before the photo columns: nulls there.
    import pyarrow.parquet as pq

    from indexer.writer import FileRecord, PartWriter, conform, records_table
    from retrieval.images import PhotoMeta
    from retrieval.layout import PHOTO_COLUMNS, embeddings_schema

    new = {f.name for f in PHOTO_COLUMNS}
    rows = records_table([FileRecord(b"a.jpg", 4, 3, 10, 1, "ab", PhotoMeta(camera="X"))], np.ones((1, 2), np.float32), 2)
    old = rows.drop_columns(sorted(new))
    part = PartWriter(tmp_path / "part.parquet", 2, "f" * 32)
    part.write_table(old)
    part.write_table(rows)
    assert part.close() == 2
    table = pq.read_table(tmp_path / "part.parquet")
    assert table.column("camera").to_pylist() == [None, "X"] and table.column("id").to_pylist() == [0, 1]
    with pytest.raises(ValueError, match="lack the column 'path'"):
        conform(old.drop_columns(["path"]), embeddings_schema(2))
