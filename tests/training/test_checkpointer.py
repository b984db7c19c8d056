"""Saving and resuming the training state: what a checkpoint holds, under which name,
and that resuming gives back the model, optimizer, progress and random streams as
they were at the save, or refuses a checkpoint of another run."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch

from seqtrans.config import ModelConfig, RunConfig, TrainConfig
from seqtrans.errors import CheckpointError
from seqtrans.model.transformer import Transformer
from seqtrans.training import checkpoint
from seqtrans.training.progress import Progress
from seqtrans.training.resumption import Checkpointer
from seqtrans.training.world import SINGLE

MODEL = ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2)
CONFIG = RunConfig(task="test", model=MODEL, train=TrainConfig(keep_checkpoints=2, average_last=1))
ASSETS = {"vocab.txt": b"a\nb\n"}


def checkpointer(directory: Path, *, seed: int = 0, config: RunConfig = CONFIG,
                 assets: dict[str, bytes] = ASSETS) -> Checkpointer:
    torch.manual_seed(seed)
    model = Transformer(config.model, source_vocab_size=12, target_vocab_size=12, shared_vocab=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.tensor([[4, 5, 2]]), torch.tensor([[1, 4, 5]])).sum().backward()
    optimizer.step()  # moments to save
    return Checkpointer(directory, config=config, assets=assets, model=model, optimizer=optimizer,
                        scaler=torch.amp.GradScaler("cpu", enabled=False), world=SINGLE)


def test_a_checkpoint_holds_the_training_state_under_the_steps_name(tmp_path: Path) -> None:
    saver = checkpointer(tmp_path)
    progress = Progress(step=3, epoch=2, batch_in_epoch=5, best_metric=0.5, target_tokens=99, seconds=1.5)
    path = saver.save(progress)
    assert path == tmp_path / "checkpoint_00000003.pt"
    payload = checkpoint.load(path)
    assert list(payload) == ["format", "config", "assets", "model", "optimizer", "progress", "rng",
                             "rng_ranks", "digest"]  # no "scaler" without fp16
    assert payload["progress"] == dataclasses.asdict(progress)
    assert payload["assets"] == ASSETS and payload["config"]["task"] == "test"
    assert len(payload["rng_ranks"]) == 1
    assert torch.equal(payload["rng"]["torch"], payload["rng_ranks"][0]["torch"])
    for step in (4, 5):
        saver.save(dataclasses.replace(progress, step=step))
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == \
        ["checkpoint_00000004.pt", "checkpoint_00000005.pt"]  # train.keep_checkpoints=2


def test_resuming_gives_back_the_state_of_the_save(tmp_path: Path) -> None:
    assert checkpointer(tmp_path).resume() is None  # nothing to resume from
    saver = checkpointer(tmp_path)
    saver.save(Progress(step=7, epoch=3, batch_in_epoch=2, stop_reason="reached 7 updates",
                        skipped_updates=1))
    expected_draws = (torch.rand(4), random.random())  # what the run would draw next
    resumer = checkpointer(tmp_path, seed=5)  # another initialisation, other random states
    progress = resumer.resume()
    assert progress == Progress(step=7, epoch=3, batch_in_epoch=2, skipped_updates=1)  # stop reason cleared
    assert torch.equal(torch.rand(4), expected_draws[0]) and random.random() == expected_draws[1]
    for (name, a), b in zip(saver.model.state_dict().items(), resumer.model.state_dict().values()):
        assert torch.equal(a, b), name
    saved, restored = saver.optimizer.state_dict()["state"], resumer.optimizer.state_dict()["state"]
    assert saved.keys() == restored.keys()
    for key in saved:
        assert all(torch.equal(saved[key][k], restored[key][k]) for k in saved[key]), key


@pytest.mark.parametrize("other,message", [
    ({"config": RunConfig(task="other", model=MODEL)}, "written by a run of task 'test', not 'other'"),
    ({"config": RunConfig(task="test", model=dataclasses.replace(MODEL, d_ff=64))},
     "written for another model configuration"),
    ({"assets": {"vocab.txt": b"b\na\n"}}, "written with another vocabulary"),
])
def test_a_checkpoint_of_another_run_is_refused(tmp_path: Path, other: dict[str, object],
                                                message: str) -> None:
    checkpointer(tmp_path).save(Progress(step=1))
    with pytest.raises(CheckpointError, match=message):
        checkpointer(tmp_path, **other).resume()  # type: ignore[arg-type]


def test_a_model_only_checkpoint_cannot_be_resumed_from(tmp_path: Path) -> None:
    saver = checkpointer(tmp_path)
    saver.save(Progress(step=1))
    checkpoint.average([tmp_path / checkpoint.checkpoint_name(1)], tmp_path / checkpoint.checkpoint_name(2))
    with pytest.raises(CheckpointError, match="holds no training state to resume from"):
        checkpointer(tmp_path).resume()
