"""mytask: word-level transduction of tab-separated files, source<TAB>target per line."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from seqtrans.config import option
from seqtrans.data.vocab import Vocab, Vocabularies
from seqtrans.errors import ConfigError, DataError
from seqtrans.tasks import Example, Skipped, TaskClass, check_split


@dataclass(frozen=True)
class MyConfig:
    """The run config's `data` section."""

    train: str = option("train.tsv", "Training file: source<TAB>target per line.")
    dev: str = option("dev.tsv", "Development file.")
    test: str = option("test.tsv", "Test file.")
    min_count: int = option(1, "Words seen fewer times in training are read as <unk>.")

    def __post_init__(self) -> None:
        if self.min_count < 1:
            raise ConfigError("data.min_count", f"must be at least 1, got {self.min_count}")


@dataclass(frozen=True)
class MyCodec:
    """Whitespace tokens of one vocabulary shared by both sides."""

    vocabularies: Vocabularies

    def source_tokens(self, source: str) -> list[str]:
        return source.split()

    def target_tokens(self, target: str) -> list[str]:
        return target.split()

    def prediction(self, tokens: list[str], source: str) -> str:
        return " ".join(tokens)


class MyTask:
    name = "mytask"
    Config = MyConfig
    metric = "exact_match"
    defaults: ClassVar[dict[str, Any]] = {
        "decode": {"beam": 4, "alpha": 0.6, "max_len_a": 1.2, "max_len_b": 10},
    }
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "default": {
            "model": {"encoder_layers": 3, "decoder_layers": 3, "d_model": 256, "d_ff": 1024, "heads": 4},
            "train": {"max_tokens": 4096, "warmup": 1000, "max_minutes": 30},
        },
    }

    def __init__(self, config: MyConfig) -> None:
        self.config = config

    def read(self, split: str) -> Iterator[Example[str, str] | Skipped]:
        check_split(split)
        return self._lines(Path(getattr(self.config, split)))

    def _lines(self, path: Path) -> Iterator[Example[str, str] | Skipped]:
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                fields = line.rstrip("\n").split("\t")
                if len(fields) != 2:
                    raise DataError(path, number, f"expected source<TAB>target, found {len(fields)} field(s)")
                origin = f"{path}:{number}"
                if not fields[0].split() or not fields[1].split():
                    yield Skipped(origin, "empty source or target")
                else:
                    yield Example(fields[0], fields[1], origin=origin)

    def build_vocabulary(self, directory: Path, train: Iterable[Example[str, str]]) -> MyCodec:
        sides = (side.split() for e in train for side in (e.source, e.target))
        vocab = Vocab.build(sides, min_count=self.config.min_count)
        vocab.save(directory / "vocab.txt")
        return MyCodec(Vocabularies(vocab, vocab))

    def load_vocabulary(self, directory: Path) -> MyCodec:
        vocab = Vocab.load(directory / "vocab.txt")
        return MyCodec(Vocabularies(vocab, vocab))

    def parse_source(self, line: str) -> str:
        return line

    def format(self, prediction: str) -> str:
        return prediction

    def score(self, predictions: Sequence[str], examples: Sequence[Example[str, str]]) -> dict[str, float]:
        right = sum(p == e.target for p, e in zip(predictions, examples))
        return {"exact_match": right / max(len(examples), 1)}


# mypy checks the class against the contract here
_contract: TaskClass[str, str, str] = MyTask
