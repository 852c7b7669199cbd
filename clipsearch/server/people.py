"""People over HTTP, as ``clipsearch people`` on the command line (:mod:`clipsearch.cli.people`).

``GET /api/people`` lists who is in an index (the UI's people strip), ``GET /api/people/{ref}``
one person and their faces (the person page; the photos themselves come from a search with the
``person`` filter), ``GET /api/people/{ref}/face`` the person's largest face as a small JPEG, and
``PATCH /api/people/{ref}`` names or hides a person (renaming in place), ``POST
/api/people/{ref}/merge`` merges one into another. ``ref`` is a name or a number, as on the CLI.
Edits go to the index's ``people.json`` under its lock (:func:`retrieval.faces.editing`), and
every later search sees them.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import FileResponse, Response

from retrieval.errors import ImageDecodeError, InvalidArgumentError, NoFacesError
from retrieval.faces import Face, People, Person, editing
from retrieval.images.decode import decode_image
from retrieval.index import ImageIndex

from . import files
from .errors import NotFoundError
from .indexes import IndexSet, ServedIndex
from .responses import JSONResponse

# Long side of a face picture unless asked (the UI's strip shows them at 64 CSS pixels).
DEFAULT_FACE_SIZE = 128
FACE_SIZES = (64, 128, 256)
# How much of the head around the detector's box a face picture shows (the box is the face alone).
_MARGIN = 0.35


class PersonSummary(BaseModel):
    id: int
    name: str | None = Field(None, description="null until someone names the person")
    label: str = Field(description="the name, else #id")
    hidden: bool
    faces: int
    images: int
    face_url: str = Field(description="the largest face of the person, a small JPEG")


class PeopleList(BaseModel):
    faces: bool = Field(description="whether the index was built with --faces (false: no people to list)")
    people: list[PersonSummary]


class FaceOut(BaseModel):
    key: str = Field(description="CONTENT_HASH/N: what `clipsearch people move` and `split` take")
    image_id: int
    path: str
    box: list[float] = Field(description="left, top, right, bottom in the original's pixels")
    score: float


class PersonPage(PersonSummary):
    face_list: list[FaceOut]


class PersonEdit(BaseModel):
    """``PATCH /api/people/{ref}``: a new name and/or whether the person is hidden."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, description="the person's new name (unique, not empty)")
    hidden: bool | None = Field(None, description="hide the person from the list and from the faces of hits, or show again")


class Merge(BaseModel):
    """``POST /api/people/{ref}/merge``: merge the person into another."""

    model_config = ConfigDict(extra="forbid")

    into: str = Field(description="the person (name or number) who keeps the faces")


def _people(index: ImageIndex) -> People:
    try:
        return index.people.people()
    except NoFacesError as exc:
        raise NotFoundError(str(exc)) from None


def _find(people: People, ref: str) -> int:
    try:
        return people.find(ref)
    except NoFacesError as exc:
        raise NotFoundError(str(exc)) from None


def _summary(person: Person, served: ServedIndex) -> dict[str, Any]:
    index = f"index={quote(served.name, safe='')}"
    return {"id": person.id, "name": person.name, "label": person.label, "hidden": person.hidden, "faces": person.faces,
            "images": person.images, "face_url": f"/api/people/{person.id}/face?size={DEFAULT_FACE_SIZE}&{index}"}


def _person(people: People, person: int) -> Person:
    for p in people.everyone(include_hidden=True):
        if p.id == person:
            return p
    raise NotFoundError(f"no person #{person} in this index")


def _face_out(face: Face) -> dict[str, Any]:
    return {"key": face.key, "image_id": face.id, "path": face.path, "box": [round(v, 1) for v in face.box],
            "score": round(face.score, 4)}


def face_picture(index: ImageIndex, face: Face, name: str, size: int, cache_dir: Path) -> Path:
    """A JPEG of ``face`` with some of the head around it, no larger than ``size``, cached on disk.

    Raises:
        NotFoundError: the image's file is gone.
        ImageDecodeError: it no longer decodes.
    """
    key, _ = files.thumbnail_key(index, face.id, size)
    digest = hashlib.sha256(f"{key}/{face.key}/{face.box}".encode()).hexdigest()[:32]
    cached = cache_dir / "faces" / digest[:2] / f"{digest}-{size}.jpg"
    if cached.is_file():
        return cached
    data = files.shard_bytes(index, face.id, name)
    source: Path | io.BytesIO = io.BytesIO(data) if data is not None else files.source_file(index, face.id, name)
    at = files.video_time(index, face.id)
    if at is not None:
        # A video's row: its frame, as the face finder decoded it (the box is in these pixels).
        img = files.video_frame(source, at, files.NATIVE_SIDE, face.id)
    else:
        try:
            # Decoded whole, as the face finder decoded it: the box is in these pixels.
            img = decode_image(source, name=f"image {face.id}").image
        except ImageDecodeError as exc:
            raise ImageDecodeError(exc.path, f"{exc.reason} (the file changed since it was indexed?)") from None
    left, top, right, bottom = face.box
    pad = _MARGIN * max(right - left, bottom - top)
    crop = img.crop((max(0, int(left - pad)), max(0, int(top - pad)), min(img.width, int(right + pad)),
                     min(img.height, int(bottom + pad))))
    crop.thumbnail((size, size), Image.Resampling.LANCZOS)
    cached.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cached.parent, prefix=".tmp-", suffix=".jpg")
    try:
        with os.fdopen(fd, "wb") as out:
            crop.save(out, "JPEG", quality=files.THUMBNAIL_QUALITY)
        os.replace(tmp, cached)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return cached


