"""The house rules of ARCHITECTURE.md, checked on the source: which room may import which.

Read from the files with `ast` (nothing is imported), so a rule broken inside a function body is
caught too, and the test costs milliseconds.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("retrieval", "indexer", "clipsearch")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


SOURCES = _sources()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, *, top_level_only: bool) -> Iterator[str]:
    """Absolute names `module` imports; `top_level_only` skips function bodies and TYPE_CHECKING blocks."""
    path = SOURCES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))

    def visit(node: ast.AST) -> Iterator[str]:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield target
            # `from pkg import submodule` imports the submodule too.
            yield from (f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in SOURCES)
        elif top_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        elif top_level_only and isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                yield from visit(child)
        else:
            for child in ast.iter_child_nodes(node):
                yield from visit(child)

    yield from visit(tree)


def _all_imports(module: str) -> set[str]:
    return set(_imports(module, top_level_only=False))


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _offenders(where: str, forbidden: str) -> list[str]:
    return sorted(f"{m} imports {n}" for m in SOURCES if _in(m, where) for n in _all_imports(m) if _in(n, forbidden))


def test_the_source_tree_is_found() -> None:
    assert {"retrieval", "indexer", "indexer.training", "clipsearch", "retrieval.faiss_index", "clipsearch.cli"} <= SOURCES.keys()


@pytest.mark.parametrize(
    ("where", "forbidden"),
    [("retrieval", "indexer"), ("retrieval", "clipsearch"), ("indexer", "clipsearch")],
)
def test_inner_rooms_never_import_outer_ones(where: str, forbidden: str) -> None:
    assert _offenders(where, forbidden) == []


def test_training_imports_only_retrieval_and_itself() -> None:
    bad = sorted(
        f"{m} imports {n}"
        for m in SOURCES
        if _in(m, "indexer.training")
        for n in _all_imports(m)
        if _in(n, "indexer") and not _in(n, "indexer.training")
    )
    assert bad == []



# The query layer's re-exports of tools: the documented `retrieval.verify_index` and the old
# import paths kept for their users (`retrieval.evaluate`, `.metrics`, `.zeroshot`, `.random_model`).
TOOL_FACADES = ("retrieval", "retrieval.evaluate", "retrieval.metrics", "retrieval.zeroshot", "retrieval.random_model")


def test_the_query_layer_never_imports_its_tools() -> None:
    bad = sorted(
        f"{m} imports {n}"
        for m in SOURCES
        if _in(m, "retrieval") and not _in(m, "retrieval.tools") and m not in TOOL_FACADES
        for n in _all_imports(m)
        if _in(n, "retrieval.tools")
    )
    assert bad == []

@pytest.mark.parametrize(
    ("library", "allowed"),
    [("faiss", ("retrieval.faiss_index",)), ("open_clip", ("retrieval.encoders.openclip",))],
)
def test_one_room_imports_each_backend(library: str, allowed: tuple[str, ...]) -> None:
    users = sorted(m for m in SOURCES if any(_in(n, library) for n in _all_imports(m)))
    assert users, f"nothing imports {library}: the rule checks nothing"
    assert [m for m in users if not any(_in(m, a) for a in allowed)] == []


@pytest.mark.parametrize("top_level_only", [True, False], ids=["module level", "inside functions too"])
def test_no_import_cycle(top_level_only: bool) -> None:
    """No module imports, even inside a function or for type checking only, one that imports it
    back: a function-level import hides a cycle from Python, not from a reader."""
    graph = {m: {n for n in _imports(m, top_level_only=top_level_only) if n in SOURCES and n != m} for m in SOURCES}
    # A package's __init__ importing its own submodules is how re-exports work, not a cycle.
    for m, targets in graph.items():
        graph[m] = {n for n in targets if not (SOURCES[m].name == "__init__.py" and _in(n, m))}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def dfs(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                dfs(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            dfs(module)
    assert cycles == []


# The engine-neutral build path: the engines plug in through indexer.engines.
ENGINE_NEUTRAL = ("indexer.build", "indexer.build_base", "indexer.embed", "indexer.stats", "indexer.commit", "indexer.new_generation",
                  "indexer.engine", "indexer.engines")
RAY_ROOMS = ("indexer.ray_engine", "indexer.ray_cluster", "indexer.ray_actor", "indexer.ray_parts", "ray")


@pytest.mark.parametrize("module", ENGINE_NEUTRAL)
def test_the_build_path_names_no_engine(module: str) -> None:
    # engines.py names Ray's module once, inside the function that opens it (imported on demand).
    imported = _imports(module, top_level_only=module == "indexer.engines")
    assert sorted(n for n in imported if any(_in(n, r) for r in RAY_ROOMS)) == []


def test_the_engines_are_the_options_engines() -> None:
    from indexer.build_config import ENGINES as NAMES
    from indexer.engines import ENGINES, LOADS_ITS_OWN_MODEL

    assert tuple(ENGINES) == NAMES and LOADS_ITS_OWN_MODEL <= set(ENGINES)


def _first_line(module: str) -> str:
    doc = ast.get_docstring(ast.parse(SOURCES[module].read_text(encoding="utf-8"))) or ""
    return doc.strip().split("\n\n")[0]


def test_modules_share_a_file_name_only_as_one_idea_in_two_layers() -> None:
    """Two modules with one file name must be the same idea in two layers (a command and the code
    it calls, the build's side and the query's), and say so: each one's first paragraph names
    another of them by its dotted path."""
    by_name: dict[str, list[str]] = {}
    for module, path in SOURCES.items():
        if path.name not in ("__init__.py", "__main__.py"):
            by_name.setdefault(path.name, []).append(module)
    unsaid = sorted(
        f"{module} ({name})"
        for name, modules in by_name.items()
        if len(modules) > 1
        for module in modules
        if not any(other in _first_line(module) for other in modules if other != module)
    )
    assert unsaid == []


# The stage-neutral build path: the side stages plug in through indexer.sides.registry.
STAGE_NEUTRAL = ("indexer.build", "indexer.build_base", "indexer.embed", "indexer.stats", "indexer.commit", "indexer.new_generation")
STAGE_ROOMS = ("indexer.ocr", "indexer.backfill", "indexer.keywords", "indexer.faces", "retrieval.keywords", "retrieval.faces")


def _stage_words(source: str) -> list[str]:
    """The identifiers of ``source`` that name OCR or faces (snake_case and CamelCase parts
    starting with either word: ``ocr_of``, ``FaceStats``, ``with_ocr_text``; not ``interface``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.update(part for part in (node.name, node.asname) if part)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return sorted(
        name for name in names
        if any(part.startswith(("ocr", "face")) for part in re.split(r"[._]", re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()))
    )


@pytest.mark.parametrize("module", STAGE_NEUTRAL)
def test_the_build_path_names_no_side_stage(module: str) -> None:
    imported = _all_imports(module)
    assert sorted(n for n in imported if any(_in(n, r) for r in STAGE_ROOMS)) == []
    assert _stage_words(SOURCES[module].read_text(encoding="utf-8")) == []


def test_the_stage_check_catches_a_stage_name() -> None:
    # Lines of the build path before the side stages plugged in, which the check above refuses.
    old = "from .faces import stage as faces_stage\nx = ocr_of(cfg)\ny: FaceStats\nwriter.meta.ocr\nf(with_ocr_text=1)\n"
    assert _stage_words(old) == ["FaceStats", "faces", "faces_stage", "ocr", "ocr_of", "with_ocr_text"]
    assert _stage_words("interface = surface(x)\nfaced = 1\n") == ["faced"]  # parts start with the word
