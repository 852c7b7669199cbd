"""retrieval.tools.evaluation's dataset readers, split files and writers.

Karpathy / CSV / JSONL captions -> images to index and queries.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retrieval.errors import ClipSearchError, DatasetError
from retrieval.tools.evaluation.captioned_set import CaptionedSet, normalize_image_path
from retrieval.tools.evaluation.dataset_readers import load_captions_csv, load_captions_jsonl, load_dataset, load_karpathy
from retrieval.tools.evaluation.dataset_writers import queries_of, write_image_list, write_queries
from retrieval.tools.evaluation.split_files import apply_split_file, read_image_list

ROOT = Path(__file__).resolve().parent.parent


def _sentences(*texts: str) -> list[dict[str, object]]:
    return [{"raw": t, "tokens": t.lower().split(), "sentid": i} for i, t in enumerate(texts)]


def _coco(tmp_path: Path, images: list[dict[str, object]] | None = None) -> Path:
    """A fake dataset_coco.json: 2 test images (one with 6 captions), a train and a val image."""
    if images is None:
        images = [
            {
                "filepath": "val2014",
                "filename": "COCO_val2014_000000000001.jpg",
                "split": "test",
                "imgid": 0,
                "cocoid": 1,
                "sentences": _sentences("A man with a red helmet.", "a  moped", "dirt road", "a rider", "red", "SIXTH caption"),
            },
            {
                "filepath": "train2014",
                "filename": "COCO_train2014_000000000002.jpg",
                "split": "train",
                "imgid": 1,
                "cocoid": 2,
                "sentences": _sentences("train only"),
            },
            {
                "filepath": "val2014",
                "filename": "COCO_val2014_000000000003.jpg",
                "split": "test",
                "imgid": 2,
                "cocoid": 3,
                "sentences": _sentences(" A cat on a mat. ", "b", "c", "d", "e"),
            },
            {
                "filepath": "val2014",
                "filename": "COCO_val2014_000000000004.jpg",
                "split": "val",
                "imgid": 3,
                "cocoid": 4,
                "sentences": _sentences("validation"),
            },
        ]
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"images": images, "dataset": "coco"}), encoding="utf-8")
    return path


def test_karpathy_coco_test_split(tmp_path: Path) -> None:
    ds = load_karpathy(_coco(tmp_path))
    assert ds.name == "coco" and ds.split == "test"
    assert ds.images == ("val2014/COCO_val2014_000000000001.jpg", "val2014/COCO_val2014_000000000003.jpg")
    # First 5 sentences only (the 6th of image 1 is dropped), stripped, in file order.
    assert ds.n_captions == 10
    assert ds.captions[0] == ("val2014/COCO_val2014_000000000001.jpg", "A man with a red helmet.")
    assert ds.captions[5] == ("val2014/COCO_val2014_000000000003.jpg", "A cat on a mat.")
    assert "SIXTH caption" not in [c for _, c in ds.captions]
    assert "train only" not in [c for _, c in ds.captions]


def test_karpathy_all_captions_other_splits_and_prefix(tmp_path: Path) -> None:
    path = _coco(tmp_path)
    assert load_karpathy(path, max_captions=None).n_captions == 11
    both = load_karpathy(path, "val,train", image_prefix="coco")
    assert both.split == "val+train"
    assert both.images == ("coco/train2014/COCO_train2014_000000000002.jpg", "coco/val2014/COCO_val2014_000000000004.jpg")
    assert load_karpathy(path, ["test"], max_captions=1).n_captions == 2


def test_karpathy_flickr_has_no_filepath(tmp_path: Path) -> None:
    path = tmp_path / "dataset_flickr30k.json"
    images = [
        {"filename": "1000092795.jpg", "split": "test", "sentences": _sentences("a", "b", "c", "d", "e")},
        {"filename": "10002456.jpg", "split": "train", "sentences": _sentences("x")},
    ]
    path.write_text(json.dumps({"images": images, "dataset": "flickr30k"}))
    ds = load_karpathy(path, image_prefix="flickr30k-images")
    assert ds.name == "flickr30k"
    assert ds.images == ("flickr30k-images/1000092795.jpg",)
    assert ds.n_captions == 5
    assert load_dataset(path).images == ("1000092795.jpg",)


@pytest.mark.parametrize(
    ("mutate", "message", "record"),
    [
        (lambda im: im[2].pop("filename"), '"filename" must be a non-empty string', 2),
        (lambda im: im[0].update(split=None), '"split" must be a string', 0),
        (lambda im: im[2].update(sentences=[]), '"sentences" must be a non-empty list', 2),
        (lambda im: im[2]["sentences"].__setitem__(1, {"tokens": []}), 'sentences[1] has no non-empty "raw"', 2),
        (lambda im: im[2]["sentences"].__setitem__(0, {"raw": "   "}), 'sentences[0] has no non-empty "raw"', 2),
        (lambda im: im[2].update(filename="../../etc/passwd", filepath=""), "not inside the images root", 2),
        (lambda im: im[2].update(filepath="/abs"), "absolute", 2),
        (lambda im: im[2].update(filename="COCO_val2014_000000000001.jpg"), "listed twice (also images[0])", 2),
        (lambda im: im.__setitem__(1, "not an object"), "expected an object", 1),
    ],
)
def test_karpathy_malformed_records_name_the_record(tmp_path: Path, mutate, message: str, record: int) -> None:
    images = json.loads(_coco(tmp_path).read_text())["images"]
    mutate(images)
    path = _coco(tmp_path, images)
    with pytest.raises(DatasetError) as info:
        load_karpathy(path)
    assert message in str(info.value)
    assert info.value.record == record
    assert f"images[{record}]" in str(info.value) and str(path) in str(info.value)
    assert isinstance(info.value, ClipSearchError)


def test_karpathy_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"images": [\n  {"filename": "a.jpg",,}\n]}')
    with pytest.raises(DatasetError, match=r"bad\.json:2: invalid JSON") as info:
        load_karpathy(bad)
    assert info.value.line == 2
    bad.write_text('{"annotations": []}')
    with pytest.raises(DatasetError, match="not a Karpathy split file"):
        load_karpathy(bad)
    with pytest.raises(DatasetError, match=r"no image in split bogus \(splits in the file: test, train, val\)"):
        load_karpathy(_coco(tmp_path), "bogus")
    with pytest.raises(DatasetError, match="cannot read"):
        load_karpathy(tmp_path / "missing.json")
    with pytest.raises(DatasetError, match="max_captions"):
        load_karpathy(_coco(tmp_path), max_captions=0)
    bad.write_bytes(b'{"images": []}\n\xff')
    with pytest.raises(DatasetError, match="not UTF-8") as info:
        load_karpathy(bad)
    assert info.value.line == 2


def test_captions_jsonl_several_captions_per_image(tmp_path: Path) -> None:
    path = tmp_path / "caps.jsonl"
    rows = [
        {"path": "b/dog.png", "caption": "A dog.", "category": "animals"},
        {"path": "a/cat.png", "caption": "A cat."},
        {"image": "./b/dog.png", "text": "A brown dog."},
    ]
    path.write_text("\ufeff" + "\n".join(json.dumps(r) for r in rows[:2]) + "\n\n" + json.dumps(rows[2]) + "\n", encoding="utf-8")
    ds = load_captions_jsonl(path)
    assert ds.name == "caps" and ds.split is None
    assert ds.images == ("b/dog.png", "a/cat.png")
    assert ds.captions == (("b/dog.png", "A dog."), ("a/cat.png", "A cat."), ("b/dog.png", "A brown dog."))
    assert load_captions_jsonl(path, max_captions=1).n_captions == 2
    assert load_dataset(path, image_prefix="pics").images[0] == "pics/b/dog.png"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "invalid JSON at column 1"),
        ('["a.png", "x"]', "expected a JSON object, got list"),
        ('{"caption": "x"}', "no image path key"),
        ('{"path": "a.png"}', "no caption key"),
        ('{"path": "a.png", "caption": "  "}', "empty caption for image 'a.png'"),
        ('{"path": 3, "caption": "x"}', "image path must be a string"),
        ('{"path": "../a.png", "caption": "x"}', "not inside the images root"),
        ('{"path": "", "caption": "x"}', "non-empty string"),
    ],
)
def test_captions_jsonl_errors_carry_line_numbers(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "caps.jsonl"
    path.write_text('{"path": "ok.png", "caption": "fine"}\n\n' + line + "\n", encoding="utf-8")
    with pytest.raises(DatasetError) as info:
        load_captions_jsonl(path)
    assert message in str(info.value)
    assert info.value.line == 3 and "caps.jsonl:3:" in str(info.value)


def test_captions_csv_and_tsv(tmp_path: Path) -> None:
    path = tmp_path / "caps.csv"
    path.write_text(
        'Filepath,Caption,extra\nimg/1.jpg,"A dog, running",x\n\nimg/2.jpg,"Two\nlines",y\nimg/1.jpg,Another,z\n', encoding="utf-8-sig"
    )
    ds = load_captions_csv(path)
    assert ds.images == ("img/1.jpg", "img/2.jpg")
    assert ds.captions == (("img/1.jpg", "A dog, running"), ("img/2.jpg", "Two\nlines"), ("img/1.jpg", "Another"))
    tsv = tmp_path / "caps.tsv"
    tsv.write_text("text\tpath\nA cat\tc.png\n")
    assert load_dataset(tsv).captions == (("c.png", "A cat"),)


def test_captions_csv_errors(tmp_path: Path) -> None:
    path = tmp_path / "caps.csv"
    path.write_text("file,caption\na.png,x\n")
    with pytest.raises(DatasetError, match=r"caps\.csv:1: header has no image path column"):
        load_captions_csv(path)
    path.write_text("path,caption\na.png,x\nb.png\n")
    with pytest.raises(DatasetError, match=r"caps\.csv:3: row has 1 fields"):
        load_captions_csv(path)
    path.write_text('path,caption\na.png,x\n"multi\nline.png",\n')
    with pytest.raises(DatasetError) as info:
        load_captions_csv(path)
    assert info.value.line == 4 and "empty caption" in str(info.value)
    path.write_text("")
    with pytest.raises(DatasetError, match="empty file"):
        load_captions_csv(path)
    path.write_text("path,caption\n")
    with pytest.raises(DatasetError, match="no captions"):
        load_captions_csv(path)
    path.write_bytes(b"path,caption\na.png,ok\nb.png,\xff\xfe\n")
    with pytest.raises(DatasetError, match="not UTF-8"):
        load_captions_csv(path)


def test_load_dataset_rejects_unknown_format_and_split_on_captions(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="unknown dataset format '.txt'"):
        load_dataset(tmp_path / "x.txt")
    path = tmp_path / "c.jsonl"
    path.write_text('{"path": "a.png", "caption": "x"}\n')
    with pytest.raises(DatasetError, match="no splits"):
        load_dataset(path, split="test")


def test_split_file_and_queries_match_demo_queries() -> None:
    """The demo's queries.jsonl is exactly its test split with identical captions merged."""
    demo = ROOT / "data" / "demo"
    full = load_captions_jsonl(demo / "captions.jsonl")
    assert (full.n_images, full.n_captions) == (785, 785)
    test = apply_split_file(full, demo / "splits" / "test.txt")
    assert (test.split, test.n_images, test.n_captions) == ("test", 158, 158)
    expected = [json.loads(line) for line in (demo / "queries.jsonl").read_text(encoding="utf-8").splitlines()]
    assert queries_of(test, merge_duplicates=True) == expected
    assert len(queries_of(test)) == 158