def people_router() -> APIRouter:
    """The ``/api/people`` routes (the caller adds the API's dependencies, its token check)."""
    api = APIRouter()

    def served_of(request: Request, index: str | None) -> ServedIndex:
        indexes: IndexSet = request.app.state.indexes
        return indexes.get(index)

    @api.get("/people", response_model=PeopleList, summary="Who is in an index (built with --faces), most faces first")
    async def list_people(request: Request, index: Annotated[str | None, Query()] = None,
                          hidden: Annotated[bool, Query(description="list hidden people too")] = False) -> Response:
        served = served_of(request, index)

        def read() -> dict[str, Any]:
            current = served.current()
            if not current.people.has_faces:
                return {"faces": False, "people": []}
            people = current.people.people()
            return {"faces": True, "people": [_summary(p, served) for p in people.everyone(include_hidden=hidden)]}

        return JSONResponse(await run_in_threadpool(read))

    @api.get("/people/{ref}", response_model=PersonPage, summary="One person (a name or a number) and their faces")
    async def show_person(request: Request, ref: str, index: Annotated[str | None, Query()] = None) -> Response:
        served = served_of(request, index)

        def read() -> dict[str, Any]:
            people = _people(served.current())
            person = _find(people, ref)
            return {**_summary(_person(people, person), served), "face_list": [_face_out(f) for f in people.faces_of(person)]}

        return JSONResponse(await run_in_threadpool(read))

    @api.get("/people/{ref}/face", summary="A person's largest face as a JPEG", response_class=FileResponse)
    async def person_face(request: Request, ref: str, index: Annotated[str | None, Query()] = None,
                          size: Annotated[int, Query(description="long side: 64, 128 or 256")] = DEFAULT_FACE_SIZE) -> Response:
        served = served_of(request, index)
        if size not in FACE_SIZES:
            raise InvalidArgumentError(f"size must be one of {', '.join(map(str, FACE_SIZES))}, got {size}")
        cache_dir: Path = request.app.state.config.thumbnail_dir

        def make() -> Path:
            current = served.current()
            people = _people(current)
            cover = _person(people, _find(people, ref)).cover
            return face_picture(current, cover, served.name, size, cache_dir)

        path = await run_in_threadpool(make)
        return FileResponse(path, media_type="image/jpeg", headers={"Cache-Control": files.THUMBNAIL_CACHE_CONTROL})

    @api.patch("/people/{ref}", response_model=PersonSummary, summary="Name a person, or hide or show one")
    async def edit_person(request: Request, ref: str, edit: PersonEdit, index: Annotated[str | None, Query()] = None) -> Response:
        served = served_of(request, index)
        if edit.name is None and edit.hidden is None:
            raise InvalidArgumentError("give a name or hidden")

        def write() -> dict[str, Any]:
            current = served.current()
            person = _find(_people(current), ref)
            with editing(current.directory) as box:
                if edit.name is not None:
                    box[0] = box[0].named(person, edit.name)
                if edit.hidden is not None:
                    box[0] = box[0].with_hidden(person, edit.hidden)
            return _summary(_person(_people(current), person), served)

        return JSONResponse(await run_in_threadpool(write))

    @api.post("/people/{ref}/merge", response_model=PersonSummary, summary="Merge a person into another (who keeps the name)")
    async def merge_person(request: Request, ref: str, merge: Merge, index: Annotated[str | None, Query()] = None) -> Response:
        served = served_of(request, index)

        def write() -> dict[str, Any]:
            current = served.current()
            people = _people(current)
            source, target = _find(people, ref), _find(people, merge.into)
            with editing(current.directory) as box:
                box[0] = box[0].merged_into(source, target)
            after = _people(current)
            return _summary(_person(after, after.edits.resolve(target)), served)

        return JSONResponse(await run_in_threadpool(write))

    return api


__all__ = ["DEFAULT_FACE_SIZE", "FACE_SIZES", "face_picture", "people_router"]
