#!/usr/bin/env python3
"""Build the captioned demo collection under ``data/demo`` from Tux Paint stamps.

Source: Debian package ``tuxpaint-stamps-default`` (GPL-2), extracted with
``dpkg-deb -x``.  Every stamp PNG that has a description ``.txt`` next to it
becomes one image of the collection; the caption is the English (default,
un-prefixed) line of that ``.txt`` file.  Localised lines (``fr.utf8=...``)
are ignored.  SVG-only stamps, ``*_mirror.png`` alternates (no ``.txt``) and
sounds are skipped.

Usage::

    python data/make_demo.py /tmp/tpx            # root given to dpkg-deb -x
    python data/make_demo.py /tmp/tpx/usr/share/tuxpaint/stamps   # also fine

Writes (deterministically; re-running gives byte-identical files):

    data/demo/images/<category>/<subpath>.png   stamps, bytes copied verbatim
    data/demo/captions.jsonl                    {"path","caption","category"}
    data/demo/splits/train.txt, splits/test.txt held-out split (~80/20)
    data/demo/queries.jsonl                     {"query","relevant":[...]}
    data/demo/COPYING.tuxpaint-stamps           the package's copyright file
    data/demo/GPL-2                             licence text (if available)
    data/README.md                              provenance, counts, statistics

Only the standard library and Pillow are used.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import hashlib
import io
import json
import re
import shutil
import sys
from pathlib import Path

from PIL import Image

DATA_DIR = Path(__file__).resolve().parent
PACKAGE = "tuxpaint-stamps-default"
STAMPS_SUBDIR = Path("usr/share/tuxpaint/stamps")
DOC_SUBDIR = Path("usr/share/doc") / PACKAGE
GPL_TEXT = Path("/usr/share/common-licenses/GPL-2")

# Everything under data/ must stay below this (bytes).
SIZE_BUDGET = 30_000_000
# Longest side used if images have to be downscaled to fit the budget.
MAX_SIDE = 512
TEST_FRACTION = 0.2

# A localised line in a stamp description: "fr.utf8=...", "pt_BR.UTF-8=...",
# "sr@latin.utf8=...", "en_GB.utf8=...".  The English default has no prefix.
LOCALE_LINE = re.compile(
    r"^[A-Za-z]{2,3}(?:_[A-Za-z]{2})?(?:@[A-Za-z]+)?(?:\.[Uu][Tt][Ff]-?8)?="
)


def clean_caption(text: str) -> str:
    """Strip and collapse internal whitespace."""
    return " ".join(text.split())


def read_caption(txt: Path) -> str:
    """English caption of a stamp description file ('' when there is none)."""
    text = txt.read_bytes().decode("utf-8-sig")
    for line in text.splitlines():
        if not line.strip() or LOCALE_LINE.match(line):
            continue
        return clean_caption(line)
    return ""


def find_roots(root: Path) -> tuple[Path, Path | None]:
    """(stamps dir, package doc dir or None) for an extracted package root."""
    if (root / STAMPS_SUBDIR).is_dir():
        return root / STAMPS_SUBDIR, root / DOC_SUBDIR
    if root.name == "stamps" and root.is_dir():
        # .../usr/share/tuxpaint/stamps -> .../usr/share/doc/<pkg>
        doc = root.parent.parent / "doc" / PACKAGE
        return root, doc if doc.is_dir() else None
    raise SystemExit(f"no {STAMPS_SUBDIR} under {root}")


def package_version(doc: Path | None) -> str:
    """Debian version from the first line of changelog.Debian.gz."""
    if doc is None or not (doc / "changelog.Debian.gz").is_file():
        return "unknown"
    with gzip.open(doc / "changelog.Debian.gz", "rt", encoding="utf-8") as fh:
        m = re.match(r"^\S+ \(([^)]+)\)", fh.readline())
    return m.group(1) if m else "unknown"


def sha1_hex(s: str) -> str:
    return hashlib.sha1(s.encode("utf-8")).hexdigest()


def collect(stamps: Path) -> tuple[list[dict], dict[str, Path], collections.Counter]:
    """Records sorted by path, source file for each path, skip reasons."""
    records, sources = [], {}
    skipped: collections.Counter = collections.Counter()
    for png in sorted(stamps.rglob("*"), key=lambda p: p.as_posix()):
        if not png.is_file() or png.suffix.lower() != ".png":
            continue
        rel = png.relative_to(stamps)
        if len(rel.parts) < 2:
            skipped["png directly in stamps root (no category)"] += 1
            continue
        txt = png.with_suffix(".txt")
        if not txt.is_file():
            skipped["png without .txt (e.g. *_mirror.png)"] += 1
            continue
        caption = read_caption(txt)
        if not caption:
            skipped["empty caption"] += 1
            continue
        path = "images/" + rel.as_posix()
        records.append({"path": path, "caption": caption, "category": rel.parts[0]})
        sources[path] = png
    records.sort(key=lambda r: r["path"])
    return records, sources, skipped


def shrink_to_budget(out: Path, records: list[dict], budget: int) -> list[str]:
    """Only used if the copied PNGs are too big: lossless re-save, then downscale.

    Returns a log of what was changed (empty when nothing was needed).
    """
    log: list[str] = []

    def total() -> int:
        return sum(f.stat().st_size for f in out.rglob("*") if f.is_file())

    if total() <= budget:
        return log
    files = sorted((out / r["path"] for r in records), key=lambda f: (-f.stat().st_size, f.as_posix()))
    # 1. lossless: Pillow re-encode with optimize=True, kept only if smaller.
    for f in files:
        if total() <= budget:
            return log
        with Image.open(f) as im:
            im.load()
            buf = io.BytesIO()
            kw = {k: im.info[k] for k in ("transparency", "icc_profile", "gamma") if k in im.info}
            im.save(buf, "PNG", optimize=True, **kw)
        if buf.tell() < f.stat().st_size:
            log.append(f"optimize {f.relative_to(out).as_posix()}: {f.stat().st_size} -> {buf.tell()}")
            f.write_bytes(buf.getvalue())
    # 2. downscale the largest files (longest side > MAX_SIDE), same mode.
    for f in sorted(files, key=lambda f: (-f.stat().st_size, f.as_posix())):
        if total() <= budget:
            break
        with Image.open(f) as im:
            im.load()
            if max(im.size) <= MAX_SIDE:
                continue
            scale = MAX_SIDE / max(im.size)
            size = (max(1, round(im.width * scale)), max(1, round(im.height * scale)))
            resample = Image.NEAREST if im.mode in ("P", "1") else Image.LANCZOS
            kw = {k: im.info[k] for k in ("transparency", "icc_profile", "gamma") if k in im.info}
            small = im.resize(size, resample)
            old = im.size
        buf = io.BytesIO()
        small.save(buf, "PNG", optimize=True, **kw)
        log.append(f"downscale {f.relative_to(out).as_posix()}: {old[0]}x{old[1]} -> {size[0]}x{size[1]}")
        f.write_bytes(buf.getvalue())
    if total() > budget:
        raise SystemExit(f"still over budget after shrinking: {total()} > {budget}")
    return log


def image_stats(out: Path, records: list[dict]) -> dict:
    modes: collections.Counter = collections.Counter()
    transparent: collections.Counter = collections.Counter()
    declares: collections.Counter = collections.Counter()
    sides = []
    for r in records:
        with Image.open(out / r["path"]) as im:
            im.load()
            modes[im.mode] += 1
            sides.append(max(im.size))
            has_alpha = im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info
            if has_alpha:
                declares[im.mode] += 1
                alpha = im.convert("RGBA").getchannel("A")
                if alpha.getextrema()[0] < 255:
                    transparent[im.mode] += 1
    sides.sort()
    return {
        "modes": dict(sorted(modes.items(), key=lambda kv: (-kv[1], kv[0]))),
        "declares_alpha": dict(sorted(declares.items(), key=lambda kv: (-kv[1], kv[0]))),
        "transparent": dict(sorted(transparent.items(), key=lambda kv: (-kv[1], kv[0]))),
        "n_transparent": sum(transparent.values()),
        "min_side": sides[0],
        "median_side": sides[len(sides) // 2],
        "max_side": sides[-1],
        "n_over_512": sum(s > 512 for s in sides),
    }


def split(records: list[dict]) -> tuple[list[str], list[str]]:
    """Deterministic, stratified ~80/20 split.

    Images whose captions are equal ignoring case (e.g. the filled and outlined
    letter "a", or two photos captioned "A flower.") form one group and always
    land on the same side, so a test query never has a near-duplicate with the
    very same caption in train.  Groups are stratified by the category of their
    first path; within a stratum they are ordered by sha1 of the group key and
    taken into test until round(20%) of the stratum's images are there.
    """
    groups: dict[str, list[dict]] = collections.defaultdict(list)
    for r in records:
        groups[r["caption"].casefold()].append(r)
    strata: dict[str, list[str]] = collections.defaultdict(list)
    for key, members in groups.items():
        strata[min(m["path"] for m in members).split("/")[1]].append(key)
    test_keys: set[str] = set()
    for cat in sorted(strata):
        keys = sorted(strata[cat], key=lambda k: (sha1_hex(k), k))
        n = sum(len(groups[k]) for k in keys)
        target = int(n * TEST_FRACTION + 0.5)
        taken = 0
        for k in keys:
            if taken >= target:
                break
            test_keys.add(k)
            taken += len(groups[k])
    # Guarantee: every category with >= 5 images has a test image.
    per_cat = collections.Counter(r["category"] for r in records)
    for cat in sorted(per_cat):
        if per_cat[cat] < 5:
            continue
        if not any(r["category"] == cat and r["caption"].casefold() in test_keys for r in records):
            keys = sorted({r["caption"].casefold() for r in records if r["category"] == cat},
                          key=lambda k: (sha1_hex(k), k))
            test_keys.add(keys[0])
    test = sorted(r["path"] for r in records if r["caption"].casefold() in test_keys)
    train = sorted(r["path"] for r in records if r["caption"].casefold() not in test_keys)
    return train, test


def make_queries(records: list[dict], test: list[str]) -> list[dict]:
    """One query per distinct (exact) caption among the test images."""
    by_path = {r["path"]: r for r in records}
    merged: dict[str, list[str]] = collections.defaultdict(list)
    for p in test:
        merged[by_path[p]["caption"]].append(p)
    queries = [{"query": c, "relevant": sorted(ps)} for c, ps in merged.items()]
    queries.sort(key=lambda q: (q["relevant"][0], q["query"]))
    return queries


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def fmt_counter(d: dict) -> str:
    return ", ".join(f"{k}: {v}" for k, v in d.items()) or "none"


def readme(info: dict) -> str:
    cats = info["categories"]
    cat_rows = "\n".join(
        f"| {c} | {n} | {info['test_per_cat'].get(c, 0)} |" for c, n in cats.items()
    )
    st = info["stats"]
    shrink = (
        "No image was changed: the PNG bytes are copied verbatim from the package "
        f"({info['image_bytes']:,} bytes in total, below the {SIZE_BUDGET:,}-byte budget), "
        "so no recompression or downscaling was needed."
        if not info["shrink_log"]
        else "The copied PNGs exceeded the size budget, so `make_demo.py` changed these files:\n\n"
        + "\n".join(f"- {line}" for line in info["shrink_log"])
    )
    skipped = "\n".join(f"- {reason}: {n}" for reason, n in sorted(info["skipped"].items())) or "- none"
    return f"""# Data