def test_split_file_errors(tmp_path: Path) -> None:
    ds = CaptionedSet("x", None, ("a.png", "b.png"), (("a.png", "A"), ("b.png", "B")), source="x.jsonl")
    split = tmp_path / "test.txt"
    split.write_text("# comment\n\nb.png\nc.png\n")
    with pytest.raises(DatasetError, match=r"test\.txt:4: image 'c.png' is not in x.jsonl"):
        apply_split_file(ds, split)
    split.write_text("# nothing\n")
    with pytest.raises(DatasetError, match="lists no images"):
        apply_split_file(ds, split)
    split.write_text("./b.png\n")
    sub = apply_split_file(ds, split)
    assert sub.images == ("b.png",) and sub.captions == (("b.png", "B"),) and sub.split == "test"
    assert read_image_list(split, image_prefix="p") == ((1, "p/b.png"),)


def test_write_queries_and_image_list(tmp_path: Path) -> None:
    ds = CaptionedSet(
        "x",
        "test",
        ("a.png", "b.png", "c.png"),
        (("a.png", "A flower."), ("b.png", "A flower."), ("a.png", "Déjà vu “quoted”"), ("b.png", "A flower.")),
    )
    out = tmp_path / "q.jsonl"
    assert write_queries(ds, out) == 4
    lines = out.read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[2]) == {"query": "Déjà vu “quoted”", "relevant": ["a.png"]}
    assert "Déjà" in lines[2]  # UTF-8, not \u escapes
    assert write_queries(ds, out, merge_duplicates=True) == 2
    assert json.loads(out.read_text().splitlines()[0]) == {"query": "A flower.", "relevant": ["a.png", "b.png"]}
    assert write_image_list(ds, tmp_path / "images.txt") == 3
    assert (tmp_path / "images.txt").read_text() == "a.png\nb.png\nc.png\n"


