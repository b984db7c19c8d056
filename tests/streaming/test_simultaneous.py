"""Scoring a split as streams: the outputs of offline greedy decoding, the latency in
words recomputed from the streamed delays, the metrics file and the refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from test_cli import TINY, seqtrans
from test_streaming import loaded_copy, streaming_model

from seqtrans.config import DecodeConfig
from seqtrans.data.batches import pad_batch
from seqtrans.data.vocab import EOS
from seqtrans.decoding import greedy_search
from seqtrans.decoding.generate import max_output_length
from seqtrans.errors import UsageError
from seqtrans.inference.evaluation import Split
from seqtrans.streaming import evaluation as simultaneous
from seqtrans.streaming.decoder import stream_greedy
from seqtrans.streaming.latency import corpus_latency, sentence_latency
from seqtrans.tasks import Example


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
    per_sentence: list[dict[str, float]] = []
    per_piece: list[dict[str, float]] = []
    for out, hyps, source, example in zip(outputs, offline, ids, examples):
        assert out.tokens == ((hyps[0].tokens if hyps else []) if source else [])
        streamed = list(stream_greedy(model, source, decode)) if source else []
        # the copy task's words are its tokens: the delays of their last pieces are those
        # in tokens, and a reader knows a word is complete with the next token or the end
        delays = [e.delay for e in streamed]
        assert out.piece_delays == out.token_delays == delays
        end = len(source)  # the end symbol is only ever decided once the whole source is read here
        assert out.word_delays == [max(d, p) for d, p in zip(delays[1:] + [end] * bool(delays), delays)]
        assert out.source_words == len(source)
        for delays_of, sentences in ((out.word_delays, per_sentence), (out.piece_delays, per_piece)):
            sentences.append(sentence_latency(delays_of, source_length=len(source),
                                              reference_length=len(example.target)))
    for prefix, sentences in (("stream", per_sentence), ("stream_piece", per_piece)):
        expected = corpus_latency(sentences)
        for name in ("ap", "al", "laal", "dal"):
            assert metrics[f"{prefix}_{name}"] == pytest.approx(expected[name], abs=1e-12)
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
    instances = tmp_path / "instances.log"
    done = seqtrans("evaluate", str(out), "--stream", "--device", "cpu", "--instances", str(instances),
                    "--output", str(tmp_path / "m2.json"))
    assert done.returncode == 0, done.stderr
    logged = [json.loads(line) for line in instances.read_text().splitlines()]
    assert len(logged) == 8 and [entry["index"] for entry in logged] == list(range(8))
    for entry in logged:
        assert len(entry["delays"]) == entry["prediction_length"] == len(entry["prediction"].split())
        assert entry["source_length"] == len(entry["source"].split())
        assert set(entry) == {"index", "prediction", "delays", "elapsed", "prediction_length", "reference",
                              "source", "source_length"}
    again = json.loads((tmp_path / "m2.json").read_text())
    recomputed = corpus_latency(sentence_latency(e["delays"], source_length=e["source_length"],
                                                 reference_length=len(e["reference"].split(" ")))
                                for e in logged)
    assert again["stream_al"] == pytest.approx(recomputed["al"], abs=1e-12)
    done = seqtrans("evaluate", str(out), "--device", "cpu", "--instances", str(instances))
    assert done.returncode == 2 and "--instances is for --stream" in done.stderr