## `demo/` — captioned Tux Paint stamps

A small, real, captioned image collection for demos and retrieval evaluation:
{info['n_images']} PNG images in {len(cats)} categories, each with an English caption.

### Provenance

- Debian package **`{PACKAGE}`**, version **`{info['version']}`**
  (source package `tuxpaint-stamps`, `Architecture: all`, from the Debian archive;
  the version is read from the package's `changelog.Debian.gz` and matches
  `dpkg-deb -f ... Version`).
- Upstream: the [Tux Paint](https://tuxpaint.org/) project's stamp collection
  (`Upstream-Name: tuxpaint-stamps`, `Source: http://sourceforge.net/projects/tuxpaint`;
  “Copyright: 2002-2022 by Bill Kendrick”, per the Debian copyright file).
- Each stamp is a PNG next to a description file `<name>.txt` whose first,
  un-prefixed line is the English description; the other lines are translations
  (`fr.utf8=...`, `en_GB.utf8=...`, ...) and are not used.

### Licence

GPL-2 (version 2 or later), like the package. The package's Debian copyright file is
copied verbatim to `demo/COPYING.tuxpaint-stamps`; the licence text is in `demo/GPL-2`.
Anything that redistributes these images must keep it under the GPL.

### How it was built

```sh
apt-get update
cd /tmp && apt-get download {PACKAGE}={info['version']}   # -> {PACKAGE}_{info['version']}_all.deb
dpkg-deb -f {PACKAGE}_{info['version']}_all.deb Version   # -> {info['version']}
mkdir -p /tmp/tpx && dpkg-deb -x {PACKAGE}_{info['version']}_all.deb /tmp/tpx  # not installed
python data/make_demo.py /tmp/tpx       # needs Pillow; rewrites data/demo and this README
```

`make_demo.py` walks `usr/share/tuxpaint/stamps/` and takes every `*.png` that has a
`.txt` beside it; SVG-only stamps, sounds (`.ogg`/`.wav`) and `.dat` option files are
ignored. Skipped PNGs:

{skipped}

For each kept stamp:

- Image: copied to `demo/images/<category>/<subpath>.png`, where `<category>` is the
  first directory below `stamps/` and the rest of the path and the file name are kept
  exactly as in the package (some names contain upper case, e.g. `A_filled.png`).
- Caption: the first non-empty line of the `.txt` that is not a `xx[_YY].utf8=`
  translation, stripped and with internal whitespace collapsed. Stamps with an empty
  caption would be dropped (there are none). Captions are kept as written, with their
  typographic characters (“ ” ’ — …), and vary from a short phrase (“A badger.”) to a
  few sentences (chess pieces, dreidel faces, planets).
- Output is deterministic: running the script twice gives byte-identical files.

{shrink}

### Files

| file | content |
| --- | --- |
| `demo/images/` | {info['n_images']} PNGs |
| `demo/captions.jsonl` | one `{{"path", "caption", "category"}}` per image, `path` relative to `demo/`, sorted by path, UTF-8 |
| `demo/splits/train.txt`, `demo/splits/test.txt` | held-out split, one path per line, sorted: {info['n_train']} train / {info['n_test']} test |
| `demo/queries.jsonl` | {info['n_queries']} evaluation queries `{{"query", "relevant": [paths]}}`: one per distinct caption among the test images |
| `demo/COPYING.tuxpaint-stamps`, `demo/GPL-2` | licence |
| `make_demo.py` | the script that produced all of the above |

### Counts

- images: {info['n_images']}; captions: {info['n_images']} ({info['n_distinct_captions']} distinct;
  {info['n_shared_captions']} captions are shared by more than one image, e.g. “A flower.” or
  the filled and outlined versions of “The letter a.”)
- categories: {len(cats)}
- split: {info['n_train']} train, {info['n_test']} test ({100 * info['n_test'] / info['n_images']:.1f}% test);
  queries: {info['n_queries']} ({info['n_multi_queries']} with more than one relevant image)

| category | images | test |
| --- | --- | --- |
{cat_rows}

**Split rule.** Images whose captions are equal ignoring case form a group that always
goes to the same side (so a near-duplicate with the same caption never sits in train
while its twin is a test query). Groups are stratified by category (of their first
path), ordered by the SHA-1 of the lower-cased caption, and moved to test until 20%
(rounded) of the category's images are in test; every category with at least 5 images
has test images. Queries merge test images with *identical* captions; captions that
differ only in case (“The letter a.” / “The letter A.”) stay separate queries, although
a case-insensitive text encoder such as CLIP's cannot tell them apart.

### Images

- Modes (Pillow): {fmt_counter(st['modes'])}.
- With an alpha channel or a transparency key: {fmt_counter(st['declares_alpha'])};
  actually containing transparent pixels: {st['n_transparent']} of {info['n_images']}
  ({fmt_counter(st['transparent'])}).
- Longest side: {st['min_side']}–{st['max_side']} px (median {st['median_side']});
  {st['n_over_512']} images are larger than 512 px.
- Size on disk: {info['image_bytes']:,} bytes of PNG, {info['demo_bytes']:,} bytes for all of `demo/`.

**Most images are transparent PNGs** (cut-out stamps on a transparent background, many
of them grey-scale+alpha `LA` or palette `P`). They are stored as they are; the indexer
decides how alpha becomes RGB (e.g. compositing onto white), which affects the
embeddings.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="directory given to `dpkg-deb -x` (or its stamps dir)")
    ap.add_argument("--data-dir", type=Path, default=DATA_DIR, help="output data/ directory")
    ap.add_argument("--budget", type=int, default=SIZE_BUDGET, help="max bytes for data/demo")
    args = ap.parse_args(argv)

    stamps, doc = find_roots(args.root.resolve())
    version = package_version(doc)
    records, sources, skipped = collect(stamps)
    if not records:
        raise SystemExit(f"no captioned PNG stamps under {stamps}")
    lower = collections.Counter(r["path"].casefold() for r in records)
    clash = [p for p, n in lower.items() if n > 1]
    if clash:
        raise SystemExit(f"paths differing only in case: {clash}")

    out = args.data_dir / "demo"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for r in records:
        dst = out / r["path"]
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sources[r["path"]], dst)

    # Licence files.
    if doc is not None and (doc / "copyright").is_file():
        shutil.copyfile(doc / "copyright", out / "COPYING.tuxpaint-stamps")
    else:
        print("warning: package copyright file not found", file=sys.stderr)
    if GPL_TEXT.is_file():
        shutil.copyfile(GPL_TEXT, out / "GPL-2")
    else:
        print(f"warning: {GPL_TEXT} not found; demo/GPL-2 not written", file=sys.stderr)

    # Keep room for the text files and README under the budget.
    shrink_log = shrink_to_budget(out, records, args.budget - 1_000_000)

    train, test = split(records)
    queries = make_queries(records, test)
    write_jsonl(out / "captions.jsonl", records)
    write_text(out / "splits" / "train.txt", "".join(p + "\n" for p in train))
    write_text(out / "splits" / "test.txt", "".join(p + "\n" for p in test))
    write_jsonl(out / "queries.jsonl", queries)

    cats = collections.Counter(r["category"] for r in records)
    cap_count = collections.Counter(r["caption"] for r in records)
    by_path = {r["path"]: r for r in records}
    info = {
        "version": version,
        "n_images": len(records),
        "categories": dict(sorted(cats.items())),
        "test_per_cat": collections.Counter(by_path[p]["category"] for p in test),
        "n_distinct_captions": len(cap_count),
        "n_shared_captions": sum(1 for n in cap_count.values() if n > 1),
        "n_train": len(train),
        "n_test": len(test),
        "n_queries": len(queries),
        "n_multi_queries": sum(len(q["relevant"]) > 1 for q in queries),
        "skipped": skipped,
        "shrink_log": shrink_log,
        "stats": image_stats(out, records),
        "image_bytes": sum((out / r["path"]).stat().st_size for r in records),
        "demo_bytes": sum(f.stat().st_size for f in out.rglob("*") if f.is_file()),
    }
    write_text(args.data_dir / "README.md", readme(info))
    print(
        f"{info['n_images']} images, {len(cats)} categories, {len(train)} train / {len(test)} test, "
        f"{len(queries)} queries, {info['demo_bytes']:,} bytes in {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
