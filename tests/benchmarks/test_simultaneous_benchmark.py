"""The Multi30k simultaneous benchmark's results file: bad files are named with their
line, and the picture is drawn from a well-formed one; ``--train-only`` trains a model
and the one fine-tuned from it, and writes no results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import simultaneous_multi30k as bench
from conftest import ROOT

MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
TINY = ["model.d_model=32", "model.d_ff=64", "model.encoder_layers=1", "model.decoder_layers=1",
        "model.heads=2", "data.vocab_size=1000", "data.max_train_examples=48", "train.valid_max_examples=4"]


def _row(model: str, bleu: float, al: float, wait_k: int | None = None) -> dict[str, Any]:
    return {"model": model, "wait_k": wait_k, "bleu": bleu, "stream_al": al}


def test_a_malformed_results_file_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text('{\n  "benchmark": "simultaneous_multi30k",\n  "simultaneous": [\n    {"model": \n')
    with pytest.raises(SystemExit, match=rf"{path}:5: not valid JSON"):
        bench.read_results(path)


def test_another_benchmarks_file_and_incomplete_rows_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"benchmark": "decode_speed"}))
    with pytest.raises(SystemExit, match=rf"{other}:1: not this benchmark's results"):
        bench.read_results(other)
    incomplete = tmp_path / "incomplete.json"
    incomplete.write_text(json.dumps({"benchmark": "simultaneous_multi30k",
                                      "simultaneous": [_row("full", 30.0, 12.0), {"model": "multi-k"}]}))
    with pytest.raises(SystemExit, match=r"simultaneous row 2 lacks bleu, stream_al"):
        bench.read_results(incomplete)
    with pytest.raises(SystemExit, match=rf"{tmp_path / 'missing.json'}: No such file"):
        bench.read_results(tmp_path / "missing.json")


def test_the_picture_is_drawn_from_the_results(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "results.json"
    rows = [_row("full", 30.0, 12.0), _row("wait-3", 24.0, 3.1),
            *(_row("multi-k", 20.0 + k, k + 0.5, wait_k=k) for k in (1, 3, 5)),
            _row("milk-0.1", 27.0, 5.0), _row("milk-0.5", 25.0, 3.0)]
    path.write_text(json.dumps({"benchmark": "simultaneous_multi30k", "simultaneous": rows}))
    picture = tmp_path / "picture.png"
    bench.plot(bench.read_results(path), picture)
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("*.tmp.png"))


@pytest.mark.skipif(not MULTI30K.is_dir(), reason="needs the shared Multi30k files")
def test_train_only_trains_the_start_first_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    bench.main(["--part", "simultaneous", "--train-only", "--steps", "2", "--jobs", "1",
                "--set", *TINY, f"data.mirror={MULTI30K}", f"data.cache_dir={tmp_path / 'cache'}",
                "--work", str(tmp_path / "work"), "--out", str(out), "--models", "mocha-init-w2", "full"])
    for name in ("full", "mocha-init-w2"):
        assert (tmp_path / "work" / name / "metrics.json").is_file()
    config = json.loads((tmp_path / "work" / "mocha-init-w2" / "config.json").read_text())
    assert config["model"]["cross_attention"] == "mocha" and config["model"]["chunk_size"] == 2
    assert not out.exists()


@pytest.mark.skipif(not MULTI30K.is_dir(), reason="needs the shared Multi30k files")
def test_a_longer_model_continues_a_copy_of_the_budgets_run(tmp_path: Path) -> None:
    work = tmp_path / "work"
    common = ["--part", "simultaneous", "--train-only", "--steps", "2", "--jobs", "1",
              "--set", *TINY, f"data.mirror={MULTI30K}", f"data.cache_dir={tmp_path / 'cache'}",
              "--work", str(work), "--out", str(tmp_path / "results.json"), "--models"]
    with pytest.raises(SystemExit, match="continues monotonic-init-latency-noise3.5, which is not trained"):
        bench.main([*common, "monotonic-init-latency-noise3.5-long"])
    bench.main([*common, "full", "monotonic-init-latency-noise3.5", "monotonic-init-latency-noise3.5-long"])
    shorter, longer = work / "monotonic-init-latency-noise3.5", work / "monotonic-init-latency-noise3.5-long"
    assert json.loads((shorter / "metrics.json").read_text())["train_steps"] == 2
    assert json.loads((longer / "metrics.json").read_text())["train_steps"] == 4
    config = json.loads((longer / "config.json").read_text())
    assert config["train"]["max_steps"] == 4 and config["model"]["monotonic_noise"] == 3.5
    # the shorter run was copied, not moved, and the longer one continued it: its training log
    # is the shorter's (timings and all, which a run from the start would not repeat) and more
    assert (shorter / "checkpoints" / "checkpoint_00000002.pt").is_file()
    short_log = (shorter / "train.jsonl").read_text()
    long_log = (longer / "train.jsonl").read_text()
    assert short_log and long_log.startswith(short_log) and len(long_log) > len(short_log)
    assert (longer / "checkpoints" / "checkpoint_00000004.pt").is_file()
