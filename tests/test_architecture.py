"""ARCHITECTURE.md names every module of the three packages, so the map cannot fall behind the tree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("clipsearch", "retrieval", "indexer")


def _units(text: str) -> list[str]:
    """Paragraphs, with each table row its own unit (a row names a module and its job)."""
    units: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        rows = [line for line in block.splitlines() if line.lstrip().startswith("|")]
        units.extend(rows if rows else [block])
    return units


def _named(path: str, units: list[str]) -> bool:
    folder, _, name = path.rpartition("/")
    return any(f"`{path}`" in unit or (f"`{folder}/" in unit and f"`{name}`" in unit) for unit in units)


def test_architecture_names_every_module() -> None:
    units = _units((ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8"))
    modules = sorted(str(p.relative_to(ROOT)) for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    assert len(modules) > 100
    missing = [m for m in modules if not _named(m, units)]
    assert not missing, f"ARCHITECTURE.md does not name: {missing}"


def test_the_check_sees_a_missing_module() -> None:
    units = _units("| `retrieval/index.py` | ImageIndex |\n\n**`retrieval/images/`**: `decode.py` (PIL)")
    assert _named("retrieval/index.py", units)
    assert _named("retrieval/images/decode.py", units)
    assert not _named("retrieval/images/preprocess.py", units)
    assert not _named("retrieval/rows.py", units)
