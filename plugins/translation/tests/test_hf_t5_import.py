"""Importing Hugging Face models of the T5 family (T5 v1.0 and v1.1, mT5, ByT5, and a T5
directory whose tokenizer is its sentencepiece model alone) with ``seqtrans import hf``:
after the import, seqtrans computes what transformers computes, on tiny models trained
briefly here: the same token ids, log-probabilities within 1e-4, greedy and beam outputs
token for token equal to ``generate``, and the same text; int8 decoding runs too."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hf_models import assert_log_probabilities_match, model_ids, our_ids
from marian_models import SOURCES, TARGETS
from t5_models import MAX_LENGTH, t5_directory

from seqtrans import Loaded, load
from seqtrans.plugin import EOS, DecodeConfig
from seqtrans_translation.hf import FORMAT as HF_FORMAT

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

VARIANTS = ["t5", "t5v11", "mt5", "byt5", "t5-spiece"]


@pytest.fixture(scope="module", params=VARIANTS)
def imported(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Loaded]:
    variant = request.param
    base = tmp_path_factory.mktemp(variant)
    source = t5_directory(variant.removesuffix("-spiece"), base / "hf",
                          spiece_only=variant.endswith("-spiece"))
    run = HF_FORMAT.import_model(source, out=base / "run")
    return variant, source, load(run, device="cpu")


def _hf(source: Path) -> tuple[Any, Any]:
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(source).eval()
    return model, transformers.AutoTokenizer.from_pretrained(source)


def test_the_import_maps_the_variant_onto_model_options(imported: tuple[str, Path, Loaded]) -> None:
    variant, source, loaded = imported
    c = loaded.config.model
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    assert (c.norm, c.norm_kind, c.positions, c.bias, c.attention_scale) == ("pre", "rms", "relative", False,
                                                                               False)
    assert c.head_dim == config["d_kv"] and c.relative_buckets == config["relative_attention_num_buckets"]
    assert (c.encoder_layers, c.decoder_layers) == ((3, 2) if variant == "byt5" else (2, 2))
    v10 = variant.startswith("t5") and variant != "t5v11"
    assert (c.tie_output, c.scale_output, c.gated_ffn) == (v10, v10, not v10)
    assert c.activation == ("relu" if v10 else "gelu_tanh")
    if variant == "mt5":
        assert c.heads * c.head_dim != c.d_model
    kind = {"byt5": "bytes", "t5-spiece": "sentencepiece"}.get(variant, "tokenizers")
    assert json.loads(loaded.assets["hf.json"])["tokenizer"] == kind


def test_ids_are_those_of_the_models_tokenizer(imported: tuple[str, Path, Loaded]) -> None:
    _, source, loaded = imported
    _, tokenizer = _hf(source)
    for text, target in zip(SOURCES + ["Größe naïve café  two  spaces"], TARGETS + ["ß"]):
        encoded = tokenizer(text, text_target=target)
        assert model_ids(loaded, [[*our_ids(loaded, [text])[0], EOS]])[0] == encoded["input_ids"]
        assert model_ids(loaded, [[*our_ids(loaded, [target], target=True)[0], EOS]])[0] == encoded["labels"]


def test_log_probabilities_equal_transformers(imported: tuple[str, Path, Loaded]) -> None:
    _, source, loaded = imported
    hf, _ = _hf(source)
    assert_log_probabilities_match(loaded, hf, SOURCES, TARGETS)


def _generate(variant: str, hf: Any, tokenizer: Any, *, beam: int) -> list[list[int]]:
    batch = tokenizer(SOURCES, return_tensors="pt", padding=True)
    out = hf.generate(**batch, num_beams=beam, do_sample=False, max_length=_max_length(variant),
                      length_penalty=0.0, early_stopping="never", bad_words_ids=[[hf.config.pad_token_id]])
    eos = hf.config.eos_token_id
    return [row[1: row.index(eos, 1)] for row in out.tolist()]  # after the start, up to the end


def _max_length(variant: str) -> int:
    return MAX_LENGTH[variant.removesuffix("-spiece")]


@pytest.mark.parametrize("beam", [1, 4])
def test_greedy_and_beam_outputs_equal_generate(imported: tuple[str, Path, Loaded], beam: int) -> None:
    variant, source, loaded = imported
    hf, tokenizer = _hf(source)
    expected = _generate(variant, hf, tokenizer, beam=beam)
    settings = DecodeConfig(beam=beam, alpha=0.0, length_penalty="power", end_in_beam=True, max_len_a=0.0,
                            max_len_b=_max_length(variant) - 2)
    predictions, hypotheses = loaded.decode(SOURCES, decode=settings)
    assert model_ids(loaded, [h[0].tokens for h in hypotheses]) == expected
    assert len({tuple(r) for r in expected}) > 1  # the outputs depend on the input
    assert all(len(r) < _max_length(variant) - 2 for r in expected)  # and end by themselves
    assert predictions == tokenizer.batch_decode(expected, skip_special_tokens=True)


def test_int8_decoding_of_an_imported_model(imported: tuple[str, Path, Loaded]) -> None:
    """Not bit for bit: the int8 outputs end, and most are the float model's."""
    variant, source, loaded = imported
    int8 = load(source.parent / "run", device="cpu", overrides=["decode.precision=int8"])
    settings = DecodeConfig(beam=4, max_len_a=0.0, max_len_b=_max_length(variant) - 2)
    floats, _ = loaded.decode(SOURCES, decode=settings)
    ints, hypotheses = int8.decode(SOURCES, decode=replace(settings, precision="int8"))
    assert all(len(h[0].tokens) < _max_length(variant) - 2 for h in hypotheses)
    assert sum(a == b for a, b in zip(floats, ints)) >= len(SOURCES) - 2
