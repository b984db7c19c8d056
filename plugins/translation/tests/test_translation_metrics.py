"""sacreBLEU scores: corpus-level BLEU checked by hand, chrF, the signatures."""

from __future__ import annotations

import math

import pytest

from seqtrans_translation.metrics import score


def test_bleu_is_the_corpus_score_computed_by_hand() -> None:
    hyps = ["the cat sat on the mat", "a dog runs in the park"]
    refs = ["the cat is on the mat", "a dog runs in the big park"]
    # clipped n-gram matches over the corpus: 1-grams 5+6 of 6+6, 2-grams 3+4 of 5+5,
    # 3-grams 1+3 of 4+4, 4-grams 0+2 of 3+3; output 12 tokens, references 13
    precisions = [11 / 12, 7 / 10, 4 / 8, 2 / 6]
    brevity = math.exp(1 - 13 / 12)
    expected = 100 * brevity * math.exp(sum(map(math.log, precisions)) / 4)
    result = score(hyps, refs)
    assert result["bleu"] == pytest.approx(expected, abs=1e-9)
    assert result["bleu_length_ratio"] == pytest.approx(12 / 13)


def test_identical_text_scores_100_and_signatures_describe_the_metrics() -> None:
    refs = ["Ein Mann fährt Fahrrad. ", "Zwei Hunde spielen im Schnee.", ""]
    result = score(refs, refs)
    assert result["bleu"] == pytest.approx(100.0) and result["chrf"] == pytest.approx(100.0)
    assert str(result["bleu_signature"]).startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert str(result["chrf_signature"]).startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|")
    assert "tok:intl" in str(score(refs, refs, tokenize="intl")["bleu_signature"])
    assert score(["Ein Mann fährt Rad."], ["Ein Mann fährt Fahrrad."])["chrf"] < 100.0
    assert score([], [])["bleu"] == 0.0
