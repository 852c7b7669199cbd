"""Tests of retrieval.tools.random_model: offline random CLIP checkpoints with the real CLIP tokenizer."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from retrieval.encoders.base import quiet_transformers
from retrieval.tools.random_model import (
    BOS_TOKEN_ID,
    CLIP_VOCAB_SIZE,
    EOS_TOKEN_ID,
    PRESETS,
    RandomClipSpec,
    build_clip_tokenizer,
    clean_text_like_open_clip,
    clip_config,
    main,
    make_random_clip,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY = PRESETS["tiny"]

# Strings whose ids must equal open_clip's as they are, with no pre-cleaning.
PARITY_TEXTS = [
    "a photo of a cat",
    "Hello, World!!! (really?) -- yes; [ok] {fine} #1 @home 50% $3.99",
    "3.14159 and 42 apples on 2024-01-01",
    "café naïve résumé Ångström Zürich",
    "e\u0301 combining accent",
    "日本語のテキスト 中文测试 한국어",
    "emoji 🐶🚀👍🏽 ok ❤️",
    "  lots   of\twhite\nspace \r\n ",
    "UPPER lower MiXeD CamelCase",
    "it's I'm we'll they'd you've don't",
    "İstanbul",
    "zero\u200bwidth",
    "",
    "!!!",
    "a" * 300,
    " ".join(f"word{i}" for i in range(100)),  # > 77 tokens: truncated
]

# Strings where open_clip's ftfy / html.unescape / str.lower cleaning changes the ids; equal
# after clean_text_like_open_clip.
NEEDS_CLEANING_TEXTS = [
    "dog’s “quoted” text",  # curly quotes (ftfy uncurl_quotes)
    "Tom &amp; Jerry &lt;3",  # HTML entities
    "ＡＢＣ１２３ 全角！",  # full-width forms (ftfy fix_character_width)
    "ﬁne ﬂower",  # ligatures
    "cafÃ© mojibake",  # mojibake (ftfy fix_encoding)
    "ΟΔΟΣ σοφός",  # Greek final sigma (str.lower is context-sensitive)
    "tab\x1cfile sep",  # U+001C is whitespace to str.split, not to \s
]


def weights_digest(directory: Path) -> str:
    return hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tokenizer():
    return build_clip_tokenizer()


@pytest.fixture(scope="module")
def open_clip_tokenize():
    open_clip = pytest.importorskip("open_clip")
    return open_clip.tokenizer.tokenize


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_random_clip(tmp_path_factory.mktemp("tiny") / "ckpt", "tiny", seed=0)


def hf_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    batch = tokenizer(texts, padding="max_length", truncation=True, max_length=77)
    return [[i for i, m in zip(ids, mask, strict=True) if m] for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True)]


def open_clip_ids(tokenize, texts: list[str]) -> list[list[int]]:
    # open_clip pads with 0 and id 0 ("!") never follows the end-of-text token, so cut there.
    rows = tokenize(texts).tolist()
    return [row[: row.index(EOS_TOKEN_ID) + 1] for row in rows]


# --- tokenizer ---------------------------------------------------------------------------------


def test_tokenizer_vocab_and_special_tokens(tokenizer) -> None:
    assert len(tokenizer) == CLIP_VOCAB_SIZE == 49408
    assert tokenizer.bos_token_id == BOS_TOKEN_ID == 49406
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == tokenizer.unk_token_id == EOS_TOKEN_ID == 49407
    assert tokenizer.model_max_length == 77
    assert build_clip_tokenizer(max_length=16).model_max_length == 16


@pytest.mark.parametrize("bad", [0, 1, -5, 7.0, True, "77"])
def test_tokenizer_rejects_bad_max_length(bad) -> None:
    with pytest.raises(ValueError):
        build_clip_tokenizer(max_length=bad)


def test_token_ids_match_open_clip(tokenizer, open_clip_tokenize) -> None:
    ours = hf_ids(tokenizer, PARITY_TEXTS)
    theirs = open_clip_ids(open_clip_tokenize, PARITY_TEXTS)
    for text, a, b in zip(PARITY_TEXTS, ours, theirs, strict=True):
        assert a == b, f"ids differ for {text!r}"


def test_long_text_truncated_with_eot_like_open_clip(tokenizer, open_clip_tokenize) -> None:
    text = " ".join(f"word{i}" for i in range(100))
    ours = tokenizer([text], padding="max_length", truncation=True, max_length=77)["input_ids"][0]
    theirs = open_clip_tokenize([text])[0].tolist()
    assert len(ours) == len(theirs) == 77
    assert ours[0] == theirs[0] == BOS_TOKEN_ID
    assert ours[-1] == theirs[-1] == EOS_TOKEN_ID
    assert ours == theirs


def test_cleaning_makes_remaining_classes_match(tokenizer, open_clip_tokenize) -> None:
    theirs = open_clip_ids(open_clip_tokenize, NEEDS_CLEANING_TEXTS)
    ours = hf_ids(tokenizer, [clean_text_like_open_clip(t) for t in NEEDS_CLEANING_TEXTS])
    for text, a, b in zip(NEEDS_CLEANING_TEXTS, ours, theirs, strict=True):
        assert a == b, f"ids differ for {text!r} even after cleaning"
    # Cleaning is harmless for text that already matched.
    assert hf_ids(tokenizer, [clean_text_like_open_clip(t) for t in PARITY_TEXTS]) == hf_ids(tokenizer, PARITY_TEXTS)


# --- specs and presets -------------------------------------------------------------------------


def test_presets_shapes() -> None:
    assert TINY == RandomClipSpec(64, 16, 32, 2, 2, 64, 32, 2, 2, 64, 48, 77)
    b32 = PRESETS["vit-b-32"]
    assert (b32.image_size, b32.patch_size, b32.vision_hidden, b32.vision_layers, b32.vision_heads) == (
        224, 32, 768, 12, 12,
    )
    assert (b32.text_hidden, b32.text_layers, b32.text_heads, b32.projection_dim) == (512, 12, 8, 512)
    l14 = PRESETS["vit-l-14"]
    assert (l14.image_size, l14.patch_size, l14.vision_hidden, l14.vision_layers, l14.vision_heads) == (
        224, 14, 1024, 24, 16,
    )
    assert (l14.text_hidden, l14.text_layers, l14.text_heads, l14.projection_dim) == (768, 12, 12, 768)
    with pytest.raises(AttributeError):
        TINY.image_size = 32  # type: ignore[misc]  # frozen


@pytest.mark.parametrize(
    ("preset", "parameters"),
    # Parameter counts of the Hub's openai/clip-vit-base-patch32 and openai/clip-vit-large-patch14.
    [("vit-b-32", 151_277_313), ("vit-l-14", 427_616_513)],
)
def test_preset_configs_have_the_published_models_parameter_counts(preset: str, parameters: int) -> None:
    import torch
    from transformers import CLIPModel

    with torch.device("meta"):  # shapes only: no memory, no initialisation
        model = CLIPModel(clip_config(preset))
    assert sum(p.numel() for p in model.parameters()) == parameters
    with pytest.raises(ValueError, match="unknown preset"):
        clip_config("vit-h-14")


@pytest.mark.parametrize(
    "changes",
    [{"vision_heads": 3}, {"text_heads": 5}, {"image_size": 70}, {"max_length": 1}, {"vision_layers": 0},
     {"projection_dim": 4.0}],
)
def test_spec_validation(changes: dict) -> None:
    fields = {**TINY.__dict__, **changes}
    with pytest.raises(ValueError):
        RandomClipSpec(**fields)


@pytest.mark.parametrize("preset", ["huge", "", "TINY", 3, None])
def test_invalid_preset_raises_value_error(tmp_path: Path, preset) -> None:
    with pytest.raises(ValueError):
        make_random_clip(tmp_path / "x", preset)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("seed", [-1, 2**63, 1.5, True])
def test_invalid_seed_raises_value_error(tmp_path: Path, seed) -> None:
    with pytest.raises(ValueError):
        make_random_clip(tmp_path / "x", "tiny", seed=seed)


@pytest.mark.parametrize("layout", ["", "Hub", "preprocessor", None])
def test_invalid_processor_layout_raises_value_error(tmp_path: Path, layout) -> None:
    with pytest.raises(ValueError, match="processor_layout"):
        make_random_clip(tmp_path / "x", "tiny", processor_layout=layout)
    assert not (tmp_path / "x").exists()


# --- checkpoint round trip ---------------------------------------------------------------------


def test_checkpoint_files(tiny_dir: Path) -> None:
    names = {p.name for p in tiny_dir.iterdir()}
    # Hub layout of openai/clip-vit-base-patch32 (preprocessor_config.json at the top level).
    assert {"config.json", "model.safetensors", "preprocessor_config.json", "tokenizer.json",
            "tokenizer_config.json"} <= names


def test_round_trip_loads_and_dims(tiny_dir: Path) -> None:
    import numpy as np
    import torch
    from PIL import Image
    from transformers import (
        AutoTokenizer,
        CLIPModel,
        CLIPProcessor,
        CLIPTextModelWithProjection,
        CLIPVisionModelWithProjection,
    )

    with quiet_transformers():
        model = CLIPModel.from_pretrained(tiny_dir).eval()
        vision = CLIPVisionModelWithProjection.from_pretrained(tiny_dir).eval()
        text = CLIPTextModelWithProjection.from_pretrained(tiny_dir).eval()
        processor = CLIPProcessor.from_pretrained(tiny_dir)
        auto_tok = AutoTokenizer.from_pretrained(tiny_dir)

    assert model.config.projection_dim == vision.config.projection_dim == text.config.projection_dim == 48
    assert model.config.vision_config.image_size == 64
    assert model.config.text_config.eos_token_id == EOS_TOKEN_ID
    assert len(auto_tok) == CLIP_VOCAB_SIZE
    ip = processor.image_processor
    assert ip.size["shortest_edge"] == 64 and (ip.crop_size["height"], ip.crop_size["width"]) == (64, 64)
    assert list(ip.image_mean) == pytest.approx([0.48145466, 0.4578275, 0.40821073])
    assert list(ip.image_std) == pytest.approx([0.26862954, 0.26130258, 0.27577711])
    assert int(ip.resample) == 3

    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (80, 120, 3), dtype=np.uint8))
    texts = ["a cat", "a much longer sentence about a dog on a beach"]
    inputs = processor(text=texts, images=[image, image], padding=True, return_tensors="pt")
    assert tuple(inputs["pixel_values"].shape) == (2, 3, 64, 64)
    with torch.no_grad():
        img = vision(pixel_values=inputs["pixel_values"]).image_embeds
        txt = text(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).text_embeds
        full_img = model.get_image_features(pixel_values=inputs["pixel_values"])
        full_txt = model.get_text_features(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        alone = text(**processor.tokenizer(texts[:1], return_tensors="pt")).text_embeds
    full_img = getattr(full_img, "pooler_output", full_img)
    full_txt = getattr(full_txt, "pooler_output", full_txt)
    assert img.shape == (2, 48) and txt.shape == (2, 48)
    # The towers hold the same (loaded, not re-initialised) weights as the full model.
    torch.testing.assert_close(img, full_img)
    torch.testing.assert_close(txt, full_txt)
    # Pooling is at the first end-of-text token: padding the short text changes nothing.
    torch.testing.assert_close(txt[:1], alone, atol=1e-5, rtol=1e-5)


def test_same_seed_same_bytes_different_seed_differs(tmp_path: Path, tiny_dir: Path) -> None:
    import torch

    torch.manual_seed(1234)
    before = torch.rand(3)
    torch.manual_seed(1234)
    again = make_random_clip(tmp_path / "again", "tiny", seed=0)
    # The caller's global RNG stream is left untouched.
    assert torch.equal(torch.rand(3), before)
    other = make_random_clip(tmp_path / "other", TINY, seed=1)
    assert weights_digest(again) == weights_digest(tiny_dir)
    assert weights_digest(other) != weights_digest(tiny_dir)


# --- command line and import cost --------------------------------------------------------------


def test_main_writes_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    assert main([str(out), "--preset", "tiny", "--seed", "0"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert (out / "model.safetensors").is_file()


def test_main_writes_the_nested_processor_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    assert main([str(out), "--preset", "tiny", "--processor-layout", "processor"]) == 0
    capsys.readouterr()
    assert (out / "processor_config.json").is_file() and not (out / "preprocessor_config.json").exists()
    assert main([str(tmp_path / "bad"), "--processor-layout", "nested"]) == 2
    assert "processor_layout" in capsys.readouterr().err


def test_main_bad_preset_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "cli"), "--preset", "huge"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1 and "huge" in captured.err
    assert not (tmp_path / "cli").exists()


def test_import_is_cheap() -> None:
    code = (
        "import sys, retrieval.tools.random_model as m; "
        "heavy = [x for x in ('torch', 'transformers', 'open_clip') if x in sys.modules]; "
        "assert not heavy, heavy; assert 'tiny' in m.PRESETS"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