def test_captioned_set_validation() -> None:
    with pytest.raises(DatasetError, match="listed twice"):
        CaptionedSet("x", None, ("a", "a"), ())
    with pytest.raises(DatasetError, match="not in images"):
        CaptionedSet("x", None, ("a",), (("b", "cap"),))
    with pytest.raises(DatasetError, match="empty caption"):
        CaptionedSet("x", None, ("a",), (("a", " "),))
    with pytest.raises(DatasetError, match="non-empty strings"):
        CaptionedSet("x", None, ("",), ())
    ds = CaptionedSet("x", None, ["a", "b"], [("a", "cap")])  # lists are frozen to tuples
    assert ds.images == ("a", "b") and ds.captions == (("a", "cap"),)
    with pytest.raises(AttributeError):
        ds.name = "y"  # type: ignore[misc]  # assigning a read-only field is the point


def test_normalize_image_path() -> None:
    assert normalize_image_path("a//b/./c.jpg") == "a/b/c.jpg"
    assert normalize_image_path("c.jpg", "imgs/") == "imgs/c.jpg"
    assert normalize_image_path("x/../c.jpg") == "c.jpg"
    for bad in ("", "/abs.jpg", "..", "../x.jpg", "a/../../x.jpg", "."):
        with pytest.raises(ValueError):
            normalize_image_path(bad)


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"path": "a.png", "caption": " A dog. ", "category": "x"}, ("a.png", "A dog.")),
        ({"image_path": "b/c.png", "text": "A cat."}, ("b/c.png", "A cat.")),
        ([1, 2], "expected a JSON object, got list"),
        ({"caption": "x"}, "no image path key"),
        ({"path": None, "caption": "x"}, "image path must be a string"),
        ({"path": "  ", "caption": "x"}, "image path must be a non-empty string"),
        ({"path": "a.png"}, "no caption key"),
        ({"path": "a.png", "caption": None}, 'empty caption for image \'a.png\' (empty or missing "caption")'),
        ({"path": "a.png", "text": 3}, 'empty or missing "text"'),
    ],
)
def test_one_parser_for_caption_lines(obj: object, expected: tuple[str, str] | str) -> None:
    """Caption JSONL files and fine-tuning pairs files read their lines with the same function."""
    from retrieval.errors import InvalidArgumentError
    from retrieval.jsonl import parse_caption_line

    if isinstance(expected, tuple):
        assert parse_caption_line(obj) == expected
    else:
        with pytest.raises(InvalidArgumentError) as info:
            parse_caption_line(obj)
        assert expected in str(info.value)
