"""clipsearch finetune: contrastive training, checkpoints that resume, the HF checkpoint it writes,
bad input, and the demo model committed under data/models."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_here
from helpers import assert_one_line_error, model_weights
from imagegen import photo_like, write_caption_pairs

from clipsearch.cli import main as cli_main
from indexer.training.augment import AugmentConfig
from indexer.training.contrastive import PairBatch, forward_backward, positive_mask
from indexer.training.finetune import FinetuneConfig, finetune, lr_factor
from indexer.training.pairs import caption_groups, load_pairs
from retrieval.errors import FinetuneError, InvalidArgumentError, PairsFileError

REPO = Path(__file__).resolve().parents[1]
DEMO_MODEL = REPO / "data" / "models" / "demo-clip"
CAPTIONS = [
    "a red square", "a blue circle", "a green field", "a yellow sun",
    "a purple flower", "an orange car", "a grey cat", "a white star",
]  # fmt: skip


@pytest.fixture(scope="module")
def pairs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 generated images and a pairs file naming them (``pairs.jsonl``, paths relative to it)."""
    return write_caption_pairs(tmp_path_factory.mktemp("pairs"), CAPTIONS).parent


def _config(tiny_model: Path, pairs_dir: Path, out: Path, **kw: object) -> FinetuneConfig:
    options: dict[str, object] = {
        "data": str(pairs_dir / "pairs.jsonl"),
        "out": str(out),
        "model": str(tiny_model),
        "epochs": 4,
        "lr": 1e-3,
        "batch_size": 4,
        "warmup_steps": 0,
        "device": "cpu",
        "seed": 0,
    }
    options.update(kw)
    return FinetuneConfig(**options)  # type: ignore[arg-type]  # options is dict[str, object]


# -- the loss, the schedule, the pairs file ---------------------------------------------------------


