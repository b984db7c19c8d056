"""The copy task (Britz et al. 2017, section 4.1): reproduce, or reverse, a random sequence.

A complete task plugin in one file, written against the public API only; copy it to
start a new task. Registered in ``pyproject.toml``::

    [project.entry-points."seqtrans.tasks"]
    copy = "seqtrans_copy:CopyTask"

It shows optional abilities too: with ``data.constrain`` its codec restricts the
search (:class:`seqtrans.plugin.Constraining`), and its sequences have a text form
(:class:`seqtrans.plugin.TextForm`), so that a run may start from a pretrained
text-to-text model and keep its tokenizer (``seqtrans run copy --init RUN_DIR``).
Torch is imported only where the constraint is made, so that listing the installed
tasks does not load it.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from seqtrans.plugin import (
    EOS,
    ConfigError,
    Example,
    TaskClass,
    UsageError,
    Vocab,
    Vocabularies,
    check_split,
    option,
)

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["CopyCodec", "CopyConfig", "CopyTask"]

Symbols = list[int]  # a sequence, also the source, target and prediction type

_SPLIT_SEEDS = {"train": 0, "dev": 1, "test": 2}


@dataclass(frozen=True)
class CopyConfig:
    """The ``data`` section of a copy run."""

    vocab_size: int = option(20, "Number of distinct symbols (Britz et al.: 20).")
    max_length: int = option(20, "L: sequence lengths are uniform in min_length..L.")
    min_length: int = option(1, "Shortest sequence.")
    reverse: bool = option(False, "Reverse the sequence instead of copying it.")
    train_size: int = option(200_000, "Training sequences, generated from the seed.")
    dev_size: int = option(500, "Validation sequences.")
    test_size: int = option(1000, "Held-out test sequences (Britz et al.: 1,000).")
    seed: int = option(1, "Seed of the generated sequences; each split draws from its own stream.")
    constrain: bool = option(
        False, "Allow only symbols still unused in the source at each step (shows the constraint hook)."
    )
    cache_dir: str = option(
        "", "Where the run's prepared data is kept (under prepared/); empty uses $SEQTRANS_CACHE_DIR or "
        "~/.cache/seqtrans.")

    def __post_init__(self) -> None:
        if not 1 <= self.min_length <= self.max_length:
            raise ConfigError("data.min_length", f"must be in 1..max_length={self.max_length}")
        if self.vocab_size < 2:
            raise ConfigError("data.vocab_size", "must be at least 2")


@dataclass(frozen=True)
class CopyCodec:
    """Symbols as their decimal strings; ``constrain`` adds the permutation constraint."""

    vocabularies: Vocabularies
    constrain: bool = False

    def source_tokens(self, source: Symbols) -> list[str]:
        return [str(s) for s in source]

    def target_tokens(self, target: Symbols) -> list[str]:
        return [str(s) for s in target]

    def prediction(self, tokens: list[str], source: Symbols) -> Symbols:
        for token in tokens:
            if not isinstance(token, str):  # ids given for tokens would fail inside, as an AttributeError
                raise UsageError(f"prediction takes token strings, got the {type(token).__name__} {token!r}: "
                                 "pass vocabularies.target.decode(ids), or read a hypothesis's text")
        return [_symbol(t) for t in tokens]

    def constraint(self, sources: Sequence[Symbols]) -> _Unused | None:
        return _Unused(sources, self.vocabularies.target) if self.constrain else None


def _symbol(token: str) -> int:
    """A token's symbol; -1 for a non-symbol such as ``<unk>``, ``x`` or ``²`` (a digit to
    ``str.isdigit`` that ``int`` cannot read), and for a number of more digits than any
    vocabulary has symbols."""
    return int(token) if token.isascii() and token.isdigit() and len(token) <= 18 else -1


# A small model that learns L = 20 to >= 0.99 exact match in about 3 CPU minutes.
_SMALL = {
    "model": {"encoder_layers": 2, "decoder_layers": 2, "d_model": 64, "d_ff": 256, "heads": 4,
              "dropout": 0.0},
    "train": {"max_tokens": 2048, "warmup": 400, "lr_scale": 2.0, "max_steps": 3000,
              "max_minutes": 4.0, "eval_every": 500, "checkpoint_every": 100,
              "keep_checkpoints": 3, "average_last": 3, "log_every": 100},
}


class CopyTask:
    """Sequences of symbols ``0 .. vocab_size-1``, written as space-separated integers."""

    name = "copy"
    Config = CopyConfig
    metric = "exact_match"
    defaults: ClassVar[dict[str, Any]] = {
        "decode": {"beam": 1, "alpha": 0.0, "max_len_a": 1.0, "max_len_b": 5},
    }
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "default": _SMALL,
        "reverse": {**_SMALL, "data": {"reverse": True}},
    }

    def __init__(self, config: CopyConfig) -> None:
        self.config = config

    def read(self, split: str) -> Iterator[Example[Symbols, Symbols]]:
        check_split(split)
        return self._generate(split)

    def _generate(self, split: str) -> Iterator[Example[Symbols, Symbols]]:
        c = self.config
        size = {"train": c.train_size, "dev": c.dev_size, "test": c.test_size}[split]
        rng = random.Random(f"{c.seed}:{_SPLIT_SEEDS[split]}")
        for i in range(size):
            n = rng.randint(c.min_length, c.max_length)
            seq = [rng.randrange(c.vocab_size) for _ in range(n)]
            target = seq[::-1] if c.reverse else seq
            yield Example(seq, target, origin=f"{split}:{i + 1}")

    def build_vocabulary(self, directory: Path, train: Iterable[Example[Symbols, Symbols]]) -> CopyCodec:
        vocab = Vocab(str(s) for s in range(self.config.vocab_size))
        vocab.save(directory / "vocab.txt")
        return self._codec(vocab)

    def load_vocabulary(self, directory: Path) -> CopyCodec:
        return self._codec(Vocab.load(directory / "vocab.txt"))

    def _codec(self, vocab: Vocab) -> CopyCodec:
        return CopyCodec(Vocabularies(vocab, vocab), constrain=self.config.constrain)

    def parse_source(self, line: str) -> Symbols:
        return [_symbol(t) for t in line.split()]

    def format_source(self, source: Symbols) -> str:
        return " ".join(str(s) for s in source)

    def parse_target(self, line: str) -> Symbols:
        return self.parse_source(line)

    # the text form (seqtrans.plugin.TextForm): a run may keep a text-to-text model's codec

    def format_target(self, target: Symbols) -> str:
        return self.format_source(target)

    def parse_prediction(self, line: str, source: Symbols) -> Symbols:
        return self.parse_source(line)  # a word that is no symbol reads as -1, a wrong one

    def format(self, prediction: Symbols) -> str:
        return " ".join(str(s) if s >= 0 else "<unk>" for s in prediction)

    def score(self, predictions: Sequence[Symbols],
              examples: Sequence[Example[Symbols, Symbols]]) -> dict[str, float]:
        exact = sum(p == e.target for p, e in zip(predictions, examples))
        right = total = 0
        for p, e in zip(predictions, examples):
            total += max(len(p), len(e.target))
            right += sum(a == b for a, b in zip(p, e.target))
        n = max(len(examples), 1)
        return {"exact_match": exact / n, "token_accuracy": right / max(total, 1)}


class _Unused:
    """Allows each symbol as often as it occurs in the source, and the end only once
    all are used: every output is then a permutation of its source."""

    def __init__(self, sources: Sequence[Symbols], vocab: Vocab) -> None:
        import torch

        counts = torch.zeros(len(sources), len(vocab))  # [B, V]
        for i, src in enumerate(sources):
            for s in src:
                counts[i, vocab.index(str(s))] += 1
        self.counts = counts

    def allowed(self, prefix: Tensor, *, rows: Tensor, remaining: Tensor) -> Tensor:
        import torch

        counts = self.counts.to(prefix.device)[rows]  # [N, V]
        used = torch.zeros_like(counts).scatter_add_(1, prefix, torch.ones_like(prefix, dtype=counts.dtype))
        left = counts - used  # [N, V]
        mask = left > 0
        mask[:, EOS] = left.sum(dim=1) == 0
        return mask


# mypy checks the task against the contract here
_contract: TaskClass[Symbols, Symbols, Symbols] = CopyTask
