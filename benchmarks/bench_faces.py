"""Faces: what the detector finds and costs, and how well people are grouped, against the thresholds.

A small labelled set of real faces: scikit-image's ``astronaut``, matplotlib's
``grace_hopper.jpg`` where matplotlib is installed, and every image of ``--photos DIR`` (its
person is the file name without a trailing number: ``basketball1.png`` and ``basketball2.png``
are one man; Debian's ``opencv-doc`` examples hold ``messi5.jpg`` and those two). Each photo is
seen in twelve views (itself, mirrored, 2x and 0.8x, darker, lighter, flatter, JPEG quality 15,
rotated 8 degrees each way, cropped, grey).

- **Detection**, for each ``--min-sizes`` x ``--min-scores``: the views whose person's face was
  found (recall: a face within 0.6 of the photo's own face), the other faces found (false
  positives: each photo holds one face), and the
  detector's seconds per view, for ``--max-side`` and ``--upsample``.
- **The cost on a build** (``--build-images N``, 0 to skip): a build of N photos (scikit-image's,
  1600 px, one face in five) with a random ViT-B/32 in fp32, without and with ``--faces``, in
  alternating rounds (``--rounds``); the ratio of the medians is what ``--faces`` adds.
- **Look-alikes** (``--siblings N``, 0 for none): real look-alikes are rare in packaged photos,
  so N are made. The N pairs of different people whose faces are closest (their first photos'
  descriptors) each get a sibling: the two faces aligned on their landmarks (dlib's face chips)
  and blended half and half, a person of their own, seen in the same twelve views. The
  look-alike pairs are each sibling with each of its two parents.
- **Grouping**, for each ``--distances``: ``cluster_all`` (DBSCAN, ``--min-faces``) over the
  largest face of each view, scored against the people: adjusted Rand index, pairwise precision
  and recall, people found, faces left to nobody, and for the look-alikes the share of their
  pairs of views put together and the look-alike pairs merged at all; and the largest distance
  within one person and the smallest between two (the margin look-alikes eat into).

    python benchmarks/bench_faces.py [--photos DIR] [--siblings 3] [--distances 0.35,0.4,0.45,0.5,0.55,0.6]
"""

from __future__ import annotations

import io
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Bench  # noqa: E402

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff"}


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def labelled_photos(folder: Path | None) -> list[tuple[str, Any]]:
    """``(person, PIL image)`` of the set: astronaut, grace_hopper where installed, ``folder``'s images."""
    import skimage.data
    from PIL import Image

    photos: list[tuple[str, Any]] = [("astronaut", Image.fromarray(skimage.data.astronaut()))]
    try:
        import matplotlib

        hopper = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
        if hopper.is_file():
            photos.append(("grace_hopper", Image.open(hopper)))
    except ImportError:
        pass
    for path in sorted(folder.iterdir()) if folder else []:
        if path.suffix.lower() in IMAGE_SUFFIXES:
            photos.append((re.sub(r"[-_ ]*\d+$", "", path.stem), Image.open(path)))
    return photos


