"""``clipsearch people``, the command over :mod:`retrieval.faces.people`: the people ``index --faces`` found, and edits.

``list``, ``show``, ``name``, ``merge``, ``hide``, ``unhide``, ``move``, ``split``, ``export``
and ``import``, each a thin call of :mod:`retrieval.faces` (edits under the people file's lock);
``recluster``, a call of :func:`indexer.faces.recluster.recluster`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._common import print_json

if TYPE_CHECKING:
    from retrieval.faces import Face, People, Person

    from ._common import Subparsers


def _person_dict(p: Person) -> dict[str, Any]:
    return {"id": p.id, "name": p.name, "hidden": p.hidden, "faces": p.faces, "images": p.images, "cover": _face_dict(p.cover)}


def _face_dict(f: Face) -> dict[str, Any]:
    return {"key": f.key, "image_id": f.id, "path": f.path, "box": [round(v, 1) for v in f.box], "score": round(f.score, 3),
            "person": f.person}


def _list(people: People, args: argparse.Namespace) -> int:
    everyone = people.everyone(include_hidden=args.all)
    if args.json:
        print_json({"people": [_person_dict(p) for p in everyone]})
        return 0
    print(f"{len(everyone)} people")
    for p in everyone:
        print(f"{p.label:<24} {p.faces:>5} faces in {p.images:>5} images" + ("  (hidden)" if p.hidden else "")
              + f"  e.g. {p.cover.path}")
    return 0


def _show(people: People, args: argparse.Namespace) -> int:
    person = people.find(args.person)
    faces = people.faces_of(person)
    if args.json:
        print_json({"person": person, "name": people.edits.names.get(person), "faces": [_face_dict(f) for f in faces]})
        return 0
    print(f"{people.edits.names.get(person) or f'#{person}'}: {len(faces)} faces")
    for f in faces:
        left, top, right, bottom = (round(v) for v in f.box)
        print(f"{f.key}  {f.path}  [{left},{top},{right},{bottom}]")
    return 0


def _edit(args: argparse.Namespace, people: People) -> str:
    """Apply one edit under the lock; returns what to print."""
    from retrieval.faces import editing

    with editing(args.index_dir) as box:
        edits = box[0]
        if args.action == "name":
            person = people.find(args.person)
            box[0] = edits.named(person, args.name)
            return f"#{person} is now {box[0].names[person]!r}"
        if args.action == "merge":
            source, target = people.find(args.person), people.find(args.into)
            box[0] = edits.merged_into(source, target)
            return f"#{source} merged into #{target}"
        if args.action in ("hide", "unhide"):
            person = people.find(args.person)
            box[0] = edits.with_hidden(person, args.action == "hide")
            return f"#{person} {'hidden' if args.action == 'hide' else 'listed again'}"
        keys = [people.face(k).key for k in args.faces]
        if args.action == "move":
            target = -1 if args.to.lower() == "none" else people.find(args.to)
            box[0] = edits.moved(keys, target)
            return f"{len(keys)} faces moved to {'nobody' if target == -1 else f'#{target}'}"
        box[0], new = edits.split(keys, people.first_free())
        return f"{len(keys)} faces split off as #{new}"


def _recluster(args: argparse.Namespace) -> int:
    from indexer.faces.recluster import recluster

    report = recluster(args.index_dir, max_distance=args.max_distance, min_faces=args.min_faces)
    if args.json:
        print_json(report.to_dict())
        return 0
    print(f"{report.faces} faces regrouped into {report.people} people (before: {report.people_before}; "
          f"{report.new_people} new, {report.kept} faces kept where you put them, {report.nobody} to nobody) "
          f"with max_distance {report.options['max_distance']}, min_faces {report.options['min_faces']}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run one ``people`` action."""
    from retrieval.faces import People, PeopleEdits, editing, load_edits

    if args.action == "recluster":
        return _recluster(args)
    if args.action == "import":
        # Checked in full before the index's file is touched: a bad file changes nothing.
        try:
            data = json.loads(Path(args.file).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            from retrieval.errors import InvalidArgumentError

            raise InvalidArgumentError(f"cannot read {args.file}: {exc}") from None
        imported = PeopleEdits.from_dict(data, args.file)
        People.open(args.index_dir)  # an index with faces
        with editing(args.index_dir) as box:
            box[0] = imported
        print(f"imported {len(imported.names)} names, {len(imported.merged)} merges, {len(imported.faces)} moved faces")
        return 0
    people = People.open(args.index_dir)
    if args.action == "list":
        return _list(people, args)
    if args.action == "show":
        return _show(people, args)
    if args.action == "export":
        text = json.dumps(load_edits(args.index_dir).to_dict(), ensure_ascii=False, indent=1) + "\n"
        if args.file == "-":
            print(text, end="")
            return 0
        try:
            Path(args.file).write_text(text, encoding="utf-8")
        except OSError as exc:
            from retrieval.errors import InvalidArgumentError

            raise InvalidArgumentError(f"cannot write {args.file}: {exc.strerror}") from None
        return 0
    print(_edit(args, people))
    return 0


def register(subparsers: Subparsers) -> None:
    """Add ``people`` and its actions to the ``clipsearch`` sub-parsers."""
    p = subparsers.add_parser(
        "people", help="list, name, merge, hide and split the people found by index --faces",
        description="The people `clipsearch index --faces` found. Edits are kept in INDEX_DIR/people.json and survive "
        "updates; a PERSON is a number (7 or #7) or a name.",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        a = actions.add_parser(name, help=help_text, description=help_text)
        a.add_argument("index_dir", metavar="INDEX_DIR")
        a.set_defaults(handler=run)
        return a

    a = action("list", "the people, the one with the most faces first")
    a.add_argument("--all", action="store_true", help="hidden people too")
    a.add_argument("--json", action="store_true", help='print {"people": [{"id", "name", "faces", "images", "cover"}]}')
    a = action("show", "a person's faces, with the keys move and split take")
    a.add_argument("person", metavar="PERSON")
    a.add_argument("--json", action="store_true", help="print one JSON object")
    a = action("name", "name a person (names are unique, case-insensitive)")
    a.add_argument("person", metavar="PERSON")
    a.add_argument("name", metavar="NAME")
    a = action("merge", "make PERSON's faces INTO's (look-alikes split in two, one person found twice)")
    a.add_argument("person", metavar="PERSON")
    a.add_argument("into", metavar="INTO")
    for name, text in (("hide", "leave a person out of listings"), ("unhide", "list a hidden person again")):
        a = action(name, text)
        a.add_argument("person", metavar="PERSON")
    a = action("move", "move faces to another person, or to nobody ('none')")
    a.add_argument("to", metavar="PERSON|none")
    a.add_argument("faces", metavar="FACE", nargs="+", help="face keys, as `people show` prints them")
    a = action("split", "make a new person of some faces (a wrongly merged person)")
    a.add_argument("faces", metavar="FACE", nargs="+", help="face keys, as `people show` prints them")
    a = action("export", "write the edits (names, merges, moves) as JSON")
    a.add_argument("file", metavar="FILE", help="where to write, - for standard output")
    a = action("import", "replace the edits with a JSON file written by export")
    a.add_argument("file", metavar="FILE")
    a = action("recluster", "group every face into people again (named, hidden, merged, split and moved ones are kept); "
               "the settings are recorded for later index runs")
    a.add_argument("--max-distance", type=float, metavar="D",
                   help="largest distance between two faces of one person; lower merges fewer look-alikes and splits more "
                   "views of one person (default: the recorded one)")
    a.add_argument("--min-faces", type=int, metavar="N", help="faces within D needed to found a person (default: the recorded one)")
    a.add_argument("--json", action="store_true", help="print the report as one JSON object")