def test_gradcache_gives_the_big_batch_gradients(tiny_model: Path) -> None:
    import torch
    from transformers import CLIPModel

    model = CLIPModel.from_pretrained(tiny_model).train()
    gen = torch.Generator().manual_seed(0)
    n = 8
    batch = PairBatch(
        pixels=torch.randn(n, 3, 64, 64, generator=gen),
        input_ids=torch.randint(0, 49000, (n, 6), generator=gen),
        attention_mask=torch.ones(n, 6, dtype=torch.long),
        positives=positive_mask(torch.arange(n), torch.tensor([0, 1, 2, 3, 4, 5, 6, 6])),
    )

    def grads(micro: int, mode: str) -> tuple[float, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        loss = forward_backward(model, batch, micro, mode)
        return loss, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    big_loss, big = grads(n, "gradcache")
    cached_loss, cached = grads(3, "gradcache")  # micro-batches of 3, 3, 2
    assert cached_loss == pytest.approx(big_loss, rel=1e-6)
    assert big.keys() == cached.keys() and "logit_scale" in big
    for name in big:
        torch.testing.assert_close(cached[name], big[name], rtol=1e-4, atol=1e-6, msg=name)
    micro_loss, _ = grads(4, "micro")  # 4 negatives fewer per pair: a different (smaller) loss
    assert micro_loss < big_loss - 1e-3


def test_same_caption_pairs_are_positives() -> None:
    import torch

    groups = caption_groups(["The letter A.", "the letter a.", "A cat."])
    assert groups[0] == groups[1] != groups[2]
    mask = positive_mask(torch.tensor([0, 1, 0]), torch.tensor(groups))
    assert mask.tolist() == [[True, True, True], [True, True, False], [True, False, True]]


def test_warmup_then_cosine() -> None:
    factors = [lr_factor(s, warmup=4, total=20) for s in range(20)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    assert factors[4] == 1.0 and all(a > b for a, b in itertools.pairwise(factors[4:]))
    assert 0 < factors[-1] < 0.01
    assert lr_factor(0, warmup=0, total=5) == 1.0


def test_pairs_file_skips_bad_lines(tmp_path: Path) -> None:
    photo_like(32, 32, seed=1).save(tmp_path / "a.png")
    lines = [
        '{"path": "a.png", "caption": " A thing. "}',
        "{not json",
        "",
        '{"path": "a.png", "caption": "   "}',
        '{"path": "gone.png", "caption": "missing"}',
        "[1, 2]",
    ]
    (tmp_path / "p.jsonl").write_text("\n".join(lines), encoding="utf-8")
    pairs = load_pairs(tmp_path / "p.jsonl")
    assert [(p.path, p.caption, p.line) for p in pairs.pairs] == [("a.png", "A thing.", 1)]
    assert [s.line for s in pairs.skipped] == [2, 4, 5, 6]
    summary = pairs.skipped_summary()
    assert "skipped 4 of 5 lines" in summary[0]
    assert f"{tmp_path / 'p.jsonl'}:2: not valid JSON" in summary[1]
    assert "image not found: gone.png" in summary[3]

    (tmp_path / "bad.jsonl").write_text('{"path": "gone.png", "caption": "x"}\n', encoding="utf-8")
    with pytest.raises(PairsFileError, match="none of its 1 lines is a usable pair.*bad.jsonl:1: image not found"):
        load_pairs(tmp_path / "bad.jsonl")
    with pytest.raises(PairsFileError, match="pairs file not found"):
        load_pairs(tmp_path / "nope.jsonl")


# -- training -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_finetune_cli_trains_reports_skips_and_the_result_indexes(
    tiny_model: Path, pairs_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pairs = tmp_path / "pairs.jsonl"
    good = (pairs_dir / "pairs.jsonl").read_text(encoding="utf-8")
    bad = '{"path": "img/missing.png", "caption": "gone"}\n{broken\n{"path": "img/0.png", "caption": ""}\n'
    pairs.write_text(good + bad, encoding="utf-8")
    out = tmp_path / "tuned"
    # The same 8 pairs every step (one batch, no augmentation): the loss must go down.
    # In-process (the same code path as the console script, minus a second of start-up).
    code = cli_main(["finetune", "--model", str(tiny_model), "--data", str(pairs), "--images-root", str(pairs_dir),
                     "--val", str(pairs_dir / "pairs.jsonl"), "--out", str(out), "--epochs", "12", "--batch-size", "8",
                     "--lr", "1e-3", "--warmup-steps", "0", "--no-augment", "--device", "cpu", "--json"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert "clipsearch: warning: " in captured.err and "skipped 3 of 11 lines" in captured.err
    assert f"{pairs}:9: image not found: img/missing.png" in captured.err
    assert f"{pairs}:10: not valid JSON" in captured.err
    assert 'empty or missing "caption"' in captured.err
    assert "epoch   step" in captured.err  # the table goes to stderr with --json
    assert report["finished"] and report["pairs"] == 8 and report["skipped_pairs"] == 3
    assert report["steps"] == 12 and len(report["loss_history"]) == 12
    losses = report["loss_history"]
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.05, losses
    assert set(report["before"]) == {"mrr", "recall@1", "recall@5", "recall@10"}
    assert report["after"]["mrr"] >= report["before"]["mrr"]
    assert report["chance"]["recall@10"] == 1.0  # 8 images: every one is in the top 10

    # A standard HF checkpoint: top-level preprocessor config, no nested processor config,
    # and no training leftovers.
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "preprocessor_config.json", "tokenizer.json", "finetune.json"} <= names
    assert "processor_config.json" not in names and "checkpoint" not in names
    assert not [n for n in names if n.startswith(".")]

    index = tmp_path / "idx"
    proc = cli_here(["index", pairs_dir, index, "--model", out, "--workers", "0", "--device", "cpu", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["indexed"] == 8
    proc = cli_here(["search", index, "a grey cat", "-k", "3", "--json"])
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)["results"]
    assert len(results) == 3 and all(r["path"].startswith("img/") for r in results)


def test_freeze_vision_keeps_vision_weights_bit_identical(tiny_model: Path, pairs_dir: Path, tmp_path: Path) -> None:
    report = finetune(_config(tiny_model, pairs_dir, tmp_path / "out", epochs=2, freeze="vision"))
    assert report.finished and report.steps == 4
    base, tuned = model_weights(tiny_model), model_weights(tmp_path / "out")
    assert base.keys() == tuned.keys()
    vision = [k for k in base if k.startswith(("vision_model.", "visual_projection."))]
    text = [k for k in base if k.startswith(("text_model.", "text_projection."))]
    assert vision and text
    for key in vision:
        assert base[key].tobytes() == tuned[key].tobytes(), key
    assert any(base[k].tobytes() != tuned[k].tobytes() for k in text)


def test_resume_continues_exactly(tiny_model: Path, pairs_dir: Path, tmp_path: Path) -> None:
    # Augmentation on, 2 steps per epoch, interrupted mid-epoch: the data order, the crops,
    # the optimizer and the schedule must all continue where they were.
    common = {"epochs": 3, "val": str(pairs_dir / "pairs.jsonl")}
    whole = finetune(_config(tiny_model, pairs_dir, tmp_path / "whole", **common))
    first = finetune(_config(tiny_model, pairs_dir, tmp_path / "split", stop_after_steps=3, **common))
    assert not first.finished and first.steps == 3
    assert (tmp_path / "split" / "checkpoint" / "trainer_state.pt").is_file()
    assert not (tmp_path / "split" / "config.json").exists()  # no final model yet
    with pytest.raises(FinetuneError, match="not empty; pass --resume"):
        finetune(_config(tiny_model, pairs_dir, tmp_path / "split", **common))
    with pytest.raises(FinetuneError, match="lr="):
        finetune(_config(tiny_model, pairs_dir, tmp_path / "split", resume=True, lr=5e-4, **common))
    rest = finetune(_config(tiny_model, pairs_dir, tmp_path / "split", resume=True, **common))
    assert rest.finished and rest.resumed_from_step == 3 and rest.steps == whole.steps == 6
    np.testing.assert_allclose(rest.loss_history, whole.loss_history, rtol=1e-5, atol=1e-6)
    assert rest.after == pytest.approx(whole.after, abs=1e-6)
    a, b = model_weights(tmp_path / "whole"), model_weights(tmp_path / "split")
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=1e-4, atol=1e-6, err_msg=key)
    assert not (tmp_path / "split" / "checkpoint").exists()


@pytest.mark.parametrize("layout", ["hub", "processor"])
def test_output_opens_in_transformers_whatever_the_base_layout(layout: str, pairs_dir: Path, tmp_path: Path) -> None:
    # "processor": the base has only what transformers 5's CLIPProcessor.save_pretrained writes
    # (settings nested in processor_config.json, no preprocessor_config.json).
    from transformers import AutoProcessor, CLIPImageProcessor, CLIPModel, CLIPProcessor

    from retrieval.encoders import HFClipEncoder
    from retrieval.tools.random_model import make_random_clip

    base = make_random_clip(tmp_path / "base", preset="tiny", seed=0, processor_layout=layout)
    assert (base / "preprocessor_config.json").is_file() == (layout == "hub")
    out = tmp_path / "out"
    report = finetune(_config(base, pairs_dir, out, epochs=1))
    assert report.finished and report.steps == 2

    # The Hub layout, whatever the base's: the one every transformers version reads.
    names = {p.name for p in out.iterdir()}
    assert "preprocessor_config.json" in names and "processor_config.json" not in names
    if layout == "hub":
        assert (out / "preprocessor_config.json").read_bytes() == (base / "preprocessor_config.json").read_bytes()
    model, info = CLIPModel.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    weights = model_weights(out)
    assert np.array_equal(model.text_projection.weight.detach().numpy(), weights["text_projection.weight"])
    base_settings = CLIPImageProcessor.from_pretrained(base).to_dict()
    assert base_settings["size"] == {"shortest_edge": 64} and base_settings["crop_size"] == {"height": 64, "width": 64}
    assert CLIPImageProcessor.from_pretrained(out).to_dict() == base_settings
    base_ids = CLIPProcessor.from_pretrained(base)(text=["a grey cat"])["input_ids"]
    for loader in (CLIPProcessor, AutoProcessor):
        processor = loader.from_pretrained(out)
        assert type(processor) is CLIPProcessor, loader
        assert processor.image_processor.to_dict() == base_settings
        assert processor(text=["a grey cat"])["input_ids"] == base_ids
    assert HFClipEncoder.load(str(out), device="cpu").preprocess == HFClipEncoder.load(str(base), device="cpu").preprocess


def test_from_config_tiny_trains_a_loadable_model(pairs_dir: Path, tmp_path: Path) -> None:
    from transformers import CLIPModel

    from retrieval.encoders import HFClipEncoder

    out = tmp_path / "scratch"
    config = FinetuneConfig(
        data=str(pairs_dir / "pairs.jsonl"),
        out=str(out),
        from_config="tiny",
        epochs=1,
        batch_size=4,
        device="cpu",
        save_dtype="float16",
        augment=AugmentConfig(min_scale=0.8),
    )
    report = finetune(config)
    assert report.finished and report.base == "from-config:tiny" and report.steps == 2
    assert json.loads((out / "finetune.json").read_text())["learning_rate"] == 5e-4
    assert all(v.dtype == np.float16 for v in model_weights(out).values())
    model = CLIPModel.from_pretrained(out)
    assert model.config.vision_config.image_size == 64 and model.config.projection_dim == 48
    encoder = HFClipEncoder.load(str(out), device="cpu")
    vectors = encoder.embed_texts(["a cat", "a car"])
    assert vectors.dtype == np.float32 and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"image_size": 64, "patch_size": 16}), encoding="utf-8")
    with pytest.raises(InvalidArgumentError, match="missing: vision_hidden"):
        finetune(FinetuneConfig(data=str(pairs_dir / "pairs.jsonl"), out=str(tmp_path / "x"), from_config=str(spec)))


