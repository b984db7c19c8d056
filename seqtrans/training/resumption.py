"""Saving and resuming a training run: what a training checkpoint holds (the run's
config and vocabulary files, the model, optimizer and fp16 loss scale, the progress
with its data position, every rank's random state), the model of the best validation
(``best.pt``), and the checks before resuming from one. The files themselves (atomic
writes, digests, pruning) are :mod:`seqtrans.training.checkpoint`'s."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from seqtrans.config import RunConfig, same_settings, to_dict
from seqtrans.errors import CheckpointError
from seqtrans.training import checkpoint, distributed
from seqtrans.training.distributed import World
from seqtrans.training.progress import Progress
from seqtrans.training.runlog import log


def rng_state() -> dict[str, Any]:
    """This process's random state: torch's, Python's and, where there is one, CUDA's."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_rank(seed: int, rank: int, step: int) -> None:
    """Dropout of rank > 0 draws from its own stream (rank 0 keeps the run's, so one
    process trains as it always did)."""
    mixed = (seed * 1_000_003 + rank * 10_007 + step) % 2**63
    torch.manual_seed(mixed)
    random.seed(mixed)


class Checkpointer:
    """Writes the training state to ``directory`` (keeping the newest ``keep``) and
    resumes from the newest usable checkpoint there."""

    def __init__(self, directory: Path, *, config: RunConfig, assets: Mapping[str, bytes],
                 model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler, world: World) -> None:
        self.directory = directory
        self.config = config
        self.assets = assets
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler
        self.world = world

    def save(self, progress: Progress) -> Path:
        """Rank 0 writes a checkpoint with every rank's random state; the others wait."""
        rngs = distributed.gather_all(rng_state())
        path = self.directory / checkpoint.checkpoint_name(progress.step)
        if self.world.main:
            payload = {
                "format": checkpoint.FORMAT,
                "config": to_dict(self.config),
                "assets": self.assets,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "progress": asdict(progress),
                "rng": rngs[0],
                "rng_ranks": rngs,
            }
            if self.scaler.is_enabled():
                payload["scaler"] = self.scaler.state_dict()
            checkpoint.save_atomic(payload, path)
            checkpoint.prune(self.directory, self.config.train.keep_checkpoints)
        distributed.barrier()
        return path

    def save_best(self, progress: Progress) -> None:
        """Rank 0 writes the model as :data:`checkpoint.BEST`: the validation just made is the
        best so far (``progress.best_metric``, at ``progress.best_step``)."""
        if self.world.main:
            checkpoint.save_atomic({"format": checkpoint.FORMAT, "config": to_dict(self.config),
                                    "assets": self.assets, "model": self.model.state_dict(),
                                    "step": progress.best_step, "best_metric": progress.best_metric},
                                   self.directory / checkpoint.BEST)

    def resume(self) -> Progress | None:
        """Restore the newest usable checkpoint in the directory and return its progress,
        or None when there is none; damaged ones are set aside and reported
        (:func:`checkpoint.load_newest`). It may have been written by another number of
        ranks: the data position is global, and a rank the checkpoint has no random state
        for seeds its own from the step."""
        chosen: str | None = None
        if self.world.main:  # one rank judges the files, so all resume from the same one
            checkpoint.remove_temporary(self.directory)
            newest = checkpoint.load_newest(self.directory)
            chosen = str(newest[0]) if newest else None
        chosen = distributed.broadcast(chosen)
        if chosen is None:
            return None
        path = Path(chosen)
        payload = newest[1] if self.world.main and newest else checkpoint.load(path)
        self._check(path, payload)
        try:
            self.model.load_state_dict(payload["model"])
        except RuntimeError as exc:
            raise CheckpointError(f"{path}: weights do not fit the model: {exc}") from None
        self.optimizer.load_state_dict(payload["optimizer"])
        if "scaler" in payload and self.scaler.is_enabled():
            self.scaler.load_state_dict(payload["scaler"])
        progress = Progress(**payload["progress"])
        progress.stop_reason = ""
        rngs = payload.get("rng_ranks") or [payload["rng"]]
        if self.world.rank < len(rngs):
            set_rng_state(rngs[self.world.rank])
        else:
            seed_rank(self.config.seed, self.world.rank, progress.step)
        log.info("resumed from %s at step %d", path, progress.step)
        return progress

    def _check(self, path: Path, payload: Mapping[str, Any]) -> None:
        """A CheckpointError unless this run may continue from ``payload``."""
        if "optimizer" not in payload:
            raise CheckpointError(f"{path}: holds no training state to resume from")
        saved = payload["config"]
        if saved.get("task") != self.config.task:
            raise CheckpointError(f"{path}: was written by a run of task '{saved.get('task')}', not "
                                  f"'{self.config.task}'; use a new output directory")
        if not same_settings(saved.get("model"), self.config.model):
            raise CheckpointError(
                f"{path}: was written for another model configuration; use a new output directory"
            )
        if payload.get("assets", {}) != self.assets:  # same shapes, other symbols: would train on nonsense
            raise CheckpointError(f"{path}: was written with another vocabulary; use a new output "
                                  "directory")
