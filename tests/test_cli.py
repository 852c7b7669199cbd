"""End-to-end: the real ``clipsearch`` console script in subprocesses."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli
from helpers import assert_one_line_error
from imagegen import Collection, photo_like

from retrieval import ImageIndex
from retrieval.layout import FORMAT_VERSION, MANIFEST_DIGEST_KEY, format_version_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cli_index(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, collection: Collection) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("cli") / "photos.idx"
    proc = run_cli(
        ["index", collection.root, out, "--model", tiny_model, "--batch-size", "4", "--workers", "1", "--device", "cpu", "--json"]
    )
    assert proc.returncode == 0, proc.stderr
    return out, json.loads(proc.stdout)


def test_index_json_summary(cli_index, collection: Collection) -> None:
    _, summary = cli_index
    assert summary["indexed"] == len(collection.good) + len(collection.file_symlinks)
    assert summary["skipped"] == len(collection.broken)
    assert summary["seconds"] > 0 and summary["images_per_second"] > 0
    assert summary["dim"] == 48


def test_index_human_summary_and_progress(tmp_path: Path, tiny_model: Path) -> None:
    photos = tmp_path / "p"
    photos.mkdir()
    for i in range(5):
        photo_like(90, 70, i).save(photos / f"{i}.jpg")
    (photos / "bad.jpg").write_bytes(b"")
    proc = run_cli(["index", photos, tmp_path / "idx", "--model", tiny_model, "--workers", "0"])
    assert proc.returncode == 0, proc.stderr
    assert "indexed 5 images, skipped 1" in proc.stdout and "images/s" in proc.stdout
    assert "indexing" in proc.stderr  # the tqdm bar
    assert "LOAD REPORT" not in proc.stderr and "Loading weights" not in proc.stderr


def test_search_json(cli_index) -> None:
    out, summary = cli_index
    proc = run_cli(["search", out, "a dog on a beach", "-k", "5", "--json", "--device", "cpu"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == ""  # no load reports or warnings for users
    results = json.loads(proc.stdout)["results"]
    assert len(results) == 5
    assert all(set(r) == {"id", "path", "score", "taken", "camera", "gps", "matched", "ocr_text", "keyword", "fused"} for r in results)
    api = ImageIndex.open(out, device="cpu").search("a dog on a beach", k=5)
    assert [r["id"] for r in results] == [h.id for h in api]
    # The default mode fuses the words ("dog", "beach") found in file names with the vector
    # ranking; --mode vector is the cosine order alone.
    assert any(r["matched"] for r in results)
    proc = run_cli(["search", out, "a dog on a beach", "-k", "5", "--json", "--device", "cpu", "--mode", "vector"])
    scores = [r["score"] for r in json.loads(proc.stdout)["results"]]
    assert scores == sorted(scores, reverse=True)
    assert [r["path"] for r in results] == [h.path for h in api]


def test_search_human(cli_index) -> None:
    out, _ = cli_index
    proc = run_cli(["search", out, "sunset", "-k", "3"])
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip().splitlines()) == 3


def test_search_by_image(cli_index, collection: Collection) -> None:
    out, _ = cli_index
    proc = run_cli(["search", out, "--image", collection.root / "formats" / "rgba.png", "-k", "2", "--json"])
    assert proc.returncode == 0, proc.stderr
    top = json.loads(proc.stdout)["results"][0]
    assert top["path"] == "formats/rgba.png" and top["score"] == pytest.approx(1.0, abs=1e-5)


def test_info(cli_index, tiny_model: Path, collection: Collection) -> None:
    out, summary = cli_index
    proc = run_cli(["info", out, "--json"])
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["model"] == str(tiny_model.resolve())
    assert (info["dim"], info["count"], info["skipped"]) == (48, summary["indexed"], summary["skipped"])
    assert info["format_version"] == format_version_for(info["index_type"]) == 2  # version 3 only for a re-ranked FAISS file
    assert {s["path"] for s in info["skipped_files"]} == set(collection.broken)
    human = run_cli(["info", out])
    assert human.returncode == 0
    for path in collection.broken:
        assert path in human.stdout


def test_non_utf8_name_round_trip(cli_index) -> None:
    out, _ = cli_index
    proc = run_cli(["search", out, "x", "-k", "1000", "--json"])
    paths = [r["path"] for r in json.loads(proc.stdout)["results"]]
    assert "intl/latin1_caf\\xe9.jpg" in paths and "intl/日本語 café.png" in paths


def test_bad_photos_dir(tmp_path: Path, tiny_model: Path) -> None:
    proc = run_cli(["index", tmp_path / "missing", tmp_path / "idx", "--model", tiny_model])
    assert_one_line_error(proc.returncode, proc.stderr, "does not exist")
    (tmp_path / "empty").mkdir()
    proc = run_cli(["index", tmp_path / "empty", tmp_path / "idx", "--model", tiny_model])
    assert_one_line_error(proc.returncode, proc.stderr, "no images")
    assert not (tmp_path / "idx").exists()


def test_model_not_available_offline(tmp_path: Path, collection: Collection) -> None:
    proc = run_cli(["index", collection.root, tmp_path / "idx", "--model", "openai/clip-vit-base-patch32"])
    assert_one_line_error(proc.returncode, proc.stderr, "local checkpoint directory")
    assert not (tmp_path / "idx").exists()


def test_not_an_index(tmp_path: Path) -> None:
    proc = run_cli(["search", tmp_path, "cat"])
    assert_one_line_error(proc.returncode, proc.stderr, "not a clipsearch index")
    proc = run_cli(["info", tmp_path / "nope"])
    assert_one_line_error(proc.returncode, proc.stderr, "not a clipsearch index")


def test_newer_format_version(cli_index, tmp_path: Path) -> None:
    out, _ = cli_index
    copy = tmp_path / "copy.idx"
    shutil.copytree(out, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["format_version"] = FORMAT_VERSION + 1
    manifest.pop(MANIFEST_DIGEST_KEY)  # hand-edited: a stale digest would be reported as damage first
    (copy / "manifest.json").write_text(json.dumps(manifest))
    proc = run_cli(["info", copy])
    assert_one_line_error(proc.returncode, proc.stderr, "newer", "upgrade")
    proc = run_cli(["search", copy, "cat"])
    assert_one_line_error(proc.returncode, proc.stderr, "newer")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["   "], "empty"),
        (["cat", "-k", "0"], "-k"),
        (["cat", "-k", "two"], "-k"),
        ([], "--image"),
        (["cat", "--image", "x.jpg"], "not both"),
    ],
)
def test_bad_query_arguments(cli_index, args: list[str], needle: str) -> None:
    out, _ = cli_index
    proc = run_cli(["search", out, *args])
    # argparse reports a bad -k itself: exit 2, "clipsearch search: error: ..."
    assert_one_line_error(proc.returncode, proc.stderr, needle, codes=(1, 2), prefix="clipsearch")


def test_undecodable_query_image(cli_index, collection: Collection, tmp_path: Path) -> None:
    out, _ = cli_index
    proc = run_cli(["search", out, "--image", collection.root / "broken" / "truncated.jpg"])
    assert_one_line_error(proc.returncode, proc.stderr, "cannot decode")
    proc = run_cli(["search", out, "--image", tmp_path / "missing.jpg"])
    assert_one_line_error(proc.returncode, proc.stderr, "not found")


def test_model_mismatch_names_both(cli_index, tiny_model: Path, other_model: Path) -> None:
    out, _ = cli_index
    proc = run_cli(["search", out, "cat", "--model", other_model])
    assert_one_line_error(proc.returncode, proc.stderr, "mismatch", str(tiny_model.resolve()), str(other_model.resolve()))


def test_refuses_non_index_output_dir(tmp_path: Path, tiny_model: Path, collection: Collection) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("keep")
    proc = run_cli(["index", collection.root, tmp_path / "out", "--model", tiny_model])
    assert_one_line_error(proc.returncode, proc.stderr, "refusing")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


def test_index_files_from_list(tmp_path: Path, tiny_model: Path, collection: Collection) -> None:
    listing = tmp_path / "list.txt"
    listing.write_bytes(b"# the split\nphotos/a.jpg\nformats/rgba.png\n\nmissing.jpg\n")
    out = tmp_path / "idx"
    proc = run_cli(["index", collection.root, out, "--model", tiny_model, "--files-from", listing, "--workers", "0", "--json"])
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["indexed"], summary["skipped"]) == (2, 1)
    info = json.loads(run_cli(["info", out, "--json"]).stdout)
    assert info["skipped_files"] == [{"path": "missing.jpg", "reason": "file not found"}]
    proc = run_cli(["index", collection.root, tmp_path / "x", "--model", tiny_model, "--files-from", tmp_path / "nolist"])
    assert_one_line_error(proc.returncode, proc.stderr, "--files-from")


def test_update_summary_and_model_errors(tmp_path: Path, tiny_model: Path, other_model: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The update's summary from the console script; the other model's refusal and --rebuild
    through the same CLI code in this process (the lock's one-line refusal from a second
    process: test_crash)."""
    from clipsearch.cli import main

    photos = tmp_path / "p"
    photos.mkdir()
    for i in range(3):
        photo_like(90, 70, i).save(photos / f"{i}.jpg")
    out = tmp_path / "idx"
    assert run_cli(["index", photos, out, "--model", tiny_model, "--workers", "0"]).returncode == 0
    (photos / "0.jpg").unlink()
    photo_like(90, 70, 9).save(photos / "9.jpg")
    proc = run_cli(["index", photos, out, "--model", tiny_model, "--workers", "0", "--json"])
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert {k: summary[k] for k in ("added", "updated", "removed", "unchanged", "skipped", "total")} == {
        "added": 1, "updated": 0, "removed": 1, "unchanged": 2, "skipped": 0, "total": 3
    }
    assert summary["seconds"] > 0
    code = main(["index", str(photos), str(out), "--model", str(other_model)])
    assert_one_line_error(code, capsys.readouterr().err, "--rebuild", str(tiny_model.resolve()), str(other_model.resolve()))
    assert main(["index", str(photos), str(out), "--model", str(other_model), "--rebuild", "--workers", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["added"] == 3


def test_index_without_model_keeps_the_index_model(tmp_path: Path, tiny_model: Path, other_model: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """An update and a --rebuild without --model use the model the index records (the summary
    names it on stderr); --model naming another is still refused on update, obeyed with --rebuild."""
    from clipsearch.cli import main

    photos = tmp_path / "p"
    photos.mkdir()
    for i in range(3):
        photo_like(90, 70, i).save(photos / f"{i}.jpg")
    out = tmp_path / "idx"
    assert main(["index", str(photos), str(out), "--model", str(tiny_model), "--workers", "0", "--no-progress"]) == 0
    capsys.readouterr()
    photo_like(90, 70, 9).save(photos / "9.jpg")
    assert main(["index", str(photos), str(out), "--workers", "0", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "(added 1, updated 0, removed 0, unchanged 3)" in captured.out
    assert f"clipsearch: model: {tiny_model.resolve()}, the one the index records" in captured.err
    assert main(["index", str(photos), str(out), "--workers", "0", "--rebuild", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["model"], summary["added"]) == (str(tiny_model.resolve()), 4)
    code = main(["index", str(photos), str(out), "--model", str(other_model), "--no-progress"])
    assert_one_line_error(code, capsys.readouterr().err, "--rebuild", str(tiny_model.resolve()), str(other_model.resolve()))
    assert main(["index", str(photos), str(out), "--model", str(other_model), "--rebuild", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == str(other_model.resolve())
    assert ImageIndex.open(out).manifest.model == str(other_model.resolve())
    code = main(["index", str(photos), str(out), "--model", "", "--no-progress"])
    assert_one_line_error(code, capsys.readouterr().err, "model must be a non-empty name or path")


# -- one front door: the console script and python -m clipsearch are the same program ------------


def _python_m(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "default", "COLUMNS": "100"}
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["search", "--help"], ["no-such-command"]])
def test_python_m_clipsearch_is_the_console_script(args: list[str]) -> None:
    script = run_cli(args, env={"COLUMNS": "100"})
    module = _python_m("clipsearch", *args)
    assert (module.returncode, module.stdout, module.stderr) == (script.returncode, script.stdout, script.stderr)
    assert script.returncode == (2 if args == ["no-such-command"] else 0), script.stderr


def test_every_command_is_listed_in_help_order() -> None:
    from clipsearch.cli import (
        COMMANDS,
        build,
        classify,
        duplicates,
        eval_zeroshot,
        evaluate,
        finetune,
        import_,
        info,
        people,
        reindex,
        search,
        serve,
        shard,
        verify,
    )

    proc = run_cli(["no-such-command"])
    listed = (
        "'index', 'reindex', 'shard', 'import', 'finetune', 'search', 'classify', 'duplicates', 'people', 'info', 'verify', 'eval', "
        "'eval-zeroshot', 'serve'"
    )
    assert f"(choose from {listed})" in proc.stderr
    assert COMMANDS == (
        build, reindex, shard, import_, finetune, search, classify, duplicates, people, info, verify, evaluate, eval_zeroshot, serve
    )


@pytest.mark.parametrize("package", ["retrieval", "indexer"])
def test_the_wings_have_no_command_line_of_their_own(package: str) -> None:
    proc = _python_m(package, "--help")
    assert proc.returncode != 0
    assert "cannot be directly executed" in proc.stderr, proc.stderr
    assert importlib.util.find_spec(f"{package}.cli") is None