# -- the command line: bad input ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--lr", "0"], "--lr must be a number > 0"),
        (["--lr", "nan"], "--lr must be a number > 0"),
        (["--epochs", "0"], "--epochs must be an integer >= 1"),
        (["--batch-size", "1"], "at least 2 pairs"),
        (["--weight-decay", "-1"], "--weight-decay must be a number >= 0"),
        (["--warmup-steps", "-2"], "--warmup-steps must be an integer >= 0"),
        (["--crop-scale", "1.5"], "crop scale"),
    ],
)
def test_bad_numbers_are_one_line_errors(
    extra: list[str], needle: str, pairs_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli_main(["finetune", "--from-config", "tiny", "--data", str(pairs_dir / "pairs.jsonl"), "--out", str(tmp_path / "o"), *extra])
    assert_one_line_error(code, capsys.readouterr().err, needle)


def test_a_run_killed_in_its_first_checkpoint_can_start_again(tmp_path: Path) -> None:
    from indexer.training import train_state

    out = tmp_path / "out"
    (out / ".checkpoint.tmp" / "model").mkdir(parents=True)  # all that such a run leaves
    assert train_state.prepare_output_dir(out, resume=False) is None
    with pytest.raises(FinetuneError, match="nothing to resume"):
        train_state.prepare_output_dir(out, resume=True)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FinetuneError, match="not empty"):
        train_state.prepare_output_dir(out, resume=False)


