"""Data-parallel training and decoding: several CPU processes (gloo, started by torchrun)
against one process doing the same work sequentially."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from distributed_worker import copy_pairs

from seqtrans.training import checkpoint, distributed
from seqtrans.training.distributed import World

WORKER = Path(__file__).with_name("distributed_worker.py")
STEPS = 12


def clean_env() -> dict[str, str]:
    """This process's environment without the variables of a surrounding torchrun."""
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "GROUP_RANK", "TORCHELASTIC_RUN_ID")
    return {k: v for k, v in os.environ.items() if k not in names}


def launch(nproc: int, *args: str) -> subprocess.CompletedProcess[str]:
    """The worker in ``nproc`` processes under torchrun, or plainly for one."""
    cmd = [sys.executable, str(WORKER), *args]
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={nproc}", *cmd[1:]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=clean_env())
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def train(directory: Path, nproc: int, steps: int, accumulate: int, device: str = "cpu") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    launch(nproc, "train", str(directory), str(steps), str(accumulate), device)


def updates(directory: Path) -> list[dict[str, Any]]:
    """The updates of every run in the directory, in order."""
    lines = (directory / "updates.json").read_text(encoding="utf-8").splitlines()
    return [u for line in lines for u in json.loads(line)["updates"]]


def final_weights(directory: Path) -> dict[str, torch.Tensor]:
    return checkpoint.load(checkpoint.list_checkpoints(directory)[-1])["model"]  # type: ignore[no-any-return]


def assert_weights_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    # Adam divides each gradient by its running magnitude: a rounding difference in a
    # gradient that is zero in exact arithmetic (the key biases') becomes a step of up to
    # lr * g / (|g| + eps); the tests' eps of 1e-6 keeps that below 1e-3
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-3, msg=name)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One process accumulating two batches per update, for STEPS updates."""
    directory = tmp_path_factory.mktemp("one")
    train(directory, 1, STEPS, 2)
    return directory


def test_two_ranks_make_the_updates_of_one_process_accumulating_two(one_process: Path,
                                                                   tmp_path: Path) -> None:
    train(tmp_path, 2, STEPS, 1)
    assert updates(tmp_path) == updates(one_process)  # the same batches and learning rates
    one = torch.load(one_process / f"grads-{STEPS}.pt")
    two = torch.load(tmp_path / f"grads-{STEPS}.pt")
    for name in one:  # the averaged gradients are those of one process, to rounding
        scale = float(one[name].abs().max())
        torch.testing.assert_close(two[name], one[name], rtol=1e-3, atol=1e-4 * scale, msg=name)
    assert_weights_close(final_weights(tmp_path), final_weights(one_process))


@pytest.mark.parametrize("first,then", [(2, 1), (1, 2)])
def test_a_run_resumes_on_another_number_of_ranks(one_process: Path, tmp_path: Path,
                                                  first: int, then: int) -> None:
    # the same global batch on either number of ranks: ranks x accumulate = 2
    train(tmp_path, first, STEPS // 2, 2 // first)
    train(tmp_path, then, STEPS, 2 // then)
    whole = updates(one_process)
    resumed = updates(tmp_path)
    assert [u["step"] for u in resumed] == list(range(1, STEPS + 1))
    assert resumed[STEPS // 2:] == whole[STEPS // 2:]  # the same next batches and learning rates
    assert checkpoint.load(checkpoint.list_checkpoints(tmp_path)[-1])["progress"]["step"] == STEPS
    assert_weights_close(final_weights(tmp_path), final_weights(one_process))


# ---------------------------------------------------------------------- dealing


def dealt(pairs: int, ranks: int, accumulate: int, *, max_epochs: int, steps: int = 10_000
          ) -> tuple[list[list[list[int]]], list[list[np.ndarray]]]:
    """What each rank gets per update (batch numbers in the epoch, -1 for a zero-weight
    slot), and the epochs' batches, for a run of ``max_epochs``."""
    from seqtrans.config import ModelConfig, RunConfig, TrainConfig
    from seqtrans.model.transformer import Transformer
    from seqtrans.training.loop import Trainer

    model_config = ModelConfig(encoder_layers=1, decoder_layers=1, d_model=8, d_ff=8, heads=1)
    config = RunConfig(task="test", model=model_config, seed=1, train=TrainConfig(
        max_tokens=24, accumulate=ranks * accumulate, max_epochs=max_epochs, max_steps=steps))
    model = Transformer(model_config, source_vocab_size=12, target_vocab_size=12, shared_vocab=True)
    # one process with ranks x accumulate batches per update sees the ranks' global updates
    trainer = Trainer(model, config, copy_pairs(pairs), directory=".", device=torch.device("cpu"))
    epochs = [trainer._epoch_batches(e) for e in range(1, max_epochs + 1)]
    trainer._epoch_batches = lambda e: epochs[e - 1]  # type: ignore[method-assign]  # the same arrays
    where = {id(b): (e, j) for e, batches in enumerate(epochs) for j, b in enumerate(batches)}
    per_rank: list[list[list[int]]] = [[] for _ in range(ranks)]
    for group in trainer._updates():
        for r in range(ranks):
            slots = distributed.deal(group, World(r, ranks), accumulate)
            assert len(slots) == accumulate  # every rank runs the same number of steps
            per_rank[r].append([-1 if b is None else where[id(b)][0] * 1000 + where[id(b)][1]
                                for b in slots])
    return per_rank, epochs


@pytest.mark.parametrize("pairs,ranks,accumulate", [(60, 2, 1), (60, 3, 2), (61, 4, 1), (7, 4, 1),
                                                    (1, 3, 2)])
def test_dealing_covers_each_batch_once_per_epoch_with_equal_updates(pairs: int, ranks: int,
                                                                     accumulate: int) -> None:
    per_rank, epochs = dealt(pairs, ranks, accumulate, max_epochs=2)
    assert len({len(updates) for updates in per_rank}) == 1  # the same number of updates
    seen = sorted(b for updates in per_rank for slots in updates for b in slots if b >= 0)
    expected = sorted(e * 1000 + j for e, batches in enumerate(epochs) for j in range(len(batches)))
    assert seen == expected  # every batch of every epoch exactly once
    if sum(len(b) for b in epochs) < ranks:  # fewer batches than ranks: zero-weight slots
        assert any(b == -1 for updates in per_rank for slots in updates for b in slots)


def test_deal_gives_rank_r_every_ranks_th_batch() -> None:
    group = list("abcde")
    assert distributed.deal(group, World(0, 2), 3) == ["a", "c", "e"]
    assert distributed.deal(group, World(1, 2), 3) == ["b", "d", None]
    with pytest.raises(ValueError):
        distributed.deal(group, World(0, 1), 2)


def test_spread_shares_inputs_by_length() -> None:
    lengths = [5, 1, 9, 3, 7, 2, 8]
    shares = [distributed.spread(lengths, World(r, 3)) for r in range(3)]
    assert sorted(np.concatenate(shares).tolist()) == list(range(7))
    assert all(np.all(np.diff(s) > 0) for s in shares)  # ascending: decoded in input order


# ---------------------------------------------------------------------- decoding


def test_decoding_spread_over_ranks_equals_one_process(tmp_path: Path) -> None:
    launch(1, "decode", str(tmp_path / "one.json"))
    launch(3, "decode", str(tmp_path / "three.json"))
    one = json.loads((tmp_path / "one.json").read_text())
    three = json.loads((tmp_path / "three.json").read_text())
    assert len(one["preds"]) == 37
    assert three["preds"] == one["preds"]
    np.testing.assert_allclose(three["scores"], one["scores"], rtol=1e-5)
