"""A third-party task as a test fixture: word-level transduction of tab-separated
``source<TAB>target`` files. Built only on seqtrans's public API, as any plugin would be."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from seqtrans.config import option
from seqtrans.data.vocab import Vocab, Vocabularies
from seqtrans.errors import DataError
from seqtrans.tasks import Example, TaskClass, check_split


@dataclass(frozen=True)
class LinesConfig:
    train: str = option("", "Training file (source<TAB>target per line).")
    dev: str = option("", "Dev file.")
    test: str = option("", "Test file.")


@dataclass(frozen=True)
class LinesCodec:
    vocabularies: Vocabularies

    def source_tokens(self, source: str) -> list[str]:
        return source.split()

    def target_tokens(self, target: str) -> list[str]:
        return target.split()

    def prediction(self, tokens: list[str], source: str) -> str:
        return " ".join(tokens)


class LinesTask:
    name = "lines"
    Config = LinesConfig
    metric = "exact_match"
    defaults: ClassVar[dict[str, Any]] = {"decode": {"beam": 2, "alpha": 0.0, "max_len_b": 5}}
    presets: ClassVar[dict[str, Any]] = {"tiny": {"model": {"encoder_layers": 1, "decoder_layers": 1,
                                                            "d_model": 16, "d_ff": 32, "heads": 2}}}

    def __init__(self, config: LinesConfig) -> None:
        self.config = config

    def read(self, split: str) -> Iterator[Example[str, str]]:
        check_split(split)
        path = Path(getattr(self.config, split))
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                parts = line.rstrip("\n").split("\t")
                if len(parts) != 2:
                    raise DataError(path, n, f"expected source<TAB>target, found {len(parts)} field(s)")
                yield Example(parts[0], parts[1], origin=f"{path}:{n}")

    def build_vocabulary(self, directory: Path, train: Iterable[Example[str, str]]) -> LinesCodec:
        vocab = Vocab.build(w.split() for e in train for w in (e.source, e.target))
        vocab.save(directory / "vocab.txt")
        return LinesCodec(Vocabularies(vocab, vocab))

    def load_vocabulary(self, directory: Path) -> LinesCodec:
        vocab = Vocab.load(directory / "vocab.txt")
        return LinesCodec(Vocabularies(vocab, vocab))

    def parse_source(self, line: str) -> str:
        return line

    def format(self, prediction: str) -> str:
        return prediction

    def score(self, predictions: Sequence[str], examples: Sequence[Example[str, str]]) -> dict[str, float]:
        return {"exact_match": sum(p == e.target for p, e in zip(predictions, examples)) / len(examples)}


_contract: TaskClass[str, str, str] = LinesTask
