"""SimulEval 1.1.4 driving a seqtrans translation model through the shipped agent
(``seqtrans.streaming.simuleval.Agent``) scores what ``evaluate --stream`` measures: the same
outputs, the same word delays, and the same BLEU, AL, LAAL, AP and DAL. Translation's
words are made of several pieces, so a word's delay as a reader sees it (once the next
word begins, or the end is decided) differs from the delay of its last piece."""

from __future__ import annotations

import csv
import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

import seqtrans
from seqtrans import load
from seqtrans.inference.evaluation import Split  # internal: a split scored as evaluate --stream scores it
from seqtrans.plugin import Example
from seqtrans.streaming.evaluation import score_stream  # internal: (as above)
from translation_data import MULTI30K

pytest.importorskip("simuleval")


def _lines(path: Path, n: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().split("\n")[:n]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small causal multi-k model trained for a few updates on 400 Multi30k pairs: its
    outputs are poor, but they have words of several pieces and the delays of a policy."""
    root = tmp_path_factory.mktemp("simul")
    src, tgt = _lines(MULTI30K / "train.en.gz", 400), _lines(MULTI30K / "train.de.gz", 400)
    for name, lines in [("train.en", src), ("train.de", tgt), ("test.en", src[:24]), ("test.de", tgt[:24])]:
        (root / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    splits = [("train", "train"), ("dev", "test"), ("test", "test")]
    files = [f"data.{split}_{side}={root / f'{name}.{lang}'}"
             for split, name in splits for side, lang in [("src", "en"), ("tgt", "de")]]
    config = seqtrans.resolve_config("translation", overrides=[
        "data.dataset=none", *files, "data.vocab_size=400", "model.encoder_layers=1",
        "model.decoder_layers=1", "model.d_model=32", "model.d_ff=64", "model.heads=2",
        "model.causal_encoder=true", "model.multi_k=true", "train.max_tokens=1024", "train.warmup=10",
        "train.max_steps=30", "train.max_minutes=0", "train.eval_every=30", "train.checkpoint_every=30",
        "train.keep_checkpoints=1", "train.average_last=1", "train.max_length=40", "decode.beam=1",
        "decode.max_len_b=10"])
    seqtrans.run(config, root / "run", device="cpu")
    return root


def test_simuleval_with_the_agent_scores_what_evaluate_stream_measures(run: Path) -> None:
    loaded = load(run / "run", overrides=["decode.wait_k=3"], device="cpu")
    src = (run / "test.en").read_text(encoding="utf-8").splitlines()
    ref = (run / "test.de").read_text(encoding="utf-8").splitlines()
    task = loaded.task
    examples = [Example(task.parse_source(s), task.parse_target(t), origin=f"test.en:{i + 1}")
                for i, (s, t) in enumerate(zip(src, ref))]
    outputs, metrics = score_stream(loaded, Split(examples), instances=run / "instances.log")
    ours = [json.loads(line) for line in (run / "instances.log").read_text(encoding="utf-8").splitlines()]
    # a reader sees a word once the next begins: never earlier than its last piece, and here later
    assert all(w >= p for o in outputs for w, p in zip(o.word_delays, o.piece_delays))
    assert any(o.word_delays != o.piece_delays for o in outputs)
    assert metrics["stream_al"] > metrics["stream_piece_al"]

    out = run / "simuleval"
    done = subprocess.run(
        [sys.executable, "-c", "from simuleval.cli import main; main()",
         "--agent-class", "seqtrans.streaming.simuleval.Agent", "--seqtrans-run", str(run / "run"),
         "--seqtrans-set", "decode.wait_k=3", "--source", str(run / "test.en"),
         "--target", str(run / "test.de"), "--output", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    theirs = [json.loads(line) for line in (out / "instances.log").read_text(encoding="utf-8").splitlines()]
    assert [t["prediction"] for t in theirs] == [o["prediction"] for o in ours]
    assert [t["delays"] for t in theirs] == [o["delays"] for o in ours]
    with open(out / "scores.tsv", encoding="utf-8") as f:
        [scores] = list(csv.DictReader(f, delimiter="\t"))
    for name, key in [("BLEU", "bleu"), ("AL", "stream_al"), ("LAAL", "stream_laal"), ("AP", "stream_ap"),
                      ("DAL", "stream_dal")]:
        assert float(scores[name]) == pytest.approx(float(metrics[key]), abs=1e-3), name  # tsv: 3 decimals
