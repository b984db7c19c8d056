"""Importing Hugging Face models of the BART family (NLLB through ``m2m_100``, mBART-50,
BART) with ``seqtrans import hf``: after the import, seqtrans computes what transformers
computes, on tiny models trained briefly here: the same token ids, log-probabilities
within 1e-4, greedy and beam outputs token for token equal to ``generate`` with the
languages set, and the same text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hf_models import LANGUAGES, assert_log_probabilities_match, hf_directory, model_ids, our_ids
from marian_models import SOURCES, TARGETS

from seqtrans import Loaded, load
from seqtrans.plugin import EOS, DecodeConfig
from seqtrans_translation.hf import FORMAT as HF_FORMAT

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

MAX_LENGTH = 40  # transformers' max_length: the start symbol, at most 38 tokens, the end symbol
FAMILIES = ["nllb", "mbart50", "bart"]


@pytest.fixture(scope="module", params=FAMILIES)
def imported(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Loaded]:
    family = request.param
    base = tmp_path_factory.mktemp(family)
    source = hf_directory(family, base / "hf")
    run = HF_FORMAT.import_model(source, out=base / "run")
    _, src_lang, tgt_lang = LANGUAGES[family]
    overrides = [f"decode.source_lang={src_lang}", f"decode.target_lang={tgt_lang}"] if src_lang else []
    return family, source, load(run, device="cpu", overrides=overrides)


def _hf(family: str, source: Path) -> tuple[Any, Any]:
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(source).eval()
    _, src_lang, tgt_lang = LANGUAGES[family]
    options = {"src_lang": src_lang, "tgt_lang": tgt_lang} if src_lang else {}
    return model, transformers.AutoTokenizer.from_pretrained(source, **options)


def test_ids_are_those_of_the_models_tokenizer(imported: tuple[str, Path, Loaded]) -> None:
    family, source, loaded = imported
    _, tokenizer = _hf(family, source)
    for text, target in zip(SOURCES, TARGETS):
        encoded = tokenizer(text, text_target=target)
        assert model_ids(loaded, [[*our_ids(loaded, [text])[0], EOS]])[0] == encoded["input_ids"]
        assert model_ids(loaded, [[*our_ids(loaded, [target], target=True)[0], EOS]])[0] == encoded["labels"]


def test_log_probabilities_equal_transformers(imported: tuple[str, Path, Loaded]) -> None:
    family, source, loaded = imported
    hf, _ = _hf(family, source)
    assert_log_probabilities_match(loaded, hf, SOURCES, TARGETS)


def _generate(family: str, hf: Any, tokenizer: Any, *, beam: int, lp: float) -> tuple[list[list[int]], Any]:
    """generate's outputs (after the start symbol, up to the end symbol) and, for a beam,
    its score of each (``sequences_scores``)."""
    batch = tokenizer(SOURCES, return_tensors="pt", padding=True)
    _, _, tgt_lang = LANGUAGES[family]
    forced = tokenizer.convert_tokens_to_ids(tgt_lang) if tgt_lang else tokenizer.bos_token_id  # BART: <s>
    out = hf.generate(**batch, num_beams=beam, do_sample=False, max_length=MAX_LENGTH, length_penalty=lp,
                      early_stopping="never", forced_bos_token_id=forced,
                      bad_words_ids=[[hf.config.pad_token_id]], return_dict_in_generate=True,
                      output_scores=True)
    eos = hf.config.eos_token_id
    rows = [row[1: row.index(eos, 1)] for row in out.sequences.tolist()]
    return rows, getattr(out, "sequences_scores", None)


@pytest.mark.parametrize("beam, lp", [(1, 0.0), (4, 0.0), (4, 0.3)])
def test_greedy_and_beam_outputs_equal_generate(imported: tuple[str, Path, Loaded], beam: int,
                                                lp: float) -> None:
    """The forced first token (the target language's code, BART's <s>) is read, not
    scored, as generate forces it: a beam's scores are generate's, with a length penalty too."""
    family, source, loaded = imported
    hf, tokenizer = _hf(family, source)
    expected, scores = _generate(family, hf, tokenizer, beam=beam, lp=lp)
    settings = DecodeConfig(beam=beam, alpha=lp, length_penalty="power", end_in_beam=True, max_len_a=0.0,
                            max_len_b=MAX_LENGTH - 2, source_lang=loaded.config.decode.source_lang,
                            target_lang=loaded.config.decode.target_lang)
    predictions, hypotheses = loaded.decode(SOURCES, decode=settings)
    assert model_ids(loaded, [h[0].tokens for h in hypotheses]) == expected
    assert len({tuple(r) for r in expected}) > 1  # the outputs depend on the input
    assert predictions == tokenizer.batch_decode(expected, skip_special_tokens=True)
    if beam > 1:
        assert [h[0].score for h in hypotheses] == pytest.approx(scores.tolist(), abs=1e-4)
