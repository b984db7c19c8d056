"""Faults during training, injected: damaged checkpoints, a full disk, losses that are
not finite, and signals. Each must cost at most the work since the last checkpoint."""

from __future__ import annotations

import errno
import logging
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from training.test_loop import copy_pairs, trainer

from seqtrans.errors import CheckpointError, Interrupted, TrainingError
from seqtrans.training import checkpoint


def final(directory: Path) -> dict[str, torch.Tensor]:
    return checkpoint.load(checkpoint.list_checkpoints(directory)[-1])["model"]  # type: ignore[no-any-return]


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run of 12 updates, checkpoints every 5."""
    directory = tmp_path_factory.mktemp("whole")
    trainer(directory, data=copy_pairs(40), max_steps=12).fit()
    return directory


# ---------------------------------------------------------------------- damaged checkpoints


def test_a_checkpoint_whose_content_changed_is_reported_as_damaged(tmp_path: Path) -> None:
    path = tmp_path / checkpoint.checkpoint_name(1)
    checkpoint.save_atomic({"format": checkpoint.FORMAT, "config": {}, "model": {"w": torch.ones(3)}}, path)
    payload = torch.load(path, weights_only=True)
    assert payload["digest"] == checkpoint.digest(payload)
    payload["model"]["w"][1] = 1.0000001  # one weight changed; the file itself is readable
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=f"{path.name}: damaged"):
        checkpoint.load(path)


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_resuming_falls_back_past_a_damaged_checkpoint(whole: Path, tmp_path: Path, damage: str) -> None:
    data = copy_pairs(40)
    trainer(tmp_path, data=data, max_steps=12).fit()  # checkpoints 5, 10 and 12
    newest = checkpoint.list_checkpoints(tmp_path)[-1]
    raw = bytearray(newest.read_bytes())
    if damage == "truncate":
        raw = raw[: len(raw) // 2]
    else:  # one byte of the largest tensor's data, inside the archive
        weight = checkpoint.load(newest)["model"]["target_embed.weight"]
        at = bytes(raw).index(weight.numpy().tobytes()[:64])
        raw[at + 7] ^= 0x40
    newest.write_bytes(bytes(raw))
    resumed = trainer(tmp_path, data=data, seed=5, max_steps=12)
    result = resumed.fit()
    assert result.losses and result.progress.step == 12  # updates 11 and 12 were done again
    assert (tmp_path / (newest.name + checkpoint.DAMAGED)).exists()  # kept aside, not deleted
    assert_same_weights(final(tmp_path), final(whole))  # and exactly as if nothing had happened


def test_averaging_refuses_a_damaged_checkpoint(whole: Path, tmp_path: Path) -> None:
    paths = checkpoint.list_checkpoints(whole)
    copy = tmp_path / paths[-1].name
    copy.write_bytes(paths[-1].read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=copy.name):
        checkpoint.average([paths[0], copy], tmp_path / "average.pt")
    assert not (tmp_path / "average.pt").exists()


def test_leftovers_of_an_interrupted_write_are_removed_on_resume(whole: Path, tmp_path: Path) -> None:
    for p in checkpoint.list_checkpoints(whole):
        (tmp_path / p.name).write_bytes(p.read_bytes())
    leftover = tmp_path / f".{checkpoint.checkpoint_name(15)}.abc123.tmp"
    leftover.write_bytes(b"half a checkpoint")
    trainer(tmp_path, data=copy_pairs(40), max_steps=12).fit()
    assert not leftover.exists()


# ---------------------------------------------------------------------- a full disk


def test_a_full_disk_stops_the_run_and_keeps_the_checkpoints_written(tmp_path: Path, monkeypatch) -> None:
    data = copy_pairs(40)
    trainer(tmp_path, data=data, max_steps=5).fit()
    before = {p.name: p.read_bytes() for p in checkpoint.list_checkpoints(tmp_path)}
    real_save = torch.save

    def full(obj: object, f: object) -> None:
        real_save(obj, f)  # type: ignore[arg-type]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(CheckpointError, match=f"{checkpoint.checkpoint_name(10)}: writing it failed: "
                                              "No space left on device"):
        trainer(tmp_path, data=data, max_steps=12).fit()
    assert {p.name: p.read_bytes() for p in checkpoint.list_checkpoints(tmp_path)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(before)  # no temporary file left
    monkeypatch.setattr(torch, "save", real_save)
    assert trainer(tmp_path, data=data, max_steps=12).fit().progress.step == 12  # space again: it resumes


# ---------------------------------------------------------------------- losses that are not finite


def test_an_update_with_a_nan_loss_is_skipped_and_named(tmp_path: Path, caplog) -> None:
    t = trainer(tmp_path, data=copy_pairs(40), max_steps=6)
    forward = t.loss_module.forward
    calls = {"n": 0}

    def poisoned(*args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        calls["n"] += 1
        loss, nll = forward(*args)
        return (loss * float("nan"), nll) if calls["n"] == 3 else (loss, nll)

    t.loss_module.forward = poisoned  # type: ignore[method-assign]
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    with caplog.at_level(logging.WARNING):
        result = t.fit()
    assert "update 3 skipped: its loss is not finite (1 in a row)" in caplog.text
    assert result.progress.step == 6 and result.progress.skipped_updates == 1
    assert all(torch.isfinite(p).all() for p in t.model.parameters())
    assert any(not torch.equal(p, before[n]) for n, p in t.model.named_parameters())


def test_updates_that_stay_not_finite_stop_the_run_naming_update_and_batch(tmp_path: Path) -> None:
    t = trainer(tmp_path, data=copy_pairs(40), max_steps=40, max_skipped=3)
    update = t._update

    def poisoning(group):  # type: ignore[no-untyped-def]
        if t.state.step == 20:  # a weight becomes NaN: every further update is NaN
            with torch.no_grad():
                t.model.target_embed.weight[5, 0] = float("nan")
        return update(group)

    t._update = poisoning  # type: ignore[method-assign]
    expected = (r"update 21: 3 updates in a row were skipped \(train.max_skipped\), the last because its "
                r"loss is not finite.*positions \[")
    with pytest.raises(TrainingError, match=expected):
        t.fit()
    assert t.state.step == 20 and t.state.skipped_updates == 3


# ---------------------------------------------------------------------- signals


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_writes_a_checkpoint_of_the_update_and_the_run_resumes(whole: Path, tmp_path: Path,
                                                                        signum: int) -> None:
    data = copy_pairs(40)
    t = trainer(tmp_path, data=data, max_steps=12)
    update = t._update

    def signalled(group):  # type: ignore[no-untyped-def]
        if t.state.step == 6:
            os.kill(os.getpid(), signum)  # arrives while update 7 is being computed
        return update(group)

    t._update = signalled  # type: ignore[method-assign]
    handler = signal.getsignal(signum)
    with pytest.raises(Interrupted, match=f"stopped by {signal.Signals(signum).name} at update 7") as caught:
        t.fit()
    assert caught.value.signum == signum
    assert checkpoint.list_checkpoints(tmp_path)[-1].name == checkpoint.checkpoint_name(7)
    assert signal.getsignal(signum) == handler  # restored
    trainer(tmp_path, data=data, seed=9, max_steps=12).fit()
    assert_same_weights(final(tmp_path), final(whole))


# ---------------------------------------------------------------------- out of GPU memory (simulated)


def out_of_memory_above(t, examples: int) -> None:  # type: ignore[no-untyped-def]
    """Make ``t``'s forward pass fail as CUDA does for batches of more than ``examples``."""
    forward = t.loss_module.forward

    def limited(src: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if src.size(0) > examples:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return forward(src, *rest)  # type: ignore[no-any-return]

    t.loss_module.forward = limited


def test_a_batch_out_of_memory_is_split_into_the_same_update(tmp_path: Path, caplog) -> None:
    grads = []
    for limit in (None, 3):
        t = trainer(tmp_path / str(limit), data=copy_pairs(8), max_steps=1)
        t.model.eval()  # no dropout, so both see the same function
        t.model.train = lambda mode=True, m=t.model: m  # type: ignore[method-assign]
        if limit:
            out_of_memory_above(t, limit)
        with caplog.at_level(logging.WARNING):
            t._update([np.arange(8)])  # 8 examples: fits in 4 parts of 2, after 3 tries
        grads.append({n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None})
    assert "out of GPU memory with its batches in 2 part(s); retrying with smaller parts" in caplog.text
    assert t.state.step == 1 and t.state.skipped_updates == 0
    for name, grad in grads[0].items():  # the same update, summed in another order
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-7, msg=name)
    result = trainer(tmp_path / "run", data=copy_pairs(40), max_steps=12)
    out_of_memory_above(result, 3)
    assert result.fit().progress.step == 12  # a whole run goes on


def test_a_batch_that_never_fits_is_skipped_and_counted(tmp_path: Path) -> None:
    t = trainer(tmp_path, data=copy_pairs(40), max_steps=12, max_skipped=2)
    out_of_memory_above(t, 0)
    with pytest.raises(TrainingError, match="update 1: 2 updates in a row were skipped .* the last because "
                                            "its batch does not fit in GPU memory even split in 8"):
        t.fit()
    assert t.state.skipped_updates == 2