def test_bad_inputs_are_one_line_errors(pairs_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "o")
    data = str(pairs_dir / "pairs.jsonl")
    code = cli_main(["finetune", "--from-config", "tiny", "--data", str(tmp_path / "none.jsonl"), "--out", out])
    assert_one_line_error(code, capsys.readouterr().err, "none.jsonl: pairs file not found")

    unusable = tmp_path / "unusable.jsonl"
    unusable.write_text('{"path": "img/nope.png", "caption": "x"}\n{"path": "img/0.png", "caption": ""}\n', encoding="utf-8")
    code = cli_main(["finetune", "--from-config", "tiny", "--data", str(unusable), "--images-root", str(pairs_dir), "--out", out])
    assert_one_line_error(code, capsys.readouterr().err, "none of its 2 lines is a usable pair", "unusable.jsonl:1: image not found")

    code = cli_main(["finetune", "--model", "open_clip:ViT-B-32/openai", "--data", data, "--out", out])
    assert_one_line_error(code, capsys.readouterr().err, "Hugging Face CLIP checkpoints (CLIPModel) only, not open_clip")

    code = cli_main(["finetune", "--data", data, "--out", out])
    assert_one_line_error(code, capsys.readouterr().err, "--model BASE", "--from-config SPEC")

    code = cli_main(["finetune", "--from-config", "huge", "--data", data, "--out", out])
    assert_one_line_error(code, capsys.readouterr().err, "neither a preset")

    code = cli_main(["finetune", "--from-config", "tiny", "--data", data, "--out", out, "--resume"])
    assert_one_line_error(code, capsys.readouterr().err, "nothing to resume")


