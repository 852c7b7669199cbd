"""``index --faces --videos``: a video's rows are read on their frames (decoded at the row's time),
so a person's faces include the moments of videos they appear in; the server crops such a face
from the same frame."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytest.importorskip("av")
pytest.importorskip("dlib", reason="the faces extra: pip install 'clipsearch[faces]'")
skdata = pytest.importorskip("skimage.data")

from PIL import Image  # noqa: E402

from indexer import build_index  # noqa: E402
from retrieval.index import ImageIndex  # noqa: E402
from retrieval.layout import read_manifest  # noqa: E402
from tests.videogen import write_video  # noqa: E402


def test_faces_of_video_frames_join_the_person_of_the_photos(tmp_path: Path, tiny_model: Path) -> None:
    from fastapi.testclient import TestClient

    from clipsearch.server.app import create_app

    photos = tmp_path / "phone"
    photos.mkdir()
    face = Image.fromarray(skdata.astronaut())
    face.save(photos / "astronaut.jpg", quality=92)
    face.transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(photos / "mirror.jpg", quality=92)  # a person is 3 faces or more
    # Two seconds of coffee (no face), then two of the astronaut, at a size the detector reads.
    write_video(photos / "trip.mp4", [("coffee.png", 2.0), ("astronaut.png", 2.0)], gop=8, size=(384, 384))
    out = tmp_path / "phone.idx"
    report = build_index(photos, out, model=str(tiny_model), batch_size=4, workers=0, device="cpu", precision="fp32",
                         videos=True, faces=True, progress=False)
    index = ImageIndex.open(out)
    rows = index.rows(range(index.count), ("id", "path", "media", "frame_time"))
    video_rows = {r["id"]: r for r in rows if r["media"] == "video"}
    assert len(video_rows) >= 2 and report.faces_read == index.count
    manifest = read_manifest(out)
    assert manifest.faces is not None
    faces = pq.read_table(out / manifest.faces.path).to_pylist()
    read = pq.read_table(out / manifest.faces.read_path).to_pylist()
    # Every row read, none noted as unreadable: a video's row is its frame, not a file to decode as an image.
    assert sorted(r["id"] for r in read) == list(range(index.count)) and all(r["note"] is None for r in read)
    in_video = [f for f in faces if f["id"] in video_rows]
    in_photo = [f for f in faces if f["id"] not in video_rows]
    assert in_photo and in_video
    # Found on the astronaut's frames only (the coffee frames hold no face), in the frame's pixels.
    assert all(video_rows[f["id"]]["frame_time"] >= 2.0 - 1e-6 for f in in_video)
    assert all(0 <= f["left"] < f["right"] <= 384 and 0 <= f["top"] < f["bottom"] <= 384 for f in in_video)
    # One person: the photos' faces and the video's.
    assert len({f["person"] for f in faces}) == 1 and faces[0]["person"] >= 0
    app = create_app([out], cache_dir=tmp_path / "thumbs", device="cpu", warm=False)
    with TestClient(app) as client:
        people = client.get(f"/api/people?index={out.name}")
        assert people.status_code == 200, people.text
        ref = people.json()["people"][0]["id"]
        page = client.get(f"/api/people/{ref}?index={out.name}")
        assert page.status_code == 200, page.text
        assert {f["image_id"] for f in page.json()["face_list"]} & set(video_rows)
        # The person's photos (the UI's person page: no query, the person filter) hold the video at its moment.
        listed = client.get(f"/api/search?person={ref}&index={out.name}").json()["results"]
        video_hit = next(r for r in listed if r["path"] == "trip.mp4")
        assert video_hit["media"] == "video" and video_hit["frame_time"] >= 2.0 - 1e-6 and video_hit["start"] is None
        assert video_hit["video_url"].endswith(f"#t={video_hit['frame_time']:g}")
        assert sorted(r["path"] for r in listed) == ["astronaut.jpg", "mirror.jpg", "trip.mp4"]
        face = client.get(f"/api/people/{ref}/face?index={out.name}&size=64")
        assert face.status_code == 200 and face.content[:2] == b"\xff\xd8"
    # The server crops a video's face from the frame the finder read.
    from clipsearch.server.people import face_picture
    from retrieval.faces.people import Face

    first = in_video[0]
    box = (first["left"], first["top"], first["right"], first["bottom"])
    crop = face_picture(index, Face("k", first["id"], "trip.mp4", box, first["score"], first["person"]), "phone.idx", 64,
                        tmp_path / "crops")
    with Image.open(crop) as img:
        assert img.format == "JPEG" and max(img.size) <= 64
