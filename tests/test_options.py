"""Options declared once: BuildConfig's, Filter's and SearchParams' fields are the CLI flags, the
HTTP fields and the docs tables; a field added to any of them shows up in all of them."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from clipsearch.cli import build_parser
from clipsearch.cli._common import filter_from_args
from clipsearch.cli.options import values_from_args
from clipsearch.reference import tables
from clipsearch.search_params import SearchParams
from indexer.build_config import BuildConfig
from indexer.watch_config import WatchConfig
from retrieval.errors import InvalidArgumentError
from retrieval.filters import Filter, parse_time
from retrieval.options import flag_of, option_of

ROOT = Path(__file__).resolve().parent.parent
# Settings a Python caller may change that no CLI user needs.
PYTHON_ONLY = {"max_pixels", "draft", "commit_seconds"}
# Search parameters the CLI has no flag for.
SERVER_ONLY = {"offset", "index"}


def _help(*command: str) -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[command[0]].format_help()  # type: ignore[index]  # the sub-parsers action maps names to parsers


def test_every_field_is_in_its_table_and_its_help() -> None:
    made = tables()
    for name, cls, command in (("build", BuildConfig, "index"), ("filters", Filter, "search"), ("search", SearchParams, "search"),
                               ("watch", WatchConfig, "index")):
        text = _help(command)
        for f in dataclasses.fields(cls):
            assert f"| `{f.name}` |" in made[name], f.name
            if option_of(f).cli:
                assert flag_of(f) in text, f.name
        assert made[name].count("\n") == len(dataclasses.fields(cls)) + 2
    assert {f.name for f in dataclasses.fields(BuildConfig) if not option_of(f).cli} == PYTHON_ONLY
    assert all(option_of(f).cli and option_of(f).http for f in dataclasses.fields(Filter))
    # Every search parameter is a request field; offset and index only mean something to a server.
    assert all(option_of(f).http for f in dataclasses.fields(SearchParams))
    assert {f.name for f in dataclasses.fields(SearchParams) if not option_of(f).cli} == SERVER_ONLY
    assert "-k K, --k K" in _help("search") and "| `-k`, `--k` |" in made["search"]


def test_index_flags_make_the_config() -> None:
    parse = build_parser().parse_args
    assert BuildConfig(**values_from_args(BuildConfig, parse(["index", "p", "i"]))) == BuildConfig(progress=True)
    args = parse(
        ["index", "p", "i", "--batch-size", "8", "--workers", "0", "--no-progress", "--rebuild", "--max-memory", "1GB",
         "--target-recall", "0.9", "--index-type", "flat", "--precision", "fp32", "--image-size", "336"]
    )
    assert BuildConfig(**values_from_args(BuildConfig, args)) == BuildConfig(
        batch_size=8, workers=0, rebuild=True, max_memory=2**30, target_recall=0.9, index_type="flat", precision="fp32",
        image_size=336,
    )
    ray = parse(["index", "p", "i", "--engine", "ray", "--actors", "2", "--gpus-per-actor", "0.5", "--cpus-per-actor", "3"])
    config = BuildConfig(**values_from_args(BuildConfig, ray))
    assert (config.engine, config.actors, config.gpus_per_actor, config.cpus_per_actor) == ("ray", 2, 0.5, 3.0)


def test_reindex_and_import_share_the_faiss_flags() -> None:
    for command in ("reindex", "import"):
        text = _help(command)
        assert all(flag in text for flag in ("--index-type", "--max-memory", "--target-recall")), command
        assert "--batch-size" not in text


def test_filter_flags_make_the_filter() -> None:
    parse = build_parser().parse_args
    assert filter_from_args(parse(["search", "i", "q"])) == Filter()
    args = parse(
        ["search", "i", "q", "--path-prefix", "a/", "--path-prefix", "b/", "--path-glob", "*.jpg", "--min-width", "10",
         "--max-height", "20", "--modified-after", "2024-05-01", "--modified-before", ""]
    )
    assert filter_from_args(args) == Filter(
        path_prefix=("a/", "b/"), path_glob="*.jpg", min_width=10, max_height=20, modified_after=parse_time("2024-05-01")
    )
    with pytest.raises(InvalidArgumentError, match="cannot read time"):
        filter_from_args(parse(["search", "i", "q", "--modified-after", "May"]))


def test_server_shapes_take_every_filter() -> None:
    pytest.importorskip("fastapi")
    from fastapi import FastAPI

    from clipsearch.server.api import api_router
    from clipsearch.server.filters import make_filter
    from clipsearch.server.search import Filters, SearchForm

    names = [f.name for f in dataclasses.fields(Filter)]
    assert list(Filters.model_fields) == names
    assert set(names) <= set(SearchForm.model_fields)
    app = FastAPI()
    app.include_router(api_router())
    params = {p["name"] for p in app.openapi()["paths"]["/api/search"]["get"]["parameters"]}
    assert set(names) <= params
    got = make_filter(path_prefix="a/", path_glob="", min_width=3, modified_before="2024-01-01", modified_after=None)
    assert got == Filter(path_prefix=("a/",), min_width=3, modified_before=parse_time("2024-01-01"))
    with pytest.raises(TypeError, match="not filters: colour"):
        make_filter(colour="red")


def test_search_flags_read_back() -> None:
    parse = build_parser().parse_args
    names = [f.name for f in dataclasses.fields(SearchParams) if option_of(f).cli]
    # No -k on the CLI: 10 results, or every one at or above --min-score (the library decides).
    assert values_from_args(SearchParams, parse(["search", "i", "q"]), names) == {
        "k": None, "min_score": None, "sort": "score", "mode": None, "query_lang": None, "add": (), "subtract": ()
    }
    args = parse(["search", "i", "q", "-k", "3", "--add", "a", "--add", "0.5:b", "--subtract", "c", "--min-score", "0.25",
                  "--sort", "taken", "--mode", "keyword"])
    assert values_from_args(SearchParams, args, names) == {
        "k": 3, "min_score": 0.25, "sort": "taken", "mode": "keyword", "query_lang": None, "add": ("a", "0.5:b"),
        "subtract": ("c",)
    }
    assert parse(["search", "i", "q", "--k", "1001"]).k == 1001  # the server's bound is the server's


def test_server_shapes_take_every_search_parameter() -> None:
    pytest.importorskip("fastapi")
    from fastapi import FastAPI

    from clipsearch.server.api import api_router
    from clipsearch.server.search import SearchBody, SearchForm

    names = [f.name for f in dataclasses.fields(SearchParams)]
    assert set(names) <= set(SearchBody.model_fields) and set(names) <= set(SearchForm.model_fields)
    app = FastAPI()
    app.include_router(api_router())
    params = {p["name"]: p for p in app.openapi()["paths"]["/api/search"]["get"]["parameters"]}
    assert set(names) <= set(params)
    for f in dataclasses.fields(SearchParams):
        assert params[f.name]["description"] == option_of(f).help, f.name
    k = params["k"]["schema"]
    assert (k["minimum"], k["maximum"], k["default"]) == (1, 1000, 10)
    from pydantic import ValidationError

    # The bodies check the declared bounds (a 422), GET's add and subtract are counted by the search (a 400).
    for model, base in ((SearchBody, {"text": "x"}), (SearchForm, {})):
        assert model.model_validate(base).k == 10  # type: ignore[attr-defined]  # a field derived from SearchParams
        for bad in ({"k": 0}, {"k": 1001}, {"offset": 10_001}, {"add": ["a"] * 17}):
            with pytest.raises(ValidationError):
                model.model_validate({**base, **bad})
    assert "maxItems" not in str(params["add"])


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_hook_puts_the_tables_in() -> None:
    hooks = _hooks()
    page = "# CLI\n\n<!-- options:build -->\n\ntext\n\n<!-- options:filters -->\n\n<!-- options:search -->\n"
    page += "\n<!-- options:watch -->\n"
    out = hooks.on_page_markdown(page, page=None, config={}, files=None)
    assert "<!--" not in out and all(table in out for table in tables().values())
    assert hooks.on_page_markdown("no markers", page=None, config={}, files=None) == "no markers"
    with pytest.raises(KeyError, match="no options table 'colours'"):
        hooks.on_page_markdown("<!-- options:colours -->", page=None, config={}, files=None)
