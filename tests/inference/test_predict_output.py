"""What ``predict`` writes beyond text: JSON lines with scores, per-token
log-probabilities and word alignments, and the same fields as text columns."""

from __future__ import annotations

import json
from pathlib import Path

from test_bad_input import _loaded

from seqtrans.inference.online import predict_batches
from seqtrans.inference.output import OutputOptions


def test_jsonl_writes_one_object_per_input_with_the_fields_asked_for(tmp_path: Path) -> None:
    loaded = _loaded(tmp_path, "decode.beam=3", "decode.nbest=2", "decode.max_len_b=2",
                     "decode.constrained=false")
    options = OutputOptions(format="jsonl", token_log_probs=True, alignments=True, alignment_layer=1)
    lines = list(predict_batches(loaded, [["1 2 3", "4 5"]], output=options))
    assert len(lines) == 2
    for number, (line, source_length) in enumerate(zip(lines, (3, 2)), 1):
        record = json.loads(line)
        assert record["line"] == number and len(record["hypotheses"]) == 2
        for hyp in record["hypotheses"]:
            assert len(hyp["token_log_probs"]) == len(hyp["tokens"]) + 1
            assert abs(sum(hyp["token_log_probs"]) - hyp["log_prob"]) < 1e-4
            assert hyp["normalized_score"] == hyp["score"]  # beam search ranks by the normalised score
            pairs = [tuple(map(int, p.split("-"))) for p in hyp["alignment"].split()]
            assert {j for _, j in pairs} == set(range(len(hyp["tokens"])))  # every target word aligned
            assert all(0 <= i < source_length for i, _ in pairs)
    plain = list(predict_batches(loaded, [["1 2 3", "4 5"]], output=OutputOptions(format="jsonl")))
    assert all("token_log_probs" not in h and "alignment" not in h
               for line in plain for h in json.loads(line)["hypotheses"])


def test_text_adds_the_alignment_and_the_token_scores_as_columns(tmp_path: Path) -> None:
    loaded = _loaded(tmp_path, "decode.beam=1", "decode.max_len_b=2", "decode.constrained=false")
    text = list(predict_batches(loaded, [["1 2 3"]]))
    rich = list(predict_batches(loaded, [["1 2 3"]], output=OutputOptions(token_log_probs=True,
                                                                           alignments=True)))
    output, alignment, scores = rich[0].split("\t")
    assert output == text[0]
    assert len(alignment.split()) >= len(output.split()) and len(scores.split()) == len(output.split()) + 1
