"""Ensembles of runs and scoring given pairs, through the Python API and the command line:
scores against a hand loop of teacher-forced log-softmax sums and against beam search's own
log-probabilities; the errors for mismatched vocabularies and malformed pair files."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import seqtrans
from seqtrans import cli, tasks
from seqtrans import config as cfg
from seqtrans.data.vocab import BOS, EOS
from seqtrans.decoding import beam_search
from seqtrans.decoding.ensemble import Ensemble
from seqtrans.decoding.generate import generate
from seqtrans.errors import DataError, UsageError
from seqtrans.inference.loading import Loaded, find_checkpoint, load, load_ensemble
from seqtrans.inference.scoring import score_files, score_ids
from seqtrans.linear.quantize import is_int8_only
from seqtrans.model.transformer import Transformer, build_model
from seqtrans.training import checkpoint

SMALL = ["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=16", "model.d_ff=32",
         "model.heads=2"]


#: ``seqtrans run copy --set ...`` of a model trained for four updates: a real run directory in seconds.
TINY_COPY_RUN = ["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=32", "model.d_ff=64",
                 "model.heads=2", "data.train_size=200", "data.dev_size=4", "data.test_size=6",
                 "data.max_length=6", "train.max_steps=4", "train.eval_every=4", "train.checkpoint_every=4",
                 "train.max_tokens=256", "train.max_minutes=0"]


def copy_run(directory: Path, *, seed: int, vocab_size: int = 10, model: tuple[str, ...] = (),
             change: Callable[[dict[str, torch.Tensor]], None] | None = None) -> Path:
    """A run directory holding an untrained (seeded) copy model over symbols 0 .. vocab_size-1
    (``model``: more settings; ``change`` edits the checkpoint's weights in place)."""
    config = seqtrans.resolve_config("copy", overrides=[*SMALL, *model, f"data.vocab_size={vocab_size}",
                                                   "data.test_size=6", "data.max_length=5",
                                                   "decode.beam=3", "decode.alpha=0.6"])
    vocab_dir = directory / "vocab"
    vocab_dir.mkdir(parents=True)
    codec = tasks.load("copy")(config.data).build_vocabulary(vocab_dir, [])
    torch.manual_seed(seed)
    net = build_model(config.model, codec)
    assets = {p.name: p.read_bytes() for p in sorted(vocab_dir.iterdir())}
    weights = net.state_dict()
    if change is not None:
        change(weights)
    payload = {"format": checkpoint.FORMAT, "config": cfg.to_dict(config), "assets": assets,
               "model": weights}
    checkpoint.save_atomic(payload, directory / "checkpoints" / "average.pt")
    return directory


@torch.no_grad()
def hand_scores(models: list[Transformer], sources: list[list[int]],
                targets: list[list[int]]) -> list[float]:
    """log P(y EOS | x), one pair at a time, position by position: each member's
    log-softmax over the whole prefix, averaged, renormalised, summed."""
    out = []
    for src, tgt in zip(sources, targets):
        total = 0.0
        prefix = [BOS]
        for token in [*tgt, EOS]:
            mean = sum(F.log_softmax(m(torch.tensor([src]), torch.tensor([prefix]))[0, -1].double(), dim=-1)
                       for m in models) / len(models)
            total += float(F.log_softmax(mean, dim=-1)[token])  # type: ignore[arg-type]
            prefix.append(token)
        out.append(total)
    return out


SOURCES = [[4, 5, 6, EOS], [7, EOS], [9, 8, 7, 6, 5, 4, EOS], [5, 5, EOS]]
TARGETS = [[4, 5, 6], [7, 7, 8, 9], [9], [5, 5]]


@pytest.mark.parametrize("count", [1, 2])
def test_scores_equal_a_hand_loop_of_log_softmax_sums_in_any_batch_order(tmp_path: Path, count: int) -> None:
    loaded = load_ensemble([copy_run(tmp_path / f"r{i}", seed=i) for i in range(count)], device="cpu")
    expected = hand_scores(loaded.models, SOURCES, TARGETS)
    with torch.no_grad():
        for batch_tokens in (1, 12, 1000):  # one pair a batch, a few, all at once
            got = score_ids(loaded.searcher, SOURCES, TARGETS, batch_tokens=batch_tokens,
                            device=torch.device("cpu"))
            assert [s.log_prob for s in got] == pytest.approx(expected, abs=1e-4)
            assert [s.tokens for s in got] == [len(t) + 1 for t in TARGETS]
    if count == 2:  # the ensemble's scores are not one member's
        assert [s.log_prob for s in got] != pytest.approx(hand_scores(loaded.models[:1], SOURCES, TARGETS),
                                                          abs=1e-3)


@pytest.mark.parametrize("count", [1, 2])
def test_the_score_of_a_beam_search_output_is_the_log_prob_the_search_reported(tmp_path: Path,
                                                                               count: int) -> None:
    loaded = load_ensemble([copy_run(tmp_path / f"r{i}", seed=5 + i) for i in range(count)], device="cpu")
    src = torch.tensor([[4, 5, 6, 7, EOS]])
    hyps = beam_search(loaded.searcher, src, beam=4, alpha=0.6, max_len=torch.tensor([6]), nbest=4)[0]
    with torch.no_grad():
        scores = score_ids(loaded.searcher, [src[0].tolist()] * len(hyps), [h.tokens for h in hyps],
                           batch_tokens=1000, device=torch.device("cpu"))
    for hyp, score in zip(hyps, scores):
        assert score.log_prob == pytest.approx(hyp.log_prob, abs=1e-4)
        assert score.normalized(0.6) == pytest.approx(hyp.score, abs=1e-4)


def test_runs_of_different_vocabularies_are_refused_naming_both(tmp_path: Path) -> None:
    a = copy_run(tmp_path / "a", seed=1)
    b = copy_run(tmp_path / "b", seed=2, vocab_size=12)
    with pytest.raises(UsageError, match=rf"^{a} and {b} cannot be ensembled: they were trained with "
                                         r"different vocabularies \(sha256 \w{12} and \w{12}\)"):
        load_ensemble([a, b], device="cpu")


def test_runs_of_different_architectures_ensemble(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    a = copy_run(tmp_path / "a", seed=1)
    b = copy_run(tmp_path / "b", seed=2, model=("model.d_model=8", "model.decoder_layers=2",
                                                "model.cross_attention=additive"))
    with caplog.at_level(logging.INFO, logger="seqtrans.inference.loading"):
        loaded = load_ensemble([a, b], device="cpu")
    assert isinstance(loaded.searcher, Ensemble) and len(loaded.searcher) == 2
    # which checkpoints are averaged is said (a glob may match more than meant)
    said = [r.getMessage() for r in caplog.records if "ensemble of 2 models" in r.getMessage()]
    assert len(said) == 1 and said[0].endswith(f": {find_checkpoint(a)}, {find_checkpoint(b)}")
    caplog.clear()
    assert isinstance(load(a, device="cpu"), Loaded) and load_ensemble([a], device="cpu").searcher is not None
    assert not load_ensemble([a], device="cpu").others  # one run decodes with the model itself
    assert not any("ensemble" in r.getMessage() for r in caplog.records)


def test_set_reaches_every_member_of_an_ensemble(tmp_path: Path) -> None:
    runs = [copy_run(tmp_path / f"r{i}", seed=i) for i in range(3)]
    overrides = ["decode.precision=int8", "decode.beam=2"]
    loaded = load_ensemble(runs, overrides=overrides, device="cpu")
    assert [is_int8_only(m) for m in loaded.models] == [True] * 3  # each loaded for int8, none kept in float
    # the members loaded one by one with the settings decode to the same bits
    alone = [load(run, overrides=overrides, device="cpu") for run in runs]
    sources = [[4, 5, 6, 7, EOS], [6, 5, EOS]]
    expected = generate(Ensemble([m.model for m in alone]), sources, alone[0].config.decode,
                        device=torch.device("cpu"))
    assert generate(loaded.searcher, sources, loaded.config.decode, device=torch.device("cpu")) == expected
    # where the later members missed the settings, they decoded through another int8 copy
    mixed = Ensemble([alone[0].model, *(load(run, device="cpu").model for run in runs[1:])])
    assert generate(mixed, sources, alone[0].config.decode, device=torch.device("cpu")) != expected


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("src", "tgt", "error"), [
    ("1 2\n3\n", "1 2\n", r"src.txt:2: .*src.txt has 2 lines, .*tgt.txt has 1"),
    ("1 2\n3\n", "1 2\n3\n4\n", r"tgt.txt:3: .*tgt.txt has 3 lines, .*src.txt has 2"),
    ("1 2\n\n", "1 2\n3\n", r"src.txt:2: empty line"),
    ("1 2\n3\n", "1 2\n \n", r"tgt.txt:2: empty line"),
])
def test_malformed_pair_files_name_file_and_line(tmp_path: Path, src: str, tgt: str, error: str) -> None:
    loaded = load(copy_run(tmp_path / "r", seed=1), device="cpu")
    with pytest.raises(DataError, match=error):
        score_files(loaded, write(tmp_path / "src.txt", src), write(tmp_path / "tgt.txt", tgt))


def test_cli_score_writes_one_line_per_pair_in_input_order(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    runs = [str(copy_run(tmp_path / f"r{i}", seed=i)) for i in range(2)]
    src = write(tmp_path / "src.txt", "0 1 2\n3\n5 4 3 2 1 0\n1 1\n")
    tgt = write(tmp_path / "tgt.txt", "0 1 2\n3 3 4 5\n5\n1 1\n")
    assert cli.main(["-q", "score", *runs, "--src", str(src), "--tgt", str(tgt), "--device", "cpu"]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    loaded = load_ensemble(runs, device="cpu")
    with torch.no_grad():  # copy symbol s is id s + 4
        expected = hand_scores(loaded.models, [[s + 4 for s in src] + [EOS] for src in ([0, 1, 2], [3],
                                                                                       [5, 4, 3, 2, 1, 0],
                                                                                       [1, 1])],
                               [[s + 4 for s in tgt] for tgt in ([0, 1, 2], [3, 3, 4, 5], [5], [1, 1])])
    assert [float(r[0]) for r in rows] == pytest.approx(expected, abs=1e-4)
    assert [int(r[2]) for r in rows] == [4, 5, 2, 3]
    per_token = [e / n for e, n in zip(expected, [4, 5, 2, 3])]
    assert [float(r[1]) for r in rows] == pytest.approx(per_token, abs=1e-4)
    out = tmp_path / "scores.tsv"
    assert cli.main(["-q", "score", *runs, "--src", str(src), "--tgt", str(tgt), "--normalize", "--out",
                     str(out)]) == 0
    normalized = [float(line.split("\t")[0]) for line in out.read_text().splitlines()]
    assert normalized == pytest.approx([e / ((5 + n) / 6) ** 0.6 for e, n in zip(expected, [4, 5, 2, 3])],
                                       abs=1e-4)
    short = write(tmp_path / "t2", "1\n")
    assert cli.main(["-q", "score", runs[0], "--src", str(src), "--tgt", str(short)]) == 1
    assert "src.txt:2: " in capsys.readouterr().err  # the first line without a partner


def test_cli_predict_and_evaluate_decode_with_an_ensemble(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    runs = [str(copy_run(tmp_path / f"r{i}", seed=i)) for i in range(2)]
    monkeypatch.setattr("sys.stdin", io.StringIO("1 2 3\n4 4\n"))
    assert cli.main(["-q", "predict", *runs, "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    loaded = load_ensemble(runs, device="cpu")
    preds, _ = loaded.decode([[1, 2, 3], [4, 4]])
    assert lines == [loaded.task.format(p) for p in preds]
    assert cli.main(["-q", "evaluate", *runs, "--split", "dev", "--device", "cpu",
                     "--set", "data.dev_size=5"]) == 0
    assert 0.0 <= json.loads(capsys.readouterr().out)["exact_match"] <= 1.0
    monkeypatch.setattr("sys.stdin", io.StringIO("1 2\n"))
    assert cli.main(["-q", "predict", *runs, "--stream"]) == 2
    assert "not an ensemble" in capsys.readouterr().err
    other = copy_run(tmp_path / "other", seed=3, vocab_size=12)
    assert cli.main(["-q", "evaluate", runs[0], str(other)]) == 2
    assert f"{runs[0]} and {other} cannot be ensembled" in capsys.readouterr().err
