"""Checkpoints: atomic writes, pruning, averaging, clear errors."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch

from conftest import tiny_model
from seqtrans.errors import CheckpointError
from seqtrans.training import checkpoint


def write(path: Path, model: torch.nn.Module) -> None:
    checkpoint.save_atomic({"format": checkpoint.FORMAT, "config": {}, "assets": {"vocab.txt": b"a\n"},
                            "model": model.state_dict()}, path)


def test_average_equals_the_mean_of_the_parameters(tmp_path: Path) -> None:
    models = [tiny_model(seed=s) for s in range(3)]
    paths = [tmp_path / checkpoint.checkpoint_name(i) for i in range(3)]
    for m, p in zip(models, paths):
        write(p, m)
    out = checkpoint.average(paths, tmp_path / "avg.pt")
    averaged = checkpoint.load(out)["model"]
    for name in models[0].state_dict():
        mean = sum(m.state_dict()[name] for m in models) / 3
        torch.testing.assert_close(averaged[name], mean, atol=1e-7, rtol=1e-6)
    assert checkpoint.load(out)["assets"] == {"vocab.txt": b"a\n"}


def test_a_crash_while_saving_leaves_the_old_checkpoint_intact(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "checkpoint_00000001.pt"
    write(path, tiny_model(seed=0))
    before = path.read_bytes()

    def crash(obj: object, f: object) -> None:
        f.write(b"half a checkpoint")  # type: ignore[attr-defined]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(CheckpointError, match="checkpoint_00000001.pt: writing it failed: No space left on "
                                              "device .nothing was replaced"):
        write(path, tiny_model(seed=1))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


def test_prune_keeps_the_newest(tmp_path: Path) -> None:
    for step in (5, 10, 15, 20):
        write(tmp_path / checkpoint.checkpoint_name(step), tiny_model())
    checkpoint.prune(tmp_path, 2)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == [
        checkpoint.checkpoint_name(15), checkpoint.checkpoint_name(20)]


def test_unreadable_or_foreign_files_are_reported(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="bad.pt"):
        checkpoint.load(bad)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": 1}, foreign)
    with pytest.raises(CheckpointError, match="not a seqtrans checkpoint"):
        checkpoint.load(foreign)
    with pytest.raises(CheckpointError, match="no such"):
        checkpoint.load(tmp_path / "missing.pt")
