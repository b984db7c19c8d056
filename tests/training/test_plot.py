"""`seqtrans plot`: learning curves from the runs' own logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fake_plugins import install
from seqtrans.errors import DataError, UsageError
from seqtrans.training.plot import _title, best_validation, curves, labels, plot, task_metric

PNG = b"\x89PNG\r\n\x1a\n"


def write_log(directory: Path, records: list[dict[str, object]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return directory


def test_a_resumed_run_keeps_the_later_record_of_an_update(tmp_path: Path) -> None:
    run = write_log(tmp_path / "run", [
        {"event": "train", "step": 1, "loss": 5.0, "seconds": 0.1},
        {"event": "train", "step": 2, "loss": 4.0, "seconds": 0.2},
        {"event": "validation", "step": 2, "dev_loss": 3.9, "dev_bleu": 1.0, "seconds": 0.2},
        {"event": "train", "step": 2, "loss": 4.1, "seconds": 0.25},  # done again after a resume
        {"event": "train", "step": 3, "loss": 3.0, "seconds": 0.3},
    ])
    found = curves(run)
    assert [(r["step"], r["loss"]) for r in found["train"]] == [(1, 5.0), (2, 4.1), (3, 3.0)]
    assert [r["dev_bleu"] for r in found["validation"]] == [1.0]


def test_a_bad_log_line_names_file_and_line(tmp_path: Path) -> None:
    run = write_log(tmp_path / "run", [{"event": "train", "step": 1, "loss": 5.0}])
    with (run / "train.jsonl").open("a") as f:
        f.write('{"event": "train"}\n')
    with pytest.raises(DataError, match=r"train.jsonl:2: not a log record"):
        curves(run)
    with pytest.raises(UsageError, match="not a run directory"):
        curves(tmp_path / "nothing")


def test_several_runs_are_drawn_into_one_png(tmp_path: Path) -> None:
    runs = [write_log(tmp_path / name, [
        {"event": "train", "step": s, "loss": 5.0 / s, "lr": 1e-4 * s, "tokens_per_s": 1000.0, "seconds": s}
        for s in range(1, 6)] + [{"event": "validation", "step": 5, "dev_loss": 1.0, "dev_f1": 50.0,
                                  "seconds": 5.0}]) for name in ("a", "b")]
    (runs[0] / "config.json").write_text('{"task": "copy"}')  # its dev metric marked at its best
    with (runs[0] / "train.jsonl").open("a") as f:
        f.write(json.dumps({"event": "validation", "step": 6, "dev_exact_match": 0.5, "seconds": 6.0}) + "\n")
    out = plot(runs, tmp_path / "figures" / "curves.png")
    assert out.read_bytes().startswith(PNG) and out.stat().st_size > 10_000
    assert [p.name for p in out.parent.iterdir()] == ["curves.png"]  # no temporary file left


def test_a_run_that_logged_too_little_is_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    thin = write_log(tmp_path / "thin", [{"event": "train", "step": 1, "loss": 5.0, "lr": 1e-4,
                                          "tokens_per_s": 900.0, "seconds": 0.5}])
    out = tmp_path / "curves.png"
    with pytest.raises(DataError, match=r"thin/train.jsonl: its log holds 1 training line\(s\) and 0 "
                                        r"validation\(s\), too little to draw a curve .*; nothing drawn$"):
        plot([thin], out)
    assert not out.exists()
    full = write_log(tmp_path / "full", [{"event": "train", "step": s, "loss": 5.0 / s, "lr": 1e-4,
                                          "tokens_per_s": 900.0, "seconds": s} for s in (1, 2)])
    with caplog.at_level("WARNING", logger="seqtrans.training.plot"):
        assert plot([full, thin], out).read_bytes().startswith(PNG)  # the thin run drawn as a point
    assert [r.getMessage().split(": ")[0] for r in caplog.records] == [str(thin / "train.jsonl")]


def test_runs_of_the_same_name_are_told_apart_by_their_paths(tmp_path: Path) -> None:
    assert labels([tmp_path / "x" / "one", tmp_path / "y" / "two"]) == ["one", "two"]
    same = [tmp_path / "a" / "run", tmp_path / "b" / "run"]
    assert labels(same) == [str(p) for p in same]


def test_the_best_validation_follows_the_direction_of_the_metric() -> None:
    records = [{"step": 2, "dev_wer": 40.0}, {"step": 4, "dev_wer": 30.0}, {"step": 5},
               {"step": 6, "dev_wer": 30.0}, {"step": 8, "dev_wer": 45.0}]
    best_min = best_validation(records, "dev_wer", "min")
    best_max = best_validation(records, "dev_wer", "max")
    assert best_min is not None and best_min["step"] == 4  # the first of equals, as early stopping counts
    assert best_max is not None and best_max["step"] == 8
    assert best_validation(records, "dev_bleu", "max") is None


def test_a_runs_task_says_which_metric_to_mark_and_its_direction(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    install(tmp_path / "site", "seqtrans-errors", "0.1", {"errors": "error_rate_task:ErrorRateTask"})
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name, task in (("copy", "copy"), ("errors", "errors"), ("gone", "not_installed")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"task": task}))
    assert task_metric(tmp_path / "errors") == ("dev_wer", "min")
    assert task_metric(tmp_path / "copy") == ("dev_exact_match", "max")
    assert task_metric(tmp_path / "gone") is None and task_metric(tmp_path / "nothing") is None
    assert _title("dev_wer", [("dev_wer", "min"), None]) == "dev wer (lower is better)"
    assert _title("dev_exact_match", [("dev_wer", "min")]) == "dev exact match"
