"""A plugin scored by an error rate (``metric_mode = "min"``) drives early stopping and the
best checkpoint of a whole run: a drop counts as a gain."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from fake_plugins import install
from seqtrans import resolve_config
from seqtrans.pipeline import run
from seqtrans.training import checkpoint

TINY = ["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=16", "model.d_ff=32",
        "model.heads=2", "train.max_steps=40", "train.eval_every=2", "train.checkpoint_every=2",
        "train.keep_checkpoints=10", "train.average_last=1", "train.patience=2", "train.max_minutes=0",
        "train.max_tokens=64", "train.warmup=4", "decode.beam=1"]


def test_an_error_rate_stops_training_and_chooses_the_best_checkpoint(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    install(tmp_path / "site", "seqtrans-errors", "0.1", {"errors": "error_rate_task:ErrorRateTask"})
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for module in ("lines_task", "error_rate_task"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    data = tmp_path / "data.tsv"
    data.write_text("".join(f"{w} {v}\t{v} {w}\n" for w in "abcd" for v in "abcd"), encoding="utf-8")
    files = [f"data.{split}={data}" for split in ("train", "dev", "test")]
    config = resolve_config("errors", overrides=[*TINY, *files])
    from error_rate_task import ErrorRateTask

    # dev WER at updates 2, 4, 6, 8: higher-is-better would keep 40 and stop at 6
    monkeypatch.setattr(ErrorRateTask, "script", [40.0, 30.0, 35.0, 31.0, 99.0])
    metrics = run(config, tmp_path / "run", device="cpu")
    assert metrics["train_steps"] == 8  # two validations without a drop below 30
    log = [json.loads(line) for line in (tmp_path / "run" / "train.jsonl").read_text().splitlines()]
    assert [r["dev_wer"] for r in log if r.get("event") == "validation"] == [40.0, 30.0, 35.0, 31.0]
    best = checkpoint.load(tmp_path / "run" / "checkpoints" / checkpoint.BEST)
    assert (best["step"], best["best_metric"]) == (4, 30.0)
    at_4 = checkpoint.load(tmp_path / "run" / "checkpoints" / checkpoint.checkpoint_name(4))["model"]
    assert all(torch.equal(best["model"][k], at_4[k]) for k in at_4)
    assert metrics["wer"] == 99.0  # the test split scored once, after training