# -- the demo model -------------------------------------------------------------------------------


def test_demo_model_loads_with_its_documented_shape_and_ranks_train_captions() -> None:
    from transformers import CLIPConfig

    from indexer.training.augment import validation_pixels
    from indexer.training.validate import build_validation_set, retrieval_metrics
    from retrieval.encoders import HFClipEncoder

    assert DEMO_MODEL.is_dir(), "data/models/demo-clip is missing"
    size = sum(p.stat().st_size for p in DEMO_MODEL.iterdir())
    assert size <= 40_000_000
    assert all(v.dtype == np.float16 for v in model_weights(DEMO_MODEL).values())
    config = CLIPConfig.from_pretrained(DEMO_MODEL)
    # The shape documented in data/models/README.md.
    spec = json.loads((REPO / "data" / "models" / "demo-clip-spec.json").read_text(encoding="utf-8"))
    vision, text = config.vision_config, config.text_config
    assert (vision.image_size, vision.patch_size, vision.hidden_size, vision.num_hidden_layers) == (
        spec["image_size"], spec["patch_size"], spec["vision_hidden"], spec["vision_layers"],
    )  # fmt: skip
    assert (text.hidden_size, text.num_hidden_layers, config.projection_dim) == (
        spec["text_hidden"], spec["text_layers"], spec["projection_dim"],
    )  # fmt: skip
    assert "demo-clip" in (REPO / "data" / "models" / "README.md").read_text(encoding="utf-8")

    # It learned its training pairs: 26 of them (every 25th line) rank far above chance.
    encoder = HFClipEncoder.load(str(DEMO_MODEL), device="cpu")
    lines = (REPO / "data" / "models" / "pairs" / "demo-train.jsonl").read_text(encoding="utf-8").splitlines()[::25]
    pairs = [json.loads(line) for line in lines]
    files = [REPO / "data" / "demo" / p["path"] for p in pairs]
    pixels, failures = validation_pixels(files, encoder.preprocess)
    assert not failures
    vset = build_validation_set(files, [p["caption"] for p in pairs], pixels)  # type: ignore[arg-type]  # no failures: none is None
    images = encoder.embed_pixels(vset.pixels)
    texts = encoder.embed_texts(list(vset.queries))
    assert np.isfinite(images).all() and np.isfinite(texts).all()
    got = retrieval_metrics(images, texts, vset.relevant)
    chance = vset.chance()
    assert got.mrr > 3 * chance.mrr, (got, chance)
    assert math.isfinite(got.recall[5]) and got.recall[5] > chance.recall[5]
