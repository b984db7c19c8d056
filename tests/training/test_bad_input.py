"""Bad input the engine meets itself: a run directory holding another task's or another
vocabulary's checkpoint, and inputs at ``predict`` time with symbols the model has never
seen or more tokens than its learned positions reach."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

import seqtrans
from seqtrans import config as cfg
from seqtrans import tasks
from seqtrans.config import ModelConfig, RunConfig, TrainConfig
from seqtrans.data.batches import Pairs
from seqtrans.errors import CheckpointError, DataError, UsageError
from seqtrans.inference.evaluation import Split, score_examples
from seqtrans.inference.loading import Loaded
from seqtrans.inference.online import predict_batches
from seqtrans.model.transformer import Transformer, build_model
from seqtrans.tasks import Example
from seqtrans.training import checkpoint
from seqtrans.training.loop import Trainer

MODEL = ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2)


def _trainer(directory: Path, *, task: str = "copy", assets: dict[str, bytes] | None = None,
             model: ModelConfig = MODEL) -> Trainer:
    train = TrainConfig(max_steps=2, checkpoint_every=2, average_last=1, max_tokens=64, warmup=2)
    config = RunConfig(task=task, model=model, train=train)
    net = Transformer(model, source_vocab_size=12, target_vocab_size=12, shared_vocab=True)
    data = Pairs([[4, 5, 2], [6, 2]], [[4, 5], [6]])
    return Trainer(net, config, data, directory=directory, device=torch.device("cpu"),
                   assets=assets if assets is not None else {"vocab.txt": b"4\n5\n6\n"})


@pytest.mark.parametrize(("other", "words"), [
    ({"task": "parsing"}, "was written by a run of task 'copy', not 'parsing'"),
    ({"assets": {"vocab.txt": b"6\n5\n4\n"}}, "was written with another vocabulary"),
    ({"model": ModelConfig(encoder_layers=1, decoder_layers=1, d_model=32, d_ff=32, heads=2)},
     "was written for another model configuration"),
])
def test_a_checkpoint_of_another_task_or_vocabulary_is_not_resumed(tmp_path: Path, other: dict[str, object],
                                                                   words: str) -> None:
    _trainer(tmp_path).fit()  # writes checkpoint_00000002.pt
    with pytest.raises(CheckpointError, match=rf"checkpoint_00000002.pt: {words}; use a new output dir"):
        _trainer(tmp_path, **other).resume()  # type: ignore[arg-type]
    assert _trainer(tmp_path).resume()  # the same run goes on


def _loaded(tmp_path: Path, *overrides: str) -> Loaded:
    """An untrained copy model over the symbols 0 .. 9."""
    config = seqtrans.resolve_config("copy", overrides=["model.encoder_layers=1", "model.decoder_layers=1",
                                                   "model.d_model=16", "model.d_ff=32", "model.heads=2",
                                                   "data.vocab_size=10", *overrides])
    task = tasks.load("copy")(config.data)
    codec = task.build_vocabulary(tmp_path, [])
    return Loaded(config, task, codec, build_model(config.model, codec).eval(), torch.device("cpu"))


def test_symbols_the_model_has_never_seen_are_reported_with_their_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    loaded = _loaded(tmp_path)
    with caplog.at_level(logging.WARNING):
        outputs = list(predict_batches(loaded, [["1 2 3", "4 57 5 99"], ["6", "5 " + "7" * 120]]))
    assert len(outputs) == 4  # every input still has its output line
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    unseen = "symbol(s) the model has never seen, read as <unk>"
    assert warnings == [  # the input quoted, so the line is found at a glance
        f"<stdin>:2: 2 {unseen}: '57', '99', in the input '4 57 5 99'",
        f"<stdin>:4: 1 {unseen}: '-1', in the input '5 {'7' * 98}...'"]


def test_an_input_longer_than_the_learned_positions_names_its_line(tmp_path: Path) -> None:
    loaded = _loaded(tmp_path, "model.positions=learned", "model.max_positions=6")
    assert len(list(predict_batches(loaded, [["1 2 3 4 5"]]))) == 1  # five symbols and the end fit
    with pytest.raises(DataError, match=r"^<stdin>:3: 7 source tokens \(with the end symbol\), more than "
                                        r"the 6 positions the model learned \(model.max_positions\)$"):
        list(predict_batches(loaded, [["1", "2"], ["1 2 3 4 5 6"]]))
    # a split to score is checked before any of it is decoded, and the error names the example
    split = Split([Example([1, 2], [1, 2], "test.txt:1"), Example([1] * 6, [1] * 6, "test.txt:2")])
    with pytest.raises(DataError, match=r"^test.txt:2: 7 source tokens"):
        score_examples(loaded.model, loaded.task, loaded.codec, split, loaded.config.decode,
                       device=torch.device("cpu"))


def test_lines_before_a_line_that_cannot_be_decoded_are_written_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = _loaded(tmp_path, "model.positions=learned", "model.max_positions=6")
    outputs = []
    with pytest.raises(DataError, match=r"^<stdin>:4: 7 source tokens"):
        for line in predict_batches(loaded, [["1", "2"], ["3", "1 2 3 4 5 6", "4"]]):
            outputs.append(line)
    assert len(outputs) == 3  # the lines before the fourth, in the same batch as it too

    def parse(line: str) -> list[int]:
        if line == "x":
            raise DataError(None, None, "not a symbol: 'x'")
        return [int(t) for t in line.split()]

    monkeypatch.setattr(loaded.task, "parse_source", parse)
    outputs = []
    with pytest.raises(DataError, match=r"^<stdin>:2: not a symbol: 'x'$"):  # the task's error gets its line
        for line in predict_batches(loaded, [["1", "x", "2"]]):
            outputs.append(line)
    assert len(outputs) == 1


def test_a_run_saved_before_an_option_existed_still_continues(tmp_path: Path) -> None:
    """A model option added after a run was written (absent from its config.json and its
    checkpoints) reads as its default: continuing the run is not refused; a setting that
    really differs still is."""
    from seqtrans.pipeline import _check_resumable

    _trainer(tmp_path).fit()  # writes checkpoint_00000002.pt
    path = tmp_path / "checkpoint_00000002.pt"
    payload = checkpoint.load(path)
    del payload["config"]["model"]["monotonic_r_init"]  # as written before the option existed
    payload.pop("digest", None)
    checkpoint.save_atomic(payload, path)
    assert _trainer(tmp_path).resume()
    small = ["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=16", "model.d_ff=32",
             "model.heads=2"]
    config = seqtrans.resolve_config("copy", overrides=small)
    saved = cfg.to_dict(config)
    del saved["model"]["monotonic_r_init"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    _check_resumable(tmp_path, config)  # no error
    with pytest.raises(UsageError, match="different 'model' settings"):
        deeper = seqtrans.resolve_config("copy", overrides=[*small, "model.encoder_layers=2"])
        _check_resumable(tmp_path, deeper)
    # an option that no longer exists: off, the run needs converting; on, it cannot be
    saved["model"]["an_option_since_removed"] = False
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(UsageError, match=f"convert it with 'seqtrans upgrade {tmp_path}'"):
        _check_resumable(tmp_path, config)
    saved["model"]["an_option_since_removed"] = 1
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(UsageError, match="model.an_option_since_removed=1, an option this version of "
                                         "seqtrans no longer has"):
        _check_resumable(tmp_path, config)


def test_a_prefix_the_vocabulary_cannot_encode_names_its_line_and_the_others_decode(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    loaded = _loaded(tmp_path, "decode.constrained=false", "decode.max_len_b=3")
    outputs: list[str] = []
    with caplog.at_level(logging.ERROR), pytest.raises(
            DataError, match=r"^<stdin>:3: target prefix: 1 token\(s\) not in the model's target vocabulary: "
                             r"'-1' \(1 line\(s\) left without output; the other lines were decoded\)$"):
        for line in predict_batches(loaded, [["1 2 3\t3 2", "4 5"], ["6 6\tx 7", "7\t7 7 7 7 7 7"]],
                                    prefixes=True):
            outputs.append(line)
    assert len(outputs) == 4 and outputs[2] == ""
    assert outputs[0].split()[:2] == ["3", "2"] and outputs[3].split()[:6] == ["7"] * 6
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        "<stdin>:3: target prefix: 1 token(s) not in the model's target vocabulary: '-1'"]

