"""The built-in copy task: its data, its contract, its constraint, and that it learns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import seqtrans
from seqtrans import Loaded, RunConfig, build_model
from seqtrans.plugin import ConfigError, DecodeConfig, ModelConfig, UsageError, check_task
from seqtrans_copy import CopyConfig, CopyTask


def test_sequences_are_seeded_uniform_in_length_and_split_apart() -> None:
    task = CopyTask(CopyConfig(max_length=10, train_size=5000, test_size=5000))
    train = list(task.read("train"))
    assert train == list(task.read("train"))  # deterministic
    lengths = [len(e.source) for e in train]
    assert min(lengths) == 1 and max(lengths) == 10
    assert all(abs(lengths.count(n) / 5000 - 0.1) < 0.03 for n in range(1, 11))
    assert {s for e in train for s in e.source} == set(range(20))
    assert [e.source for e in train[:50]] != [e.source for e in list(task.read("test"))[:50]]
    assert all(e.target == e.source for e in train)
    rev = CopyTask(CopyConfig(reverse=True))
    assert all(e.target == e.source[::-1] for e in rev.read("dev"))


@pytest.mark.parametrize("options", [{}, {"reverse": True, "constrain": True}])
def test_copy_keeps_the_plugin_contract(tmp_path: Path, options: dict) -> None:
    scores = check_task(CopyTask(CopyConfig(**options)), tmp_path)
    assert scores["exact_match"] == 1.0


def test_the_constraint_makes_every_output_a_permutation_of_its_source(tmp_path: Path) -> None:
    task = CopyTask(CopyConfig(constrain=True, vocab_size=7, train_size=10))
    codec = task.build_vocabulary(tmp_path, list(task.read("train")))
    torch.manual_seed(3)
    model = build_model(ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=4,
                                    dropout=0.0), codec).eval()
    sources = [[1, 2, 2, 5], [6], [0, 0, 0]]
    loaded = Loaded(RunConfig(task="copy", data=task.config), task, codec, model, torch.device("cpu"))
    preds, _ = loaded.decode(sources, decode=DecodeConfig(beam=3, max_len_b=5))
    for src, pred in zip(sources, preds):
        assert sorted(pred) == sorted(src)


def test_metrics_with_and_without_the_constraint(tmp_path: Path) -> None:
    config = seqtrans.resolve_config("copy", overrides=[
        "data.constrain=true", "decode.compare_unconstrained=true", "data.train_size=200",
        "data.test_size=40", "data.dev_size=10", "train.max_steps=4", "train.checkpoint_every=4",
        "train.eval_every=4", "model.d_model=16", "model.heads=2", "model.d_ff=16"])
    metrics = seqtrans.run(config, tmp_path, device="cpu")
    assert {"exact_match", "unconstrained_exact_match", "unconstrained_token_accuracy"} <= set(metrics)
    # an untrained model copies nothing, but the constraint makes each output a permutation
    # of its source, so the constrained outputs have exactly the sources' lengths
    lines = (tmp_path / "predictions" / "test.txt").read_text().splitlines()
    tests = list(CopyTask(config.data).read("test"))
    assert [sorted(map(int, line.split())) for line in lines] == [sorted(e.source) for e in tests]


@pytest.mark.slow
def test_copy_learns_length_10_to_095_exact_match(tmp_path: Path) -> None:
    # The preset's model and its held-out test sequences. Batches of about 75 sequences at half
    # the preset's peak rate, reached at update 100, learn in fewer updates than its batches of
    # 300 (twice that rate at update 100 stalls); the rate falls to 0 over the second half
    # (train.cooldown), as a spike of the loss may come late, and the last three checkpoints are
    # 20 updates apart. 10,000 training sequences are one shard, prepared without worker processes.
    config = seqtrans.resolve_config("copy", overrides=[
        "data.max_length=10", "data.train_size=10000", "data.dev_size=200", "data.test_size=500",
        "train.max_tokens=512", "train.warmup=100", "train.lr_scale=0.5", "train.cooldown=0.5",
        "train.max_steps=600", "train.max_minutes=0", "train.eval_every=600", "train.checkpoint_every=20"])
    threads = torch.get_num_threads()
    # one thread, as the settings were tried; the other core is the other test process's
    torch.set_num_threads(1)
    try:
        metrics = seqtrans.run(config, tmp_path, device="cpu")
    finally:
        torch.set_num_threads(threads)
    print(json.dumps(metrics))
    assert metrics["train_steps"] == 600
    assert metrics["exact_match"] >= 0.95


def test_the_task_is_found_by_name() -> None:
    assert seqtrans.tasks.load("copy") is CopyTask


def test_subword_sampling_is_refused_for_a_task_that_cannot_sample(tmp_path: Path) -> None:
    config = seqtrans.resolve_config("copy", overrides=["train.subword_sampling=0.5"])
    with pytest.raises(ConfigError, match="train.subword_sampling.*cannot sample segmentations"):
        seqtrans.run(config, tmp_path / "run", device="cpu")
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_tokens_that_are_not_symbols_read_as_unknown_rather_than_fail() -> None:
    task = CopyTask(CopyConfig())
    # "²" and "٣" are digits to str.isdigit; the 30-digit number is no symbol of any vocabulary
    assert task.parse_source("3 ² 4 x ٣ " + "9" * 30 + " 07") == [3, -1, 4, -1, -1, -1, 7]
    assert task.format([3, -1, 4]) == "3 <unk> 4"


def test_a_prediction_from_ids_instead_of_tokens_is_refused_saying_what_to_pass(tmp_path: Path) -> None:
    codec = CopyTask(CopyConfig(vocab_size=5)).build_vocabulary(tmp_path, [])
    assert codec.prediction(codec.vocabularies.target.decode([5, 6]), [1, 2]) == [1, 2]
    with pytest.raises(UsageError, match=r"^prediction takes token strings, got the int 5: pass "
                                         r"vocabularies\.target\.decode\(ids\)"):
        codec.prediction([5, 6], [1, 2])  # type: ignore[list-item]