def views(image: Any) -> list[Any]:
    """Twelve views of one photo: the same person in each."""
    from PIL import Image, ImageEnhance

    im = image.convert("RGB")
    w, h = im.size
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=15)
    return [
        im, im.transpose(Image.Transpose.FLIP_LEFT_RIGHT), im.resize((w * 2, h * 2), Image.Resampling.BICUBIC),
        im.resize((int(w * 0.8), int(h * 0.8)), Image.Resampling.BICUBIC), ImageEnhance.Brightness(im).enhance(0.6),
        ImageEnhance.Brightness(im).enhance(1.4), ImageEnhance.Contrast(im).enhance(0.7), Image.open(io.BytesIO(buf.getvalue())),
        im.rotate(8, expand=True), im.rotate(-8, expand=True), im.crop((w // 10, h // 10, w - w // 10, h - h // 10)), im.convert("L"),
    ]


_dlib: Any = None  # dlib's detector and landmarks, loaded by the first _chip


def _chip(image: Any) -> Any:
    """The largest face of ``image`` aligned on its five landmarks (dlib's face chip, 300 px, the
    face in the middle half), or None where no face is found."""
    import dlib
    import face_recognition_models

    global _dlib
    if _dlib is None:
        model = Path(face_recognition_models.__file__).parent / "models" / "shape_predictor_5_face_landmarks.dat"
        _dlib = (dlib.get_frontal_face_detector(), dlib.shape_predictor(str(model)))
    detector, landmarks = _dlib
    rgb = np.asarray(image.convert("RGB"))
    found = detector(rgb, 1)
    if not found:
        return None
    return np.asarray(dlib.get_face_chip(rgb, landmarks(rgb, max(found, key=lambda r: r.area())), size=300, padding=0.6))


def siblings(photos: list[tuple[str, Any]], count: int) -> tuple[list[tuple[str, Any]], list[tuple[str, str]]]:
    """Synthetic look-alikes: for the ``count`` closest pairs of different people (by the largest
    face of each one's first photo), a sibling, their two aligned faces blended half and half.

    Returns ``(person, image)`` of each sibling and the look-alike pairs (each sibling with each
    parent).
    """
    from PIL import Image

    from indexer.faces import FaceFinder, FaceOptions

    if count <= 0:
        return [], []
    finder = FaceFinder(FaceOptions(min_size=24, min_score=0.0))
    first: dict[str, Any] = {}
    for person, image in photos:
        if person not in first:
            faces = finder.find(image)
            if faces:
                first[person] = (faces[0].descriptor, image)
    names = sorted(first)
    pairs = sorted((float(np.linalg.norm(first[a][0] - first[b][0])), a, b) for i, a in enumerate(names) for b in names[i + 1:])
    made: list[tuple[str, Any]] = []
    lookalikes: list[tuple[str, str]] = []
    for _, a, b in pairs:
        if len(made) == count:
            break
        chip_a, chip_b = _chip(first[a][1]), _chip(first[b][1])
        if chip_a is None or chip_b is None:
            continue
        name = f"{a}+{b}"
        made.append((name, Image.fromarray(((chip_a.astype(np.float32) + chip_b) / 2).round().astype(np.uint8))))
        lookalikes += [(name, a), (name, b)]
    return made, lookalikes


def detection_rows(labelled: list[tuple[str, list[Any]]], min_sizes: list[int], min_scores: list[float],
                   max_side: int, upsample: int) -> tuple[list[dict[str, Any]], list[tuple[str, Any]]]:
    """One row per (min size, min score); and the largest face of each view at the loosest setting."""
    from indexer.faces import FaceFinder, FaceOptions

    loosest = FaceFinder(FaceOptions(min_size=min(min_sizes), min_score=min(min_scores), max_side=max_side, upsample=upsample))
    found: list[tuple[str, list[Any], float]] = []
    for person, imgs in labelled:
        for img in imgs:
            start = time.perf_counter()
            faces = loosest.find(img)
            found.append((person, faces, time.perf_counter() - start))
    seconds = float(np.median([s for _, _, s in found]))
    # A face is the person's when it is within dlib's 0.6 of the largest face of the photo itself
    # (its first view); any other face found is a false positive (each photo holds one face).
    reference = {}
    for person, faces, _ in found:
        if faces and person not in reference:
            reference[person] = faces[0].descriptor
    def theirs(person: str, face: Any) -> bool:
        return person in reference and float(np.linalg.norm(face.descriptor - reference[person])) < 0.6
    rows = []
    for size in min_sizes:
        for score in min_scores:
            kept = [(person, [f for f in faces if f.size >= size and f.score >= score]) for person, faces, _ in found]
            rows.append({"min_size": size, "min_score": score, "views": len(found),
                         "found": sum(any(theirs(p, f) for f in k) for p, k in kept),
                         "false_positives": sum(sum(not theirs(p, f) for f in k) for p, k in kept),
                         "detect_s_p50": round(seconds, 3)})
    largest = [(person, faces[0]) for person, faces, _ in found if faces]
    return rows, largest


def grouping_rows(faces: list[tuple[str, Any]], distances: list[float], min_faces: int,
                  lookalikes: Sequence[tuple[str, str]] = ()) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """One row per max_distance: ARI, pairwise precision and recall, and how often look-alikes merge."""
    from sklearn.metrics import adjusted_rand_score

    from indexer.faces import ClusterOptions, cluster_all

    names = sorted({p for p, _ in faces})
    truth = np.array([names.index(p) for p, _ in faces])
    vecs = np.stack([f.descriptor for _, f in faces])
    dist = np.linalg.norm(vecs[:, None] - vecs[None], axis=2)
    same = truth[:, None] == truth[None]
    off = ~np.eye(len(truth), dtype=bool)
    margin = {"within_person_max": round(float(dist[same & off].max()), 3) if (same & off).any() else 0.0,
              "between_people_min": round(float(dist[~same].min()), 3) if (~same).any() else 0.0}
    # The pairs of views of two look-alikes, one mask per look-alike pair.
    alike = [(truth[:, None] == names.index(a)) & (truth[None] == names.index(b)) for a, b in lookalikes if a in names and b in names]
    if alike:
        margin["lookalike_min"] = round(min(float(dist[m].min()) for m in alike), 3)
        margin["lookalike_median"] = round(float(np.median(np.concatenate([dist[m] for m in alike]))), 3)
    rows = []
    for d in distances:
        labels = cluster_all(vecs, ClusterOptions(max_distance=d, min_faces=min_faces))
        together = (labels[:, None] == labels[None]) & (labels[:, None] != -1) & off
        tp = int((together & same).sum())
        rows.append({"max_distance": d, "min_faces": min_faces, "ari": round(float(adjusted_rand_score(truth, labels)), 3),
                     "precision": round(tp / max(int(together.sum()), 1), 3), "recall": round(tp / max(int((same & off).sum()), 1), 3),
                     "people": len(set(labels.tolist()) - {-1}), "true_people": len(names), "nobody": int((labels == -1).sum()),
                     "lookalike_pairs": len(alike),
                     "lookalike_merged": round(sum(int((together & m).sum()) for m in alike) / max(sum(int(m.sum()) for m in alike), 1), 3),
                     "lookalike_pairs_merged": sum(bool((together & m).any()) for m in alike)})
    return rows, margin


def build_cost(work: Path, images: int, rounds: int) -> dict[str, Any]:
    """Seconds of a build without and with ``--faces`` (median of ``rounds`` alternating pairs)."""
    import shutil

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from photos import PHOTOS, photo

    from indexer import build_index
    from retrieval.tools.random_model import make_random_clip

    photos = work / "photos"
    photos.mkdir()
    for i in range(images):
        photo(PHOTOS[i % len(PHOTOS)], max_side=1600).rotate(i % 4).save(photos / f"p{i:03d}.jpg", quality=90)
    model = make_random_clip(work / "model", preset="vit-b-32", seed=0)
    seconds: dict[bool, list[float]] = {False: [], True: []}
    faces_found = 0
    for _ in range(rounds):
        for faces in (False, True):
            out = work / "idx"
            shutil.rmtree(out, ignore_errors=True)
            start = time.perf_counter()
            report = build_index(photos, out, model=str(model), device="cpu", precision="fp32", progress=False, faces=faces)
            seconds[faces].append(time.perf_counter() - start)
            faces_found = max(faces_found, report.faces_found)
    plain, with_faces = float(np.median(seconds[False])), float(np.median(seconds[True]))
    return {"images": images, "rounds": rounds, "plain_s": round(plain, 2), "faces_s": round(with_faces, 2),
            "ratio": round(with_faces / plain, 2), "faces_s_per_image": round((with_faces - plain) / images, 3),
            "faces_found": faces_found}


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_faces", __doc__, "work_dir")
    p = bench.parser
    p.add_argument("--photos", type=Path, metavar="DIR", help="more labelled photos: the person is the file name without a trailing number")
    p.add_argument("--min-sizes", type=_ints, default=[24, 32, 40], help="face sizes in px (default: 24,32,40)")
    p.add_argument("--min-scores", type=_floats, default=[-0.3, 0.0, 0.3, 0.5], help="detector scores (default: -0.3,0,0.3,0.5)")
    p.add_argument("--max-side", type=int, default=1024, help="longer side the detector reads (default: 1024)")
    p.add_argument("--upsample", type=int, default=1, help="detector upsampling (default: 1)")
    p.add_argument("--distances", type=_floats, default=[0.35, 0.4, 0.45, 0.5, 0.55, 0.6], help="max_distance values")
    p.add_argument("--min-faces", type=int, default=3, help="faces that found a person (default: 3)")
    p.add_argument("--siblings", type=int, default=3, help="synthetic look-alikes, one per closest pair of people (default: 3)")
    p.add_argument("--build-images", type=int, default=0, help="photos of the build-cost rows (default: 0, skipped)")
    p.add_argument("--rounds", type=int, default=2, help="build pairs, alternating (default: 2)")
    args = bench.parse(argv)
    try:
        from indexer.faces.detect import check_engine

        check_engine()
    except Exception as exc:  # the one line names the extra to install
        return bench.fail(exc)
    if args.photos is not None and not args.photos.is_dir():
        return bench.fail(f"--photos {args.photos} is not a folder")
    photos = labelled_photos(args.photos)
    labelled = [(person, views(img)) for person, img in photos]
    detection, largest = detection_rows(labelled, args.min_sizes, args.min_scores, args.max_side, args.upsample)
    made, lookalikes = siblings(photos, args.siblings)
    if made:  # their faces at the loosest setting, as the real ones'; they count in no detection row
        largest += detection_rows([(person, views(img)) for person, img in made], [min(args.min_sizes)], [min(args.min_scores)],
                                  args.max_side, args.upsample)[1]
    grouping, margin = grouping_rows(largest, args.distances, args.min_faces, lookalikes)
    cost: dict[str, Any] | None = None
    if args.build_images > 0:
        with bench.scratch() as work:
            cost = build_cost(work, args.build_images, max(1, args.rounds))
    table = [f"{len(labelled)} photos x 12 views, {len({p for p, _ in labelled})} people; detector max_side {args.max_side}, "
             f"upsample {args.upsample}, {detection[0]['detect_s_p50']} s per view (median)", "",
             "min_size  min_score  found/views  false_positives"]
    table += [f"{r['min_size']:>8}  {r['min_score']:>9}  {r['found']:>5}/{r['views']:<5}  {r['false_positives']:>15}" for r in detection]
    table += ["", f"grouping the largest face of each view (at min_size {min(args.min_sizes)}, min_score {min(args.min_scores)}); "
              f"distance within a person <= {margin['within_person_max']}, between people >= {margin['between_people_min']}"
              + (f"; {len(made)} siblings: {', '.join(p for p, _ in made)}, nearest parent >= {margin['lookalike_min']}, "
                 f"median {margin['lookalike_median']}" if "lookalike_min" in margin else ""),
              "max_distance    ARI  precision  recall  people  nobody  look-alike views merged  look-alike pairs merged"]
    table += [f"{r['max_distance']:>12}  {r['ari']:>5}  {r['precision']:>9}  {r['recall']:>6}  "
              f"{r['people']:>3}/{r['true_people']:<2}  {r['nobody']:>6}  {r['lookalike_merged']:>23}  "
              f"{r['lookalike_pairs_merged']:>9}/{r['lookalike_pairs']}" for r in grouping]
    if cost is not None:
        table += ["", f"a build of {cost['images']} photos (1600 px, random ViT-B/32, fp32), median of {cost['rounds']}: "
                  f"{cost['plain_s']} s without --faces, {cost['faces_s']} s with it ({cost['ratio']}x; "
                  f"{cost['faces_s_per_image']} s more per photo, {cost['faces_found']} faces)"]
    bench.report({"bench": "faces", "detection": detection, "grouping": grouping, "margin": margin,
                  "siblings": [p for p, _ in made], "build": cost}, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
