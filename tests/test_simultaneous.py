"""Scoring a split as streams: the outputs of offline greedy decoding, the latency in
words recomputed from the streamed delays, the metrics file and the refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from decoding.test_streaming import loaded_copy, streaming_model
from test_cli import TINY, seqtrans

from seqtrans.config import DecodeConfig
from seqtrans.data import pad_batch
from seqtrans.decoding import greedy_search
from seqtrans.decoding.generate import max_output_length
from seqtrans.decoding.latency import corpus_latency, sentence_latency
from seqtrans.decoding.streaming import stream_greedy
from seqtrans.errors import UsageError
from seqtrans.inference import simultaneous
from seqtrans.inference.evaluation import Split
from seqtrans.tasks import Example
from seqtrans.vocab import EOS


def test_token_delays_become_the_words_holding_the_last_token_read() -> None:
    ends = [2, 3, 3, 6]  # words of 2, 1, 0 and 3 tokens
    assert simultaneous.source_word_delays([0, 1, 2, 3, 4, 5, 6], ends) == [0, 1, 1, 2, 4, 4, 4]
    assert simultaneous.source_word_delays([3], [2, 3, 3]) == [3]  # all read: the empty last word too


@pytest.mark.parametrize("seed, g, r", [(1, 3.0, 0.5), (3, 1.0, 3.0)])
def test_a_split_streams_to_the_offline_greedy_outputs_with_latency_in_words(seed: int, g: float,
                                                                              r: float) -> None:
    model = streaming_model(seed, g=g, r=r)
    loaded = loaded_copy(model)
    sources = [[0, 1, 2, 3, 4], [6], [5, 4, 3, 2, 1, 0, 1], [2, 2], []]
    examples = [Example(s, s[::-1][:3], origin=f"test:{i + 1}") for i, s in enumerate(sources)]
    outputs, metrics = simultaneous.score_stream(loaded, Split(examples))
    ids = [[t + 4 for t in s] for s in sources]
    decode = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=3)
    max_len = torch.tensor([max_output_length(len(s), decode) for s in ids])
    offline = greedy_search(model.eval(), pad_batch([s + [EOS] for s in ids]), max_len=max_len)
    per_sentence = []
    for out, hyps, source, example in zip(outputs, offline, ids, examples):
        assert out.tokens == ((hyps[0].tokens if hyps else []) if source else [])
        streamed = list(stream_greedy(model, source, decode)) if source else []
        # the copy task's words are its tokens: the delays in words are those in tokens
        assert out.word_delays == out.token_delays == [e.delay for e in streamed]
        assert out.source_words == len(source)
        per_sentence.append(sentence_latency(out.word_delays, source_length=len(source),
                                             reference_length=len(example.target)))
    expected = corpus_latency(per_sentence)
    for name in ("ap", "al", "laal", "dal"):
        assert metrics[f"stream_{name}"] == pytest.approx(expected[name], abs=1e-12)
        assert not math.isnan(expected[name])
    scores = loaded.task.score([o.prediction for o in outputs], examples)
    assert metrics["exact_match"] == scores["exact_match"]
    assert metrics["latency_unit"] == "word" and metrics["latency_reference"] == "simuleval 1.1.4"
    assert metrics["stream_source_words"] == pytest.approx(sum(map(len, sources)) / len(sources))
    assert outputs[-1].tokens == outputs[-1].word_delays == []  # the empty source: nothing to translate


def test_a_model_that_cannot_stream_is_refused(tmp_path: Path) -> None:
    from conftest import tiny_model

    with pytest.raises(UsageError, match="model.cross_attention=monotonic"):
        simultaneous.score_stream(loaded_copy(tiny_model(cross_attention="memory")),
                                  Split([Example([1], [1])]))


def test_the_metrics_file_is_named_by_split_checkpoint_and_settings(tmp_path: Path) -> None:
    assert simultaneous.metrics_path(tmp_path, split="test") == tmp_path / "metrics-stream-test.json"
    named = simultaneous.metrics_path(tmp_path, split="dev",
                                      overrides=["decode.wait_k=5", "decode.max_len_b=2", "decode.wait_k=3"])
    assert named.name == "metrics-stream-dev.max_len_b=2,wait_k=3.json"
    (tmp_path / "checkpoints").mkdir()
    ckpt = tmp_path / "checkpoints" / "average.pt"
    ckpt.touch()
    assert simultaneous.metrics_path(ckpt, split="test") == tmp_path / "metrics-stream-test-average.json"


def test_evaluate_stream_writes_its_metrics(tmp_path: Path) -> None:
    out = tmp_path / "stream"
    done = seqtrans("run", "copy", "--out", str(out), "--device", "cpu", "--set", *TINY,
                    "model.cross_attention=monotonic", "model.causal_encoder=true", "train.max_steps=4",
                    "train.eval_every=4", "data.test_size=8")
    assert done.returncode == 0, done.stderr
    done = seqtrans("evaluate", str(out), "--stream", "--device", "cpu")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    written = json.loads((out / "metrics-stream-test.json").read_text())
    assert {k: v for k, v in written.items() if k != "decode_sentences_per_s"} == {
        k: v for k, v in printed.items() if k != "decode_sentences_per_s"}
    assert {"exact_match", "token_accuracy", "stream_ap", "stream_al", "stream_laal", "stream_dal",
            "stream_source_words"} <= set(written)
    done = seqtrans("evaluate", str(out), "--stream", "--beam", "4", "--device", "cpu")
    assert done.returncode == 2 and "takes no --beam" in done.stderr
    done = seqtrans("evaluate", str(out), "--stream", "--device", "cpu", "--set", "decode.max_len_b=1",
                    "--output", str(tmp_path / "m.json"))
    assert done.returncode == 0 and (tmp_path / "m.json").is_file()
