"""An index of two people for the person-search tests (:mod:`test_person_search`, :mod:`test_people_ui`).

It holds one real face (scikit-image's astronaut) in four photos and a photo with two copies of it
side by side. The grouping makes one person of all six faces; the user's edits
(:mod:`retrieval.faces.edits`) make a second: "Bob" is given two of the single photos and the
right-hand face of the pair, so that one photo holds both people.
"""

from __future__ import annotations

from pathlib import Path

from photos import exif_bytes
from PIL import Image

from indexer import build_index
from retrieval.faces import People, editing

# Photo -> the day it was taken (the pair is the newest, coffee has no face and no date).
TAKEN = {"a0.jpg": "2021:05:01 10:00:00", "a1.jpg": "2022:05:01 10:00:00", "a2.jpg": "2023:05:01 10:00:00",
         "a3.jpg": None, "pair.jpg": "2024:05:01 10:00:00", "coffee.jpg": None}


def _photos(photos: Path) -> None:
    from skimage import data as skdata

    photos.mkdir()
    face = Image.fromarray(skdata.astronaut())
    views = {"a0.jpg": face, "a1.jpg": face.transpose(Image.Transpose.FLIP_LEFT_RIGHT), "a2.jpg": face.resize((420, 420)),
             "a3.jpg": face.rotate(3)}
    pair = Image.new("RGB", (1024, 512))
    pair.paste(face, (0, 0))
    pair.paste(face.transpose(Image.Transpose.FLIP_LEFT_RIGHT), (512, 0))
    views["pair.jpg"] = pair
    views["coffee.jpg"] = Image.fromarray(skdata.coffee())
    for name, img in views.items():
        taken = TAKEN[name]
        img.save(photos / name, quality=92, **({"exif": exif_bytes(taken=taken)} if taken else {}))


def build_two_people(root: Path, model: Path) -> Path:
    """``root/photos`` and its index ``root/idx`` with Alice and Bob named; returns the index."""
    _photos(root / "photos")
    out = root / "idx"
    build_index(root / "photos", out, model=str(model), batch_size=4, workers=0, device="cpu", precision="fp32",
                progress=False, faces=True)
    people = People.open(out)
    (everyone,) = people.everyone()
    assert everyone.faces == 6 and everyone.images == 5
    faces = people.faces_of(everyone.id)
    pair = sorted((f for f in faces if f.path == "pair.jpg"), key=lambda f: f.box[0])
    bob = [f.key for f in faces if f.path in ("a2.jpg", "a3.jpg")] + [pair[1].key]
    with editing(out) as box:
        box[0], split = box[0].named(everyone.id, "Alice").split(bob, people.first_free())
        box[0] = box[0].named(split, "Bob")
    return out
