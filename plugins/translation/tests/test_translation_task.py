"""The translation task: its contract, its options, presets, and runs end to end."""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import seqtrans
from seqtrans.inference import evaluation  # internal: the engine's count of what the reader skipped
from seqtrans.plugin import CACHE_ENV, MIRROR_ENV, ConfigError, DataError, check_task, to_dict
from seqtrans_translation import TranslationConfig, TranslationTask
from seqtrans_translation.metrics import score
from translation_data import MULTI30K


@pytest.fixture(autouse=True)
def _shared_mirror(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Multi30k comes from the shared data through the mirror override, into a fresh cache."""
    monkeypatch.setenv(MIRROR_ENV, MULTI30K.as_uri())
    monkeypatch.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("cache")))


def _lines(path: Path, n: int, start: int = 0) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().split("\n")[start : start + n]


def test_the_task_keeps_the_plugin_contract(tmp_path: Path) -> None:
    scores = check_task(TranslationTask(TranslationConfig(vocab_size=1000)), tmp_path)
    assert scores["bleu"] == pytest.approx(100.0) and scores["chrf"] == pytest.approx(100.0)
    assert "tok:13a" in str(scores["bleu_signature"])
    assert seqtrans.tasks.load("translation") is TranslationTask


def test_local_files_replace_the_dataset_split_by_split(tmp_path: Path) -> None:
    (tmp_path / "a.en").write_text("one\ntwo\n")
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    (tmp_path / "dev.tsv").write_text("three\tdrei\n")
    config = seqtrans.resolve_config("translation", overrides=[
        f"data.train_src={tmp_path / 'a.en'}", f"data.train_tgt={tmp_path / 'a.de'}",
        f"data.dev_tsv={tmp_path / 'dev.tsv'}", "data.dataset=none",
        f"data.test_src={tmp_path / 'a.de'}", f"data.test_tgt={tmp_path / 'a.en'}"])
    task = TranslationTask(config.data)
    assert [(e.source, e.target) for e in task.read("train")] == [("one", "eins"), ("two", "zwei")]
    assert [(e.source, e.target) for e in task.read("dev")] == [("three", "drei")]
    assert [e.source for e in task.read("test")] == ["eins", "zwei"]
    (tmp_path / "a.de").write_text("eins\n")
    with pytest.raises(DataError, match=r"has 2 lines but its target file .*a\.de has 1"):
        list(task.read("train"))


def test_training_pairs_are_limited_and_empty_ones_skipped_but_test_lines_never(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "s").write_text("a\n\nc\nd\n")
    (tmp_path / "t").write_text("A\nB\n\nD\n")
    files = {f"{split}_{side}": str(tmp_path / side[0]) for split in ("train", "test")
             for side in ("src", "tgt")}
    task = TranslationTask(TranslationConfig(dataset="none", **files))  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO):
        train = evaluation.read_split(task, "train")
    assert [e.source for e in train.examples] == ["a", "d"]
    assert train.skipped == {"empty source or target": 2}
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [  # a filter of the task's: not a warning
        (logging.INFO, f"train: left out 2 of 4 inputs: empty source or target (first: {tmp_path / 's'}:2)")]
    assert [e.source for e in task.read("test")] == ["a", "", "c", "d"]
    limited = TranslationTask(TranslationConfig(dataset="none", max_train_examples=3, **files))  # type: ignore[arg-type]
    assert [e.source for e in evaluation.read_split(limited, "train").examples] == ["a"]


def test_training_pairs_can_be_cleaned_by_length_and_ratio(tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "s").write_text("a b c\na b c d e f g\na\na b c d\n")
    (tmp_path / "t").write_text("A B C D\nA B C D E F G\nA B\nA\n")
    files = {f"{split}_{side}": str(tmp_path / side[0]) for split in ("train", "test")
             for side in ("src", "tgt")}
    task = TranslationTask(TranslationConfig(dataset="none", max_train_words=6, max_train_ratio=1.5,
                                             **files))  # type: ignore[arg-type]
    # 3:4 words is kept; 7 words, 1:2 and 4:1 are not
    train = evaluation.read_split(task, "train")
    assert [e.source for e in train.examples] == ["a b c"]
    assert train.skipped == {"more than data.max_train_words=6 words": 1,
                             "length ratio above data.max_train_ratio=1.5": 2}
    assert len(list(task.read("test"))) == 4


@pytest.mark.parametrize(("overrides", "key"), [
    (["data.train_src=x"], "data.train_tgt"),
    (["data.dataset=wmt15"], "data.dataset"),
    (["data.source_lang=fr"], "data.source_lang"),
    (["data.target_lang=en"], "data.target_lang"),
    (["data.test_set=newstest2014"], "data.test_set"),
    (["data.vocab_size=100"], "data.vocab_size"),
    (["data.subword_model=wordpiece"], "data.subword_model"),
    (["data.bleu_tokenize=moses"], "data.bleu_tokenize"),
])
def test_bad_options_name_their_key(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        seqtrans.resolve_config("translation", overrides=overrides)
    assert caught.value.key == key


def test_without_a_dataset_a_split_needs_local_files() -> None:
    task = TranslationTask(TranslationConfig(dataset="none"))
    with pytest.raises(ConfigError, match="data.dev_src"):
        list(task.read("dev"))


def test_presets_follow_the_paper_and_the_budget() -> None:
    default = seqtrans.resolve_config("translation")
    assert default.data.dataset == "multi30k"
    assert (default.data.source_lang, default.data.target_lang) == ("en", "de")
    d = default.decode
    assert (d.beam, d.alpha, d.max_len_a, d.max_len_b) == (4, 0.6, 1.0, 50)
    assert to_dict(default) == to_dict(seqtrans.resolve_config("translation", preset="multi30k"))
    base = seqtrans.resolve_config("translation", preset="base")
    assert (base.model.d_model, base.model.d_ff, base.model.heads, base.model.dropout) == (512, 2048, 8, 0.1)
    assert (base.data.dataset, base.data.vocab_size, base.train.average_last) == ("wmt14-en-de", 37000, 5)
    assert (base.data.max_train_words, base.data.max_train_ratio) == (250, 1.5)
    assert base.train.max_tokens == 25000 and base.train.warmup == 4000 and base.train.max_steps == 100000
    big = seqtrans.resolve_config("translation", preset="big")
    assert (big.model.d_model, big.model.dropout, big.train.average_last, big.train.max_steps) == \
        (1024, 0.3, 20, 300000)
    cpu = seqtrans.resolve_config("translation", preset="cpu")
    assert cpu.data.dataset == "multi30k" and cpu.train.max_minutes == 30


def test_student_presets_have_a_deep_encoder_and_a_shallow_decoder() -> None:
    cpu = seqtrans.resolve_config("translation", preset="cpu")
    for name, decoder in (("student", 2), ("student-tiny", 1)):
        student = seqtrans.resolve_config("translation", preset=name)
        assert (student.model.encoder_layers, student.model.decoder_layers) == (6, decoder)
        assert student.model.d_model <= cpu.model.d_model
        assert to_dict(student.train) == to_dict(cpu.train)  # trained as the cpu preset is
        assert student.decode == cpu.decode


def _seqtrans(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "seqtrans", *args], input=stdin, capture_output=True,
                          text=True, env=dict(os.environ), timeout=600)


def test_run_predict_and_evaluate_end_to_end(tmp_path: Path) -> None:
    # a slice of Multi30k for training; a local test file with an empty line in the middle
    # and a line far longer than train.max_length
    src = _lines(MULTI30K / "test_2016_flickr.en.gz", 12)
    tgt = _lines(MULTI30K / "test_2016_flickr.de.gz", 12)
    src[5] = ""
    src[8] = " ".join(_lines(MULTI30K / "test_2016_flickr.en.gz", 8, start=20))
    (tmp_path / "test.en").write_text("\n".join(src) + "\n")
    (tmp_path / "test.de").write_text("\n".join(tgt) + "\n")
    out = tmp_path / "run"
    done = _seqtrans(
        "run", "translation", "--out", str(out), "--device", "cpu", "--set",
        "model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=32", "model.d_ff=64",
        "model.heads=2", "data.max_train_examples=1500", "data.vocab_size=800", "train.max_steps=6",
        "train.eval_every=6", "train.checkpoint_every=3", "train.keep_checkpoints=2", "train.average_last=2",
        "train.max_tokens=1500", "train.valid_max_examples=8", "train.max_minutes=0", "train.max_length=30",
        "decode.beam=2",
        "decode.max_len_b=8", f"data.test_src={tmp_path / 'test.en'}",
        f"data.test_tgt={tmp_path / 'test.de'}")
    assert done.returncode == 0, done.stderr
    # long training pairs are dropped and counted; test lines never are
    dropped = re.search(r"removed (\d+) of 1500 pairs: longer than train.max_length=30 tokens", done.stderr)
    assert dropped is not None and 0 < int(dropped.group(1)) < 1500, done.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert isinstance(metrics["bleu"], float) and isinstance(metrics["chrf"], float)
    assert metrics["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert metrics["test_sentences"] == 12
    # one output line per test line, the empty one included
    assert len((out / "predictions" / "test.txt").read_text().split("\n")) == 12 + 1
    assert (out / "vocab" / "sentencepiece.model").is_file()
    validations = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()
                   if '"validation"' in line]
    assert validations and all(isinstance(v["dev_bleu"], float) for v in validations)
    assert not any("signature" in key for v in validations for key in v)

    done = _seqtrans("predict", str(out), "--device", "cpu",
                     stdin="A man is riding a bicycle.\n\nTwo dogs.\n")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split("\n")) == 3 + 1
    done = _seqtrans("evaluate", str(out), "--device", "cpu")
    assert done.returncode == 0, done.stderr
    evaluated = json.loads(done.stdout)
    assert evaluated["bleu"] == pytest.approx(metrics["bleu"]) and "bleu_signature" in evaluated


@pytest.mark.slow
def test_a_small_model_learns_its_training_sentences(tmp_path: Path) -> None:
    # 200 Multi30k pairs, learnt by heart by a small model in a few hundred updates:
    # decoding, detokenization and sacreBLEU must then agree with the references, each
    # output on the line of its input, an empty and an over-long test line included
    src = _lines(MULTI30K / "train.en.gz", 200)
    tgt = _lines(MULTI30K / "train.de.gz", 200)
    test_src, test_tgt = src[:50], tgt[:50]
    test_src.insert(10, "")
    test_tgt.insert(10, "")
    test_src.insert(30, " ".join(src[50:58]))  # longer than train.max_length
    test_tgt.insert(30, " ".join(tgt[50:58]))
    for name, lines in [("train.en", src), ("train.de", tgt), ("dev.en", src[:50]), ("dev.de", tgt[:50]),
                        ("test.en", test_src), ("test.de", test_tgt)]:
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    files = [f"data.{split}_{side}={tmp_path / f'{split}.{lang}'}"
             for split in ("train", "dev", "test") for side, lang in [("src", "en"), ("tgt", "de")]]
    config = seqtrans.resolve_config("translation", preset="cpu", overrides=[
        "data.dataset=none", *files, "data.vocab_size=1000", "model.encoder_layers=2",
        "model.decoder_layers=2", "model.d_model=64", "model.d_ff=256", "model.dropout=0.0",
        "train.max_tokens=1024", "train.warmup=100", "train.lr_scale=0.2", "train.label_smoothing=0.0",
        "train.max_steps=250", "train.max_minutes=0", "train.checkpoint_every=250", "train.max_length=64",
        "train.keep_checkpoints=1", "train.average_last=1", "decode.beam=2"])
    metrics = seqtrans.run(config, tmp_path / "run", device="cpu")
    print(json.dumps(metrics))
    outputs = (tmp_path / "run" / "predictions" / "test.txt").read_text(encoding="utf-8").split("\n")
    assert len(outputs) == 52 + 1 and outputs[-1] == "" and metrics["test_sentences"] == 52
    learnt = [i for i in range(52) if i not in (10, 30)]
    assert sum(outputs[i] == test_tgt[i] for i in learnt) >= 25  # exact, and on their own lines
    assert float(score([outputs[i] for i in learnt], [test_tgt[i] for i in learnt])["bleu"]) >= 60.0
    assert float(metrics["bleu"]) >= 50.0


def test_pieces_are_grouped_into_the_words_they_spell() -> None:
    from seqtrans.plugin import TokenWords
    from seqtrans_translation.task import TranslationCodec, words_of_pieces

    assert words_of_pieces(["\u2581Ein", "\u2581Fahr", "rad", "\u2581", ".", "\u2581x"]) == [0, 1, 1, 2, 2, 3]
    assert words_of_pieces(["ab", "c", "\u2581d"]) == [0, 0, 1] and words_of_pieces([]) == []
    assert issubclass(TranslationCodec, TokenWords)


def test_an_output_stays_on_one_line_when_byte_pieces_spell_a_line_break() -> None:
    from seqtrans_translation.subwords import Subwords, SubwordSettings, train
    from seqtrans_translation.task import TranslationCodec

    texts = ["a small house", "a big tree"] * 50
    codec = TranslationCodec(Subwords(train(texts, SubwordSettings(vocab_size=300))))
    pieces = ["\u2581a", "<0x0A>", "\u2581b", "<0x09>", "c", "<0x0D>"]
    assert "\n" in codec.subwords.decode(pieces)  # the byte pieces do spell them
    assert codec.prediction(pieces, "") == codec.subwords.decode(pieces).translate({10: 32, 9: 32, 13: 32})
    assert len(codec.prediction(pieces, "").splitlines()) == 1
