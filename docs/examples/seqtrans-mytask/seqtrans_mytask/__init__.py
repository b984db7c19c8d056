"""mytask: a seqtrans task, made by `seqtrans new-task`.

As generated it reverses the letters of short words ("abc" -> "cba"): a toy with
built-in data that trains in seconds. Keep the shape and replace the parts: the reader
(`read`), the codec (tokens and back), the metric (`score`) and the settings.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from seqtrans.plugin import (
    ConfigError,
    DataError,
    Example,
    Skipped,
    TaskClass,
    Vocab,
    Vocabularies,
    check_split,
    option,
)

#: The built-in toy data: how many examples each split has, and their letters.
TOY_SIZES = {"train": 3000, "dev": 100, "test": 100}
LETTERS = "abcdefgh"


@dataclass(frozen=True)
class MytaskConfig:
    """The run config's `data` section: `--set data.KEY=VALUE`."""

    train: str = option("", "Training file, source<TAB>target per line; empty: the built-in toy data.")
    dev: str = option("", "Development file; empty: the built-in toy data.")
    test: str = option("", "Test file; empty: the built-in toy data.")
    max_letters: int = option(20, "Training examples whose source has more letters are left out.")

    def __post_init__(self) -> None:
        if self.max_letters < 1:
            raise ConfigError("data.max_letters", f"must be at least 1, got {self.max_letters}")


@dataclass(frozen=True)
class MytaskCodec:
    """Letters as tokens, in one vocabulary shared by both sides. Pickles: it holds data only."""

    vocabularies: Vocabularies

    def source_tokens(self, source: str) -> list[str]:
        return list(source)

    def target_tokens(self, target: str) -> list[str]:
        return list(target)

    def prediction(self, tokens: list[str], source: str) -> str:
        return "".join(tokens)


def toy_examples(split: str) -> list[Example[str, str]]:
    """Words of 1 to 6 letters and their reversals; the same every time (a seed per split)."""
    rng = random.Random(f"mytask-{split}")
    words = ["".join(rng.choice(LETTERS) for _ in range(rng.randint(1, 6))) for _ in range(TOY_SIZES[split])]
    return [Example(w, w[::-1], origin=f"<toy {split}>:{i}") for i, w in enumerate(words, 1)]


def edits(a: str, b: str) -> int:
    """The Levenshtein distance: insertions, deletions and substitutions turning a into b."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


class MytaskTask:
    name = "mytask"
    Config = MytaskConfig
    metric = "cer"
    metric_mode = "min"  # an error rate: lower is better, for validation and early stopping
    stream_unit = "characters"  # --stream reads letters as they arrive, not words
    defaults: ClassVar[dict[str, Any]] = {
        "decode": {"beam": 2, "alpha": 0.0, "max_len_a": 1.0, "max_len_b": 4},
    }
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "default": {  # tiny: trains in seconds on a CPU
            "model": {"encoder_layers": 2, "decoder_layers": 2, "d_model": 32, "d_ff": 64, "heads": 2,
                      "dropout": 0.0},
            "train": {"max_tokens": 512, "warmup": 100, "max_steps": 300, "max_minutes": 1.0,
                      "eval_every": 100, "checkpoint_every": 100, "log_every": 50},
        },
    }

    def __init__(self, config: MytaskConfig) -> None:
        self.config = config

    def read(self, split: str) -> Iterator[Example[str, str] | Skipped]:
        check_split(split)
        path = getattr(self.config, split)
        items = self._lines(Path(path)) if path else iter(toy_examples(split))
        for item in items:
            if split == "train" and isinstance(item, Example) and len(item.source) > self.config.max_letters:
                yield Skipped(item.origin, f"more than data.max_letters={self.config.max_letters} letters")
            else:
                yield item  # dev and test examples are never left out: predictions keep their order

    def _lines(self, path: Path) -> Iterator[Example[str, str] | Skipped]:
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                fields = line.rstrip("\n").split("\t")
                if len(fields) != 2:
                    raise DataError(path, number, f"expected source<TAB>target, found {len(fields)} field(s)")
                source, target = fields[0].strip(), fields[1].strip()
                if not source or not target:
                    yield Skipped(f"{path}:{number}", "empty source or target")
                elif any(ch.isspace() for ch in source + target):
                    raise DataError(path, number, "a source or target holds white space; this task reads "
                                                  "single words")
                else:
                    yield Example(source, target, origin=f"{path}:{number}")

    def build_vocabulary(self, directory: Path, train: Iterable[Example[str, str]]) -> MytaskCodec:
        vocab = Vocab.build(list(side) for e in train for side in (e.source, e.target))
        vocab.save(directory / "vocab.txt")
        return MytaskCodec(Vocabularies(vocab, vocab))

    def load_vocabulary(self, directory: Path) -> MytaskCodec:
        vocab = Vocab.load(directory / "vocab.txt")
        return MytaskCodec(Vocabularies(vocab, vocab))

    def parse_source(self, line: str) -> str:
        return line.strip()

    def format_source(self, source: str) -> str:
        return source  # for `seqtrans evaluate --stream`: parse_source reads it back

    def parse_target(self, line: str) -> str:
        return line.strip()  # for `seqtrans score`

    def format(self, prediction: str) -> str:
        return prediction

    def score(self, predictions: Sequence[str], examples: Sequence[Example[str, str]]) -> dict[str, float]:
        letters = sum(len(e.target) for e in examples)
        wrong = sum(edits(p, e.target) for p, e in zip(predictions, examples, strict=True))
        right = sum(p == e.target for p, e in zip(predictions, examples, strict=True))
        return {"cer": 100 * wrong / max(letters, 1), "exact_match": 100 * right / max(len(examples), 1)}


# mypy checks the class against the contract here
_contract: TaskClass[str, str, str] = MytaskTask
