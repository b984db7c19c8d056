"""The mytask task: the plugin contract, the reader, the metric, and a tiny run."""

from pathlib import Path

import pytest
import seqtrans
from seqtrans.plugin import DataError, Example, Skipped, check_task

from seqtrans_mytask import MytaskConfig, MytaskTask, edits, toy_examples


def test_the_task_keeps_the_contract(tmp_path: Path) -> None:
    scores = check_task(MytaskTask(MytaskConfig()), tmp_path / "vocab")
    assert scores == {"cer": 0.0, "exact_match": 100.0}  # references scored against themselves


def test_the_toy_data_reverses_letters_and_is_the_same_every_time() -> None:
    dev = toy_examples("dev")
    assert dev == toy_examples("dev") and len(dev) == 100 and dev != toy_examples("test")
    assert all(e.target == e.source[::-1] and 1 <= len(e.source) <= 6 for e in dev)


def test_the_reader_leaves_out_long_training_words_and_names_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "data.tsv"
    path.write_text("abc\tcba\n\tx\nabcdef\tfedcba\nab\n", encoding="utf-8")
    files = {split: str(path) for split in ("train", "dev", "test")}
    train = MytaskTask(MytaskConfig(max_letters=5, **files)).read("train")
    assert next(train) == Example("abc", "cba", origin=f"{path}:1")
    assert next(train) == Skipped(f"{path}:2", "empty source or target")
    assert next(train) == Skipped(f"{path}:3", "more than data.max_letters=5 letters")
    with pytest.raises(DataError, match=r"data\.tsv:4: expected source<TAB>target, found 1 field"):
        next(train)
    test = MytaskTask(MytaskConfig(max_letters=5, **files)).read("test")
    assert [next(test), next(test), next(test)][2] == Example("abcdef", "fedcba", origin=f"{path}:3")
    # (test examples are never left out: predictions are written in input order)


def test_the_character_error_rate_counts_edits_per_reference_letter() -> None:
    pairs = [("abc", "abc"), ("abc", "ab"), ("kitten", "sitting"), ("", "ab")]
    assert [edits(a, b) for a, b in pairs] == [0, 1, 3, 2]
    examples = [Example("abc", "cba"), Example("ab", "ba")]
    task = MytaskTask(MytaskConfig())
    assert task.score(["cba", "b"], examples) == {"cer": 100 * 1 / 5, "exact_match": 50.0}


def test_a_tiny_run_trains_and_scores(tmp_path: Path) -> None:
    config = seqtrans.resolve_config("mytask", overrides=[
        "model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=16", "model.d_ff=32",
        "model.heads=2", "train.max_steps=4", "train.eval_every=2", "train.checkpoint_every=2",
        "train.max_minutes=0", "decode.beam=1"])
    metrics = seqtrans.run(config, tmp_path / "run", device="cpu")
    assert metrics["train_steps"] == 4 and metrics["test_sentences"] == 100
    cer, right = metrics["cer"], metrics["exact_match"]  # numbers (a metric may also be a string)
    assert isinstance(cer, float) and isinstance(right, float) and cer >= 0 and 0 <= right <= 100
