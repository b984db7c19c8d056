"""What the ranks agree on, on one process: every helper is the identity there, so one
process trains through the same code as many."""

from __future__ import annotations

from pathlib import Path

import torch

from seqtrans.training import ranks
from seqtrans.training.world import World


def test_one_process_keeps_its_module_clock_and_signal() -> None:
    module = torch.nn.Linear(2, 2)
    assert ranks.data_parallel(module, World(), torch.device("cpu")) is module
    assert ranks.agree(12.5, 0) == (12.5, 0)
    seconds, signum = ranks.agree(3.0, 15)
    assert (seconds, signum) == (3.0, 15) and isinstance(signum, int)


def test_only_rank_0_writes() -> None:
    assert ranks.main_only("run/train.jsonl", World(0, 2)) == Path("run/train.jsonl")
    assert ranks.main_only("run/train.jsonl", World(1, 2)) is None
    assert ranks.main_only(None, World()) is None
