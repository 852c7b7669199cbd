"""People: the faces side read with the user's edits (people.json), from Python and the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_here
from faultctl import run_killed_at

from indexer import build_index
from indexer.faces.recluster import recluster
from retrieval import verify_index
from retrieval.errors import (
    IndexFormatError,
    IndexLockedError,
    InvalidArgumentError,
    NoFacesError,
    NotAnIndexError,
    UnsupportedFormatError,
)
from retrieval.faces import PEOPLE_FILE, People, PeopleEdits, editing, load_edits
from retrieval.layout import MANIFEST_DIGEST_KEY, read_manifest

# -- the edits alone ------------------------------------------------------------------------------


def test_names_are_unique_trimmed_and_never_empty() -> None:
    edits = PeopleEdits().named(0, "  Alice   Smith ")
    assert edits.names == {0: "Alice Smith"} and edits.person_named("alice smith") == 0
    with pytest.raises(InvalidArgumentError, match="already called"):
        edits.named(1, "ALICE SMITH")
    for bad in ("", "   ", None, "x" * 201):
        with pytest.raises(InvalidArgumentError):
            edits.named(1, bad)  # type: ignore[arg-type]
    assert edits.named(0, "Alice").names == {0: "Alice"}  # renaming keeps one name


def test_merges_follow_chains_keep_the_name_and_refuse_a_merge_into_itself() -> None:
    edits = PeopleEdits().named(2, "Bob").merged_into(2, 5).merged_into(5, 7)
    assert edits.resolve(2) == edits.resolve(5) == 7 and edits.names == {7: "Bob"}
    with pytest.raises(InvalidArgumentError, match="into itself"):
        edits.merged_into(2, 7)  # 2 is 7 now
    labels = edits.apply(np.array([2, 5, 7, -1, 3]), ["a/0", "b/0", "c/0", "d/0", "e/0"])
    assert labels.tolist() == [7, 7, 7, -1, 3]


def test_moved_and_split_faces_win_over_the_grouping() -> None:
    edits = PeopleEdits().moved(["a/0"], -1).moved(["b/0"], 3)
    edits, new = edits.split(["c/0", "d/1"], first_free=9)
    assert new == 9 and edits.next_person == 10
    again, newer = edits.split(["e/0"], first_free=4)
    assert newer == 10  # never a number handed out before
    assert edits.apply(np.array([1, 1, 1, 1]), ["a/0", "b/0", "c/0", "d/1"]).tolist() == [-1, 3, 9, 9]
    with pytest.raises(InvalidArgumentError):
        edits.split([], first_free=0)
    for bad in (-2, True, 1.5):
        with pytest.raises(InvalidArgumentError):
            PeopleEdits().named(bad, "x")  # type: ignore[arg-type]


def test_the_file_round_trips_and_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    edits = PeopleEdits().named(0, "Ann").merged_into(1, 0).with_hidden(3).moved(["h/2"], 0)
    assert PeopleEdits.from_dict(json.loads(json.dumps(edits.to_dict()))) == edits
    with pytest.raises(UnsupportedFormatError, match="upgrade"):
        PeopleEdits.from_dict({**edits.to_dict(), "version": 99})
    for bad in ({"format": "other"}, {**edits.to_dict(), "names": {"x": "A"}}, {**edits.to_dict(), "names": {"0": ""}}):
        with pytest.raises(IndexFormatError):
            PeopleEdits.from_dict(bad)
    (tmp_path / PEOPLE_FILE).write_text("{not json")
    with pytest.raises(IndexFormatError):
        load_edits(tmp_path)


def test_an_edit_that_fails_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    with editing(tmp_path) as box:
        box[0] = box[0].named(0, "Ann")
    before = (tmp_path / PEOPLE_FILE).read_bytes()
    with pytest.raises(InvalidArgumentError), editing(tmp_path) as box:
        box[0] = box[0].named(1, "Bob")
        box[0] = box[0].named(2, "bob")  # a duplicate: the whole edit is refused
    assert (tmp_path / PEOPLE_FILE).read_bytes() == before


# -- on an index ----------------------------------------------------------------------------------

pytest.importorskip("dlib", reason="the faces extra: pip install 'clipsearch[faces]'")
skdata = pytest.importorskip("skimage.data")

from PIL import Image  # noqa: E402


@pytest.fixture(scope="module")
def people_index(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("people")
    photos = root / "photos"
    photos.mkdir()
    face = Image.fromarray(skdata.astronaut())
    for i, view in enumerate([face, face.transpose(Image.Transpose.FLIP_LEFT_RIGHT), face.resize((420, 420)), face.rotate(3)]):
        view.save(photos / f"a{i}.jpg", quality=92)
    Image.fromarray(skdata.coffee()).save(photos / "coffee.jpg")
    out = root / "idx"
    build_index(photos, out, model=str(tiny_model), batch_size=4, workers=0, device="cpu", precision="fp32", progress=False,
                faces=True)
    return photos, out


def _copy(src: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    shutil.copytree(src[0], tmp_path / "photos")
    shutil.copytree(src[1], tmp_path / "idx")
    return tmp_path / "photos", tmp_path / "idx"


def test_people_of_an_index(people_index: tuple[Path, Path]) -> None:
    people = People.open(people_index[1])
    (person,) = people.everyone()
    assert person.id == 0 and person.faces == 4 and person.images == 4 and person.name is None
    assert people.find("0") == people.find("#0") == 0
    ids = people.images_with([0])
    assert len(ids) == 4 and people.images_with([0], only=True).tolist() == ids.tolist()
    (face,) = people.faces_in(int(ids[0]))
    assert people.face(face.key) == face
    for bad in ("#9", "Nobody", ""):
        with pytest.raises(NoFacesError):
            people.find(bad)
    with pytest.raises(NoFacesError):
        people.face("nope/0")


def test_an_index_without_faces_says_how_to_get_them(built_index: Path) -> None:
    with pytest.raises(NoFacesError, match="--faces"):
        People.open(built_index)


def test_edits_survive_an_update_and_new_faces_join_the_named_person(
    tmp_path: Path, people_index: tuple[Path, Path], tiny_model: Path,
) -> None:
    photos, out = _copy(people_index, tmp_path)
    people = People.open(out)
    # The mirrored view is split off: the new photo below is nearest to the unmirrored one.
    key = next(f.key for f in people.faces_of(0) if f.path == "a1.jpg")
    with editing(out) as box:
        box[0], split = box[0].named(0, "Eileen").split([key], people.first_free())
    assert People.open(out).everyone()[0].faces == 3
    Image.fromarray(skdata.astronaut()).rotate(-3).save(photos / "a9.jpg", quality=92)
    build_index(photos, out, model=str(tiny_model), batch_size=4, workers=0, device="cpu", precision="fp32", progress=False)
    people = People.open(out)
    by_name = {p.label: p for p in people.everyone()}
    assert by_name["Eileen"].faces == 4  # the new photo's face joined her
    assert by_name[f"#{split}"].faces == 1 and people.faces_of(split)[0].key == key  # the split stayed a split


def test_the_people_command(tmp_path: Path, people_index: tuple[Path, Path]) -> None:
    _, out = _copy(people_index, tmp_path)
    listed = cli_here(["people", "list", out, "--json"])
    assert listed.returncode == 0, listed.stderr
    assert [p["faces"] for p in json.loads(listed.stdout)["people"]] == [4]
    assert cli_here(["people", "name", out, "0", "Eileen Collins"]).returncode == 0
    shown = json.loads(cli_here(["people", "show", out, "eileen collins", "--json"]).stdout)
    keys = [f["key"] for f in shown["faces"]]
    assert shown["name"] == "Eileen Collins" and len(keys) == 4
    split = cli_here(["people", "split", out, keys[0]])
    assert split.returncode == 0 and "#1" in split.stdout
    assert cli_here(["people", "merge", out, "1", "Eileen Collins"]).returncode == 0
    assert cli_here(["people", "move", out, "none", keys[1]]).returncode == 0
    assert [p["faces"] for p in json.loads(cli_here(["people", "list", out, "--json"]).stdout)["people"]] == [3]
    exported = tmp_path / "people.json"
    assert cli_here(["people", "export", out, exported]).returncode == 0
    assert json.loads(exported.read_text())["names"] == {"0": "Eileen Collins"}
    # The exported edits imported into a copy of the index built before them.
    fresh = tmp_path / "fresh"
    shutil.copytree(people_index[1], fresh)
    assert cli_here(["people", "import", fresh, exported]).returncode == 0
    assert load_edits(fresh) == load_edits(out)
    hidden = cli_here(["people", "hide", out, "Eileen Collins"])
    assert hidden.returncode == 0 and "0 people" in cli_here(["people", "list", out]).stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["name", "{idx}", "0", "  "], "must not be empty"),
        (["merge", "{idx}", "0", "#0"], "into itself"),
        (["show", "{idx}", "Bob"], "no person called 'Bob'"),
        (["move", "{idx}", "0", "nope/0"], "no face"),
        (["import", "{idx}", "{bad}"], "not a clipsearch people file"),
        (["list", "{plain}"], "--faces"),
        (["recluster", "{plain}"], "--faces"),
        (["recluster", "{idx}", "--max-distance", "2.5"], "max_distance"),
        (["recluster", "{idx}", "--min-faces", "0"], "min_faces"),
    ],
)
def test_bad_people_commands_are_one_line_and_change_nothing(
    tmp_path: Path, people_index: tuple[Path, Path], built_index: Path, args: list[str], message: str,
) -> None:
    _, out = _copy(people_index, tmp_path)
    with editing(out) as box:
        box[0] = box[0].named(0, "Eileen")
    before = (out / PEOPLE_FILE).read_bytes()
    generation = read_manifest(out).generation
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something else"}))
    result = cli_here(["people", *(a.format(idx=out, bad=bad, plain=built_index) for a in args)])
    assert result.returncode != 0 and message in result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert (out / PEOPLE_FILE).read_bytes() == before and read_manifest(out).generation == generation


# -- re-clustering --------------------------------------------------------------------------------


def _generation_files(out: Path) -> dict[str, bytes]:
    """Every file of the current generation but the faces side, by name."""
    m = read_manifest(out)
    assert m.faces is not None
    folder = out / Path(m.faces.path).parent
    faces = {Path(m.faces.path).name, Path(m.faces.read_path).name}
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p.name not in faces}


def _people_of(out: Path, include_hidden: bool = False) -> dict[str, int]:
    return {p.label: p.faces for p in People.open(out).everyone(include_hidden)}


def test_recluster_regroups_records_its_settings_and_touches_nothing_else(
    tmp_path: Path, people_index: tuple[Path, Path], tiny_model: Path,
) -> None:
    photos, out = _copy(people_index, tmp_path)
    before = _generation_files(out)
    generation = read_manifest(out).generation
    report = recluster(out, max_distance=0.05, min_faces=1)  # closer than any two views: each face alone
    assert (report.faces, report.people_before, report.people, report.new_people, report.kept) == (4, 1, 4, 3, 0)
    m = read_manifest(out)
    assert m.generation != generation and m.complete and m.faces is not None
    assert (m.faces.options["max_distance"], m.faces.options["min_faces"], m.faces.people) == (0.05, 1, 4)
    assert m.faces.options["min_size"] == 32  # the detector's settings are kept
    assert _generation_files(out) == before  # rows, vectors, FAISS and keyword files byte for byte
    assert sorted(_people_of(out).values()) == [1, 1, 1, 1] and 0 in People.open(out).person_of
    assert verify_index(out).ok
    # A later update keeps the settings and the groups, and reads no face again.
    update = build_index(photos, out, model=str(tiny_model), batch_size=4, workers=0, device="cpu", precision="fp32",
                         progress=False)
    assert update.faces_read == 0 and read_manifest(out).faces.options["max_distance"] == 0.05  # type: ignore[union-attr]
    assert sorted(_people_of(out).values()) == [1, 1, 1, 1]
    assert recluster(out).options == {"max_distance": 0.05, "min_faces": 1}  # no settings: the recorded ones
    # Looser again: one person, under the number it had (the group overlapping it most).
    assert recluster(out, max_distance=0.5, min_faces=3).people == 1 and _people_of(out) == {"#0": 4}
    # Two close views form a person, the other two wait as nobody.
    report = recluster(out, max_distance=0.12, min_faces=2)
    assert (report.people, report.nobody) == (1, 2) and _people_of(out) == {"#0": 2}


def test_recluster_keeps_the_users_word(tmp_path: Path, people_index: tuple[Path, Path]) -> None:
    _, out = _copy(people_index, tmp_path)
    keys = [f.key for f in People.open(out).faces_of(0)]
    with editing(out) as box:
        box[0], split = box[0].split([keys[1]], People.open(out).first_free())
        box[0] = box[0].moved([keys[2]], -1)
    strict, loose = {"max_distance": 0.05, "min_faces": 1}, {"max_distance": 0.5, "min_faces": 1}
    report = recluster(out, **strict)
    people = People.open(out)
    assert report.kept == 2 and people.faces_of(split)[0].key == keys[1]  # the split stays a split
    assert people.face(keys[2]).person == -1  # moved to nobody stays there
    assert people.face(keys[0]).person == 0 and people.face(keys[3]).person > split  # a new person, a new number
    recluster(out, **loose)  # every view within reach of the others: still not merged back
    people = People.open(out)
    assert [f.key for f in people.faces_of(split)] == [keys[1]] and people.face(keys[2]).person == -1
    assert {f.key for f in people.faces_of(0)} == {keys[0], keys[3]}
    # Named and hidden people keep their faces however strict the grouping, and stay hidden.
    with editing(out) as box:
        box[0] = box[0].named(0, "Eileen").with_hidden(split)
    assert recluster(out, **strict).kept == 4
    assert _people_of(out) == {"Eileen": 2} and _people_of(out, include_hidden=True) == {"Eileen": 2, f"#{split}": 1}
    # A person merged into another stays merged.
    with editing(out) as box:
        box[0] = box[0].with_hidden(split, False).merged_into(split, 0)
    recluster(out, **strict)
    assert _people_of(out) == {"Eileen": 3}
    assert load_edits(out).names == {0: "Eileen"}  # the edits themselves are never rewritten


def test_a_group_takes_the_named_person_it_overlaps(tmp_path: Path, people_index: tuple[Path, Path]) -> None:
    _, out = _copy(people_index, tmp_path)
    recluster(out, max_distance=0.05, min_faces=1)  # each face alone: #0 and three new people
    with editing(out) as box:
        box[0] = box[0].named(0, "Eileen")
    report = recluster(out, max_distance=0.5, min_faces=1)
    assert (report.kept, report.people_before, report.people) == (1, 4, 1)
    assert _people_of(out) == {"Eileen": 4}  # the other three joined her, not she them


def test_recluster_refuses_bad_input_and_a_locked_index(
    tmp_path: Path, people_index: tuple[Path, Path], built_index: Path,
) -> None:
    from indexer.lock import IndexLock

    _, out = _copy(people_index, tmp_path)
    generation = read_manifest(out).generation
    with pytest.raises(NoFacesError, match="--faces"):
        recluster(built_index)
    with pytest.raises(NotAnIndexError):
        recluster(tmp_path / "nothing")
    for bad in ({"max_distance": 0}, {"max_distance": 2.5}, {"min_faces": 0}, {"min_faces": 1.5}):
        with pytest.raises(InvalidArgumentError):
            recluster(out, **bad)  # type: ignore[arg-type]
    with IndexLock(out), pytest.raises(IndexLockedError):
        recluster(out)
    assert read_manifest(out).generation == generation
    data = json.loads((out / "manifest.json").read_text())
    data.pop(MANIFEST_DIGEST_KEY)
    data["complete"] = False  # a build killed between two commits
    (out / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(IndexFormatError, match="interrupted build"):
        recluster(out)


def test_recluster_killed_before_its_commit_leaves_the_index_as_it_was(tmp_path: Path, people_index: tuple[Path, Path]) -> None:
    _, out = _copy(people_index, tmp_path)
    generation = read_manifest(out).generation
    args = ["people", "recluster", out, "--max-distance", "0.05", "--min-faces", "1"]
    killed = run_killed_at(args, "publish")  # the new generation published, the manifest not switched yet
    assert killed.killed, killed.stderr
    assert read_manifest(out).generation == generation and _people_of(out) == {"#0": 4}
    assert verify_index(out).ok
    done = cli_here(args)
    assert done.returncode == 0, done.stderr
    assert "4 faces regrouped into 4 people (before: 1;" in done.stdout and len(_people_of(out)) == 4 and verify_index(out).ok
    as_json = cli_here(["people", "recluster", out, "--max-distance", "0.5", "--json"])
    report = json.loads(as_json.stdout)
    assert as_json.returncode == 0 and (report["people_before"], report["people"], report["kept"]) == (4, 1, 0)
    assert report["options"] == {"max_distance": 0.5, "min_faces": 1}
