"""Documents of consecutive lines (``data.join_lines``): each split's from its own files,
whole, the remainder a shorter last document."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from seqtrans.plugin import ConfigError, Example, without_download_settings
from seqtrans_translation import TranslationConfig
from seqtrans_translation.readers import join_examples
from translation_data import MULTI30K, multi30k_task


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    without_download_settings(monkeypatch)


def _lines(name: str) -> list[str]:
    with gzip.open(MULTI30K / name, "rt", encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def test_lines_join_in_order_and_the_remainder_is_a_shorter_last_document() -> None:
    examples = [Example(f"s{i}", f"t{i}", origin=f"f:{i}") for i in range(1, 8)]
    documents = list(join_examples(examples, 3))
    assert [(d.source, d.target) for d in documents] == [
        ("s1 s2 s3", "t1 t2 t3"), ("s4 s5 s6", "t4 t5 t6"), ("s7", "t7")]
    assert [d.origin for d in documents] == ["f:1 (3 lines)", "f:4 (3 lines)", "f:7 (1 lines)"]
    assert list(join_examples(iter(examples), 1)) == examples
    assert list(join_examples(examples[:6], 3))[-1].source == "s4 s5 s6"  # no empty document
    with pytest.raises(ValueError, match="at least 1"):
        list(join_examples(examples, 0))


def test_multi30k_documents_of_eight_sentences_come_from_their_own_split(tmp_path: Path) -> None:
    task = multi30k_task(tmp_path, join_lines=8)
    test = list(task.read("test"))
    assert len(test) == 125  # 1,000 sentences: every document whole
    english, german = _lines("test_2016_flickr.en.gz"), _lines("test_2016_flickr.de.gz")
    assert [(d.source, d.target) for d in test] == [
        (" ".join(english[i:i + 8]), " ".join(german[i:i + 8])) for i in range(0, 1000, 8)]
    dev = list(task.read("dev"))
    assert len(dev) == 127 and dev[-1].source == " ".join(_lines("val.en.gz")[-6:])  # 1,014 = 126 x 8 + 6
    assert dev[0].source == " ".join(_lines("val.en.gz")[:8])
    train = list(task.read("train"))
    assert len(train) == 3625 and train[0].source == " ".join(_lines("train.en.gz")[:8])
    back = next(multi30k_task(tmp_path, join_lines=8, source_lang="de", target_lang="en").read("test"))
    assert (back.source, back.target) == (test[0].target, test[0].source)


def test_local_files_join_too_and_the_option_is_part_of_the_training_digest(tmp_path: Path) -> None:
    tsv = tmp_path / "train.tsv"
    tsv.write_text("".join(f"a{i}\tb{i}\n" for i in range(5)))
    task = multi30k_task(tmp_path, dataset="none", train_tsv=str(tsv), join_lines=2)
    assert [(e.source, e.target) for e in task.read("train")] == [("a0 a1", "b0 b1"), ("a2 a3", "b2 b3"),
                                                                  ("a4", "b4")]
    sentences = multi30k_task(tmp_path, dataset="none", train_tsv=str(tsv))
    assert task.train_digest() != sentences.train_digest()
    with pytest.raises(ConfigError, match="data.join_lines"):
        TranslationConfig(join_lines=0)
