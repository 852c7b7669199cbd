"""Zero-shot classification: parity with Hugging Face's zero-shot pipeline, the ensemble recipe,
an index's stored vectors in batches and under filters, Parquet output, ImageFolder metrics,
and the CLI's bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import cli_here
from imagegen import photo_like
from PIL import Image

from retrieval.encoders import HFClipEncoder
from retrieval.errors import InvalidArgumentError
from retrieval.filters import Filter
from retrieval.index import ImageIndex
from retrieval.tools.zeroshot import (
    OPENAI_TEMPLATES,
    SIMPLE_TEMPLATES,
    ImageFolder,
    ZeroShotClassifier,
    check_labels,
    classify_files,
    classify_index,
    ensemble,
    evaluate_folder,
    resolve_templates,
    write_predictions,
    zero_shot_metrics,
)

LABELS = ["a dog", "a cat", "a red car", "the sea", "a banana"]


@pytest.fixture(scope="module")
def encoder(tiny_model: Path) -> HFClipEncoder:
    return HFClipEncoder.load(str(tiny_model), device="cpu")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("zs_images")
    out = []
    for i in range(4):
        path = root / f"img{i}.jpg"
        photo_like(90 + 7 * i, 70 + 5 * i, seed=40 + i).save(path, quality=92)
        out.append(path)
    return out


def test_template_sets_are_open_clips() -> None:
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES, SIMPLE_IMAGENET_TEMPLATES

    assert [t.format("x y") for t in OPENAI_TEMPLATES] == [t("x y") for t in OPENAI_IMAGENET_TEMPLATES]
    assert [t.format("x y") for t in SIMPLE_TEMPLATES] == [t("x y") for t in SIMPLE_IMAGENET_TEMPLATES]
    assert len(OPENAI_TEMPLATES) == 80 and len(SIMPLE_TEMPLATES) == 7


def test_labels_and_templates_are_checked(tmp_path: Path) -> None:
    assert check_labels([" a ", "b"]) == ["a", "b"]
    for labels, message in [([], "no labels"), (["a", ""], "empty"), (["a", "b", "a "], "given twice")]:
        with pytest.raises(InvalidArgumentError, match=message):
            check_labels(labels)
    assert resolve_templates() == ("a photo of a {}.",)
    assert resolve_templates("art of {}") == ("art of {}",)
    assert resolve_templates(templates="simple") == SIMPLE_TEMPLATES
    file = tmp_path / "t.txt"
    file.write_text("# mine\na {} here\n\nanother {}\n")
    assert resolve_templates(templates=file) == ("a {} here", "another {}")
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n\n")
    for kwargs, message in [
        ({"template": "no braces"}, "has no {}"),
        ({"template": "{} and {0}"}, "not a format string"),
        ({"template": "{}", "templates": "openai"}, "not both"),
        ({"templates": "imagenet"}, "none of them"),
        ({"templates": empty}, "has no templates"),
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            resolve_templates(**kwargs)  # type: ignore[arg-type]


def test_probabilities_equal_the_hugging_face_pipeline(encoder: HFClipEncoder, images: list[Path], tiny_model: Path) -> None:
    from transformers import pipeline

    template = "a photo of {}."
    pipe = pipeline("zero-shot-image-classification", model=str(tiny_model), device="cpu")
    classifier = ZeroShotClassifier.build(encoder, LABELS, [template])
    ours = [p for batch in classify_files(encoder, images, classifier, batch_size=3) for p in batch]
    assert [p.path for p in ours] == [str(i) for i in images]
    for path, prediction in zip(images, ours, strict=True):
        with Image.open(path) as im:
            reference = pipe(im.convert("RGB"), candidate_labels=LABELS, hypothesis_template=template)
        expected = {r["label"]: r["score"] for r in reference}
        got = dict(zip(LABELS, prediction.scores.tolist(), strict=True))
        assert got == pytest.approx(expected, abs=1e-4)
        assert prediction.scores.sum() == pytest.approx(1.0, abs=1e-5)
    scale, bias = encoder.logit_params()
    assert bias is None and scale == pytest.approx(float(pipe.model.logit_scale.detach().exp()), rel=1e-6)


def test_ensemble_is_the_mean_of_normalised_prompts_renormalised(encoder: HFClipEncoder) -> None:
    templates = SIMPLE_TEMPLATES[:3]
    classifier = ZeroShotClassifier.build(encoder, LABELS[:2], templates)
    for label, row in zip(LABELS[:2], classifier.weights, strict=True):
        prompts = encoder.embed_texts([t.format(label) for t in templates]).astype(np.float64)
        mean = (prompts / np.linalg.norm(prompts, axis=1, keepdims=True)).mean(axis=0)
        assert np.allclose(row, mean / np.linalg.norm(mean), atol=1e-6)
    assert np.allclose(ensemble(np.ones((2, 3, 4)) * [[[1], [2], [3]]]), 0.5)


def test_sigmoid_scores_with_a_logit_bias() -> None:
    weights = np.eye(3, dtype=np.float32)[:2]
    clf = ZeroShotClassifier(("a", "b"), ("{}",), weights, scale=10.0, bias=-5.0)
    scores = clf.scores(np.array([[1.0, 0.0, 0.0]], np.float32))
    assert clf.multi_label and np.allclose(scores, 1 / (1 + np.exp(-np.array([[10.0 - 5.0, -5.0]]))), atol=1e-6)
    with pytest.raises(InvalidArgumentError, match="shape"):
        clf.scores(np.ones((1, 4), np.float32))


def test_an_index_is_classified_from_its_stored_vectors_in_batches(built_index: Path, tmp_path: Path) -> None:
    index = ImageIndex.open(built_index, device="cpu")
    classifier = ZeroShotClassifier.build(index.encoders.encoder, LABELS, ["a photo of a {}."])
    expected = classifier.scores(index.vectors.embeddings())
    batches = list(classify_index(index, classifier, batch_rows=4))
    assert len(batches) == -(-index.count // 4)
    flat = [p for b in batches for p in b]
    assert [p.id for p in flat] == list(range(index.count))
    assert [p.path for p in flat] == index.metadata.paths()
    assert np.allclose(np.stack([p.scores for p in flat]), expected, atol=1e-6)

    where = Filter(path_glob="*.png")
    kept = [p for b in classify_index(index, classifier, where=where, batch_rows=3) for p in b]
    assert [p.id for p in kept] == np.flatnonzero(index.metadata.mask(where)).tolist()

    out = tmp_path / "pred.parquet"
    assert write_predictions(out, LABELS, classify_index(index, classifier, batch_rows=5)) == index.count
    table = pq.read_table(out)
    assert table.column_names == ["id", "path", "label", "score", "scores"]
    assert table.column("id").to_pylist() == list(range(index.count))
    assert table.column("label").to_pylist() == [LABELS[j] for j in expected.argmax(axis=1)]
    assert np.allclose(np.asarray(table.column("scores").to_pylist()), expected, atol=1e-6)
    assert table.schema.metadata[b"labels"].decode().split("\n") == LABELS


def test_zero_shot_metrics_follow_clip_benchmark() -> None:
    scores = np.array(
        [[0.9, 0.1, 0.0, 0.0, 0.0, 0.0], [0.2, 0.7, 0.1, 0, 0, 0], [0.5, 0.4, 0.1, 0, 0, 0], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]]
    )
    targets = np.array([0, 1, 1, 0])
    acc1, acc5, recall = zero_shot_metrics(scores, targets, 6)
    assert acc1 == 0.5  # rows 0 and 1
    assert acc5 == 0.75  # row 3's class 0 ranks 6th
    assert recall == pytest.approx((1 / 2 + 1 / 2) / 2)
    assert zero_shot_metrics(scores[:, :4], targets, 4)[1] is None
    with pytest.raises(InvalidArgumentError):
        zero_shot_metrics(scores, targets[:2], 6)


def _folder(root: Path) -> Path:
    for c, name in enumerate(["red_things", "blue-things", "green"]):
        sub = root / name / "nested"
        sub.mkdir(parents=True)
        for i in range(3):
            photo_like(80, 64, seed=100 + 10 * c + i).save(sub / f"{i}.png")
    (root / "green" / "broken.jpg").write_bytes(b"\xff\xd8 broken")
    (root / "green" / "notes.txt").write_text("not an image")
    return root


def test_evaluate_folder(encoder: HFClipEncoder, tmp_path: Path) -> None:
    folder = ImageFolder.scan(_folder(tmp_path / "set"))
    assert folder.folders == ("blue-things", "green", "red_things")
    assert folder.labels == ("blue things", "green", "red things")
    assert len(folder.samples) == 10
    report = evaluate_folder(encoder, folder, ("a photo of {}.",), batch_size=4)
    classifier = ZeroShotClassifier.build(encoder, folder.labels, ("a photo of {}.",))
    good = [(p, c) for p, c in folder.samples if p.suffix == ".png"]
    scores = np.concatenate([np.stack([x.scores for x in b]) for b in classify_files(encoder, [p for p, _ in good], classifier)])
    acc1, _, recall = zero_shot_metrics(scores, np.array([c for _, c in good]), 3)
    assert (report.images, report.skipped, report.classes) == (9, 1, 3)
    assert report.acc1 == pytest.approx(acc1) and report.mean_per_class_recall == pytest.approx(recall)
    assert report.acc5 is None and "acc5" not in report.to_dict() and report.chance == pytest.approx(1 / 3)
    with pytest.raises(InvalidArgumentError, match="at least two class folders"):
        ImageFolder.scan(tmp_path / "set" / "green")
    (tmp_path / "set" / "empty_class").mkdir()
    with pytest.raises(InvalidArgumentError, match="has no images"):
        ImageFolder.scan(tmp_path / "set")


@pytest.mark.slow
def test_cli_classify_and_eval_zeroshot(
    built_index: Path, tiny_model: Path, images: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index = ImageIndex.open(built_index, device="cpu")
    classifier = ZeroShotClassifier.build(index.encoders.encoder, LABELS, ["a photo of a {}."])
    expected = classifier.scores(index.vectors.embeddings())
    args = ["classify", built_index, *(a for label in LABELS for a in ("--label", label)), "--top-k", "2", "--json"]
    out = cli_here(args)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["labels"] == LABELS and len(doc["results"]) == index.count
    first = doc["results"][0]
    assert first["id"] == 0 and first["path"] == index.metadata.paths()[0] and len(first["labels"]) == 2
    assert first["labels"][0]["label"] == LABELS[int(expected[0].argmax())]
    assert first["labels"][0]["score"] == pytest.approx(float(expected[0].max()), abs=1e-6)

    labels_file = tmp_path / "labels.txt"
    labels_file.write_text("\n".join(LABELS) + "\n")
    # The rest in this process (the console script's own main): no torch start-up per command.
    from clipsearch.cli import main

    def in_process(*args: object) -> str:
        capsys.readouterr()
        assert main([str(a) for a in args]) == 0
        return capsys.readouterr().out

    out_text = in_process("classify", built_index, "--labels", labels_file, "--path-glob", "*.png", "--out", tmp_path / "p.parquet")
    assert pq.read_table(tmp_path / "p.parquet").num_rows == int(index.metadata.mask(Filter(path_glob="*.png")).sum())
    assert out_text.startswith("classified ")

    doc = json.loads(in_process("classify", "--model", tiny_model, *images[:2], "--label", "x", "--label", "y", "--json"))
    assert [r["path"] for r in doc["results"]] == [str(p) for p in images[:2]]

    folder = _folder(tmp_path / "folder")
    report = json.loads(in_process("eval-zeroshot", "--model", tiny_model, folder, "--json", "--device", "cpu"))
    assert report["images"] == 9 and report["classes"] == 3 and "acc5" not in report and 0 <= report["acc1"] <= 1

    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    for bad, message in [
        (["classify", built_index], "no labels"),
        (["classify", built_index, "--label", "a", "--label", "a"], "given twice"),
        (["classify", built_index, "--label", "a", "--template", "a photo"], "has no {}"),
        (["classify", built_index, "--labels", empty], "has no labels"),
        (["classify", images[0], "--label", "a"], "is not an index"),
        (["classify", "--model", tiny_model, images[0], "--label", "a", "--path-prefix", "x"], "filters apply to an index"),
        (["eval-zeroshot", "--model", tiny_model, tmp_path / "nope"], "is not a folder"),
        (["eval-zeroshot", "--model", tiny_model, folder, "--templates", "nonsense"], "none of them"),
    ]:
        # In this process (the same main as the console script): no torch start-up per case.
        capsys.readouterr()
        assert main([str(a) for a in bad]) == 1, bad
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("clipsearch: error:") and message in err, err
