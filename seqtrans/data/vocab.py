"""Symbol tables: the four special symbols at fixed ids, then the task's symbols.

Tasks turn their objects into token strings (words, sentencepiece pieces, symbols of
their own); a :class:`Vocab` maps those strings to ids and back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from seqtrans.errors import DataError

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")


class Vocab:
    """An immutable mapping between token strings and ids; ids 0-3 are :data:`SPECIALS`."""

    def __init__(self, symbols: Iterable[str]) -> None:
        symbols = list(symbols)
        if tuple(symbols[: len(SPECIALS)]) != SPECIALS:
            symbols = list(SPECIALS) + [s for s in symbols if s not in SPECIALS]
        self._symbols = tuple(symbols)
        self._index = {s: i for i, s in enumerate(self._symbols)}
        if len(self._index) != len(self._symbols):
            dupes = [s for s, n in Counter(self._symbols).items() if n > 1]
            raise ValueError(f"duplicate vocabulary symbols: {dupes[:5]}")

    @classmethod
    def build(cls, sequences: Iterable[Sequence[str]], *, max_size: int = 0,
              min_count: int = 1) -> Vocab:
        """Most frequent tokens first (ties broken alphabetically, so the result is deterministic)."""
        counts: Counter[str] = Counter()
        for seq in sequences:
            counts.update(seq)
        ranked = sorted((s for s, n in counts.items() if n >= min_count and s not in SPECIALS),
                        key=lambda s: (-counts[s], s))
        if max_size:
            ranked = ranked[: max(0, max_size - len(SPECIALS))]
        return cls(ranked)

    @classmethod
    def load(cls, path: str | Path) -> Vocab:
        path = Path(path)
        lines = path.read_text(encoding="utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for i, line in enumerate(lines, 1):
            if not line or any(c.isspace() for c in line):
                raise DataError(path, i, f"vocabulary symbol {line!r} is empty or contains white space")
        return cls(lines)

    def save(self, path: str | Path) -> None:
        Path(path).write_text("".join(s + "\n" for s in self._symbols), encoding="utf-8")

    @property
    def symbols(self) -> tuple[str, ...]:
        return self._symbols

    def __len__(self) -> int:
        return len(self._symbols)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self._symbols == other._symbols

    def __hash__(self) -> int:
        return hash(self._symbols)

    def __contains__(self, symbol: object) -> bool:
        return symbol in self._index

    def __repr__(self) -> str:
        return f"Vocab({len(self)} symbols)"

    def index(self, symbol: str) -> int:
        """The id of ``symbol``, or :data:`UNK`."""
        return self._index.get(symbol, UNK)

    def encode(self, tokens: Iterable[str]) -> list[int]:
        return [self._index.get(t, UNK) for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Token strings up to the first end-of-sequence, without padding or start symbols."""
        out = []
        for i in ids:
            if i == EOS:
                break
            if i not in (PAD, BOS):
                out.append(self._symbols[i])
        return out


@dataclass(frozen=True)
class Vocabularies:
    """The source and target vocabularies of a task; the same object when shared."""

    source: Vocab
    target: Vocab

    @property
    def shared(self) -> bool:
        return self.source == self.target
