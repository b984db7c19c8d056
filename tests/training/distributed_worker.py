"""One process of the multi-process tests (tests/training/test_distributed.py), run under
``torchrun`` for several ranks or plainly for one:

    python tests/training/distributed_worker.py train OUT_DIR STEPS ACCUMULATE [DEVICE]
    python tests/training/distributed_worker.py decode OUT_FILE

``train`` trains a tiny copy model on seeded pairs (no dropout, so that one process
and several compute the same updates) and writes, from rank 0, a line of
``OUT_DIR/updates.json`` (per update: its step, learning rate and global batches) and
``OUT_DIR/grads-STEPS.pt`` (the last update's gradients). ``decode`` decodes seeded
sources with the copy task's codec and writes the outputs from rank 0.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from seqtrans.config import DecodeConfig, ModelConfig, RunConfig, TrainConfig
from seqtrans.data.batches import Pairs
from seqtrans.model.transformer import Transformer
from seqtrans.training import distributed
from seqtrans.training.loop import Trainer

MODEL = ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2, dropout=0.0)


def copy_pairs(n: int, seed: int = 0) -> Pairs:
    rng = random.Random(seed)
    seqs = [[rng.randrange(4, 12) for _ in range(rng.randint(1, 8))] for _ in range(n)]
    return Pairs([s + [2] for s in seqs], seqs)


class RecordingTrainer(Trainer):
    """A trainer that notes the global batches and learning rate of each update."""

    records: list[dict[str, object]]

    def _updates(self) -> Iterator[list[np.ndarray]]:
        self.records = []
        for group in super()._updates():
            self.records.append({"step": self.state.step + 1, "lr": self.learning_rate(self.state.step + 1),
                                 "batches": [sorted(int(i) for i in b) for b in group]})
            yield group


def train(out: Path, steps: int, accumulate: int, device_name: str = "cpu") -> None:
    world = distributed.init(device_name, timeout=60)
    device = distributed.device_of(torch.device(device_name), world)
    config = RunConfig(task="test", model=MODEL, seed=3, train=TrainConfig(
        max_tokens=48, accumulate=accumulate, adam_eps=1e-6, warmup=10, max_steps=steps, checkpoint_every=4,
        eval_every=1000, log_every=1000, keep_checkpoints=5, average_last=1))
    torch.manual_seed(0)
    model = Transformer(MODEL, source_vocab_size=12, target_vocab_size=12, shared_vocab=True)
    trainer = RecordingTrainer(model, config, copy_pairs(60), directory=out, device=device,
                               world=world)
    trainer.fit()
    if world.main:  # the last update's gradients: after data parallelism, the averaged ones
        torch.save({n: p.grad for n, p in model.named_parameters()}, out / f"grads-{steps}.pt")
        with (out / "updates.json").open("a", encoding="utf-8") as f:
            f.write(json.dumps({"ranks": world.size, "updates": trainer.records}) + "\n")
    distributed.shutdown()


def decode(out: Path) -> None:
    from seqtrans import tasks
    from seqtrans.inference.evaluation import decode_sources

    distributed.init("cpu", timeout=60)
    task_cls = tasks.load("copy")
    task = task_cls(task_cls.Config(vocab_size=8, train_size=10))
    scratch = out.parent / f"vocab-{distributed.current().rank}"
    scratch.mkdir(exist_ok=True)
    codec = task.build_vocabulary(scratch, iter(()))
    rng = random.Random(5)
    sources = [[rng.randrange(8) for _ in range(rng.randint(1, 9))] for _ in range(37)]
    torch.manual_seed(0)
    model = Transformer(MODEL, source_vocab_size=len(codec.vocabularies.source),
                        target_vocab_size=len(codec.vocabularies.target), shared_vocab=True).eval()
    preds, hyps = decode_sources(model, codec, sources, DecodeConfig(beam=3, max_len_b=5, batch_tokens=20),
                                 device=torch.device("cpu"), spread=True)
    if distributed.current().main:
        out.write_text(json.dumps({"preds": preds, "scores": [[h.score for h in n] for n in hyps]}))
    distributed.shutdown()


if __name__ == "__main__":
    mode, target = sys.argv[1], Path(sys.argv[2])
    if mode == "train":
        train(target, int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:6])
    else:
        decode(target)
