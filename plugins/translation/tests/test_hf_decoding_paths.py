"""The decoding paths of seqtrans on an imported NLLB model with its languages set: int8,
sampling, n-best, forced prefixes, scoring files, an ensemble of one vocabulary. Each
keeps the target language's code as the output's first token, and leaves it out of the
text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_models import NLLB_LANGUAGES, imported_nllb, our_ids
from marian_models import SOURCES, TARGETS, _pairs

from seqtrans import (
    Loaded,
    OutputOptions,
    ShortlistSettings,
    build_shortlist,
    load,
    load_ensemble,
    predict,
    score_files,
)
from seqtrans.plugin import EOS, DecodeConfig

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

LANGUAGES = NLLB_LANGUAGES


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return imported_nllb(tmp_path_factory)


def _starts_with_the_language(loaded: Loaded, hypotheses: list[list[object]]) -> bool:
    code = loaded.codec.vocabularies.target.index("deu_Latn")
    return all(h.tokens[0] == code for nbest in hypotheses for h in nbest)  # type: ignore[attr-defined]


def test_int8_decodes_close_to_float32(run: Path) -> None:
    fp32, _ = load(run, device="cpu", overrides=[*LANGUAGES, "decode.beam=1"]).decode(SOURCES)
    int8 = load(run, device="cpu", overrides=[*LANGUAGES, "decode.beam=1", "decode.precision=int8"])
    predictions, hypotheses = int8.decode(SOURCES)
    assert _starts_with_the_language(int8, hypotheses) and not any("deu_Latn" in p for p in predictions)
    assert sum(a == b for a, b in zip(predictions, fp32)) >= len(SOURCES) // 2


def test_int8_steps_in_one_native_call_give_the_layers_outputs(run: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """NLLB's layers (pre-norm LayerNorm, ReLU) are the native decoder step's in int8: with
    it (timed against the layers at each new number of rows, so both ways run) the same
    n-best and scores as without it."""
    settings = [*LANGUAGES, "decode.beam=4", "decode.nbest=2", "decode.precision=int8"]
    monkeypatch.setenv("SEQTRANS_NATIVE_STEP", "0")
    _, layers = load(run, device="cpu", overrides=settings).decode(SOURCES)
    monkeypatch.delenv("SEQTRANS_NATIVE_STEP")
    stepping = load(run, device="cpu", overrides=settings)
    if stepping.model.native_step is None:  # (the engine's tests check which layers it covers)
        pytest.skip("no native decoder step here: no C compiler or int8 product, or SEQTRANS_NATIVE=0")
    _, stepped = stepping.decode(SOURCES)

    def outputs(hypotheses: list[list[object]]) -> list[list[tuple[object, object]]]:
        return [[(h.tokens, h.score) for h in n] for n in hypotheses]  # type: ignore[attr-defined]

    assert outputs(stepped) == outputs(layers)


def test_sampling_nbest_and_prefixes(run: Path) -> None:
    loaded = load(run, device="cpu", overrides=LANGUAGES)
    _, samples = loaded.decode(SOURCES[:3], decode=DecodeConfig(sample=3, seed=1, target_lang="deu_Latn"))
    assert [len(s) for s in samples] == [3, 3, 3] and _starts_with_the_language(loaded, samples)
    _, nbest = loaded.decode(SOURCES[:3], decode=DecodeConfig(beam=4, nbest=4, target_lang="deu_Latn"))
    assert all(len(n) == 4 for n in nbest) and _starts_with_the_language(loaded, nbest)
    codec = loaded.codec
    prefix = codec.vocabularies.target.encode(codec.target_tokens("der"))  # the code and a word
    _, forced = loaded.decode(SOURCES[:2], prefixes=[prefix, prefix[1:]])  # with or without the code
    assert all(h[0].tokens[: len(prefix)] == prefix for h in forced)


def test_scores_are_the_log_probabilities_of_the_targets_in_the_language(run: Path, tmp_path: Path) -> None:
    """The language's code, forced first, counts 0 (as decoding reads it, and generate
    forces it); the rest is the model's log-probability, and a decoded output's score is
    the log-probability decoding reported."""
    loaded = load(run, device="cpu", overrides=LANGUAGES)
    (tmp_path / "src").write_text("\n".join(SOURCES[:3]) + "\n", encoding="utf-8")
    (tmp_path / "tgt").write_text("\n".join(TARGETS[:3]) + "\n", encoding="utf-8")
    scores = score_files(loaded, tmp_path / "src", tmp_path / "tgt")
    codec, vocab = loaded.codec, loaded.codec.vocabularies.target
    for score, source, target in zip(scores, SOURCES, TARGETS):
        src = torch.tensor([vocab.encode(codec.source_tokens(source)) + [EOS]])
        tgt = vocab.encode(codec.target_tokens(target))
        assert tgt[0] == vocab.encode(["deu_Latn"])[0]
        with torch.no_grad():
            log_probs = torch.log_softmax(loaded.model(src, torch.tensor([[1, *tgt]])), dim=-1)[0]
        expected = sum(float(log_probs[i, t]) for i, t in enumerate([*tgt, EOS]) if i > 0)
        assert score.tokens == len(tgt) + 1 and score.log_prob == pytest.approx(expected, abs=1e-4)
    predictions, hypotheses = loaded.decode(SOURCES[:3])
    rescored = loaded.score(SOURCES[:3], predictions)
    assert [s.log_prob for s in rescored] == pytest.approx([h[0].log_prob for h in hypotheses], abs=1e-4)


def test_an_ensemble_of_one_vocabulary(run: Path) -> None:
    single, _ = load(run, device="cpu", overrides=[*LANGUAGES, "decode.beam=2"]).decode(SOURCES)
    ensemble = load_ensemble([run, run], device="cpu", overrides=[*LANGUAGES, "decode.beam=2"])
    predictions, hypotheses = ensemble.decode(SOURCES)
    assert predictions == single and _starts_with_the_language(ensemble, hypotheses)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_a_shortlist_counted_from_given_pairs_keeps_the_outputs_it_covers(run: Path, tmp_path: Path,
                                                                         precision: str) -> None:
    # an imported model has no training data of its own: the pairs come from files
    sources, targets = _pairs(32, 3)  # what the model was trained on
    (tmp_path / "src").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "tgt").write_text("\n".join(targets) + "\n", encoding="utf-8")
    pairs = (tmp_path / "src", tmp_path / "tgt")
    build_shortlist(run, settings=ShortlistSettings(top=4, frequent=2), pairs=pairs, overrides=LANGUAGES)
    settings = [*LANGUAGES, "decode.beam=1", f"decode.precision={precision}"]
    full = load(run, device="cpu", overrides=settings)
    listed = load(run, device="cpu", overrides=[*settings, "decode.shortlist=true"])
    assert listed.shortlist is not None
    allowed = listed.shortlist.allowed([[*s, EOS] for s in our_ids(full, sources)])
    assert allowed.sum(axis=1).max() < allowed.shape[1] // 2  # a real restriction
    _, expected = full.decode(sources)
    _, got = listed.decode(sources)
    covered = 0
    for row, want, have in zip(allowed, expected, got):
        inside = all(row[t] for t in want[0].tokens)
        covered += inside
        # greedy keeps the argmax wherever the shortlist holds it, and cannot leave the list
        assert (have[0].tokens == want[0].tokens) == inside, (want[0].tokens, have[0].tokens)
    assert covered >= len(sources) // 3


def test_token_log_probabilities_count_the_language_code_0_and_sum_to_the_score(run: Path) -> None:
    loaded = load(run, device="cpu", overrides=[*LANGUAGES, "decode.beam=3"])
    options = OutputOptions(format="jsonl", token_log_probs=True)
    for line in predict(loaded, SOURCES[:3], output=options):
        for hyp in json.loads(line)["hypotheses"]:
            assert hyp["token_log_probs"][0] == 0.0 and all(p < 0 for p in hyp["token_log_probs"][1:])
            assert sum(hyp["token_log_probs"]) == pytest.approx(hyp["log_prob"], abs=1e-4)
