"""Where the parsing tests' data lives (the shared data directory beside the repository),
and helpers the tests share."""

from pathlib import Path
from typing import Any

SHARED_DATA = Path(__file__).resolve().parents[4] / "shared" / "data"
NLTK_DATA = SHARED_DATA / "nltk_data"
SAMPLE = SHARED_DATA / "ptb-sample"


def use_shared_nltk_data(monkeypatch: Any) -> None:
    """Point NLTK at the shared data for one test: its environment variable and, as NLTK
    reads that variable once, its search path."""
    import nltk

    monkeypatch.setenv("NLTK_DATA", str(NLTK_DATA))
    if str(NLTK_DATA) not in nltk.data.path:
        monkeypatch.setattr(nltk.data, "path", [str(NLTK_DATA), *nltk.data.path])


def admitted_sequences(constraint: Any, vocab: Any, max_len: int) -> set[tuple[str, ...]]:
    """Every sequence a bracket constraint of one sentence lets search finish within
    ``max_len`` tokens (the end symbol not counted), by stepping ``allowed`` from the empty
    prefix through every token it allows; asserts that no prefix is a dead end."""
    import torch

    from seqtrans.plugin import EOS

    admitted: set[tuple[str, ...]] = set()

    def walk(prefix: list[int]) -> None:
        remaining = torch.tensor([max_len + 1 - len(prefix)])  # tokens left, the end symbol included
        ids = torch.tensor([prefix], dtype=torch.long).view(1, len(prefix))
        mask = constraint.allowed(ids, rows=torch.tensor([0]), remaining=remaining)[0]
        assert mask.any(), prefix  # never a dead end
        for tok in mask.nonzero().flatten().tolist():
            if tok == EOS:
                admitted.add(tuple(vocab.symbols[i] for i in prefix))
            else:
                walk([*prefix, tok])

    walk([])
    return admitted


def assert_repairs(cases: dict[str, int], words: list[str], *, order: str = "top_down") -> None:
    """Each bracket sequence of ``cases`` builds a tree over exactly ``words`` with the
    given number of repairs."""
    from seqtrans_parsing.linearize import to_tree

    for text, repairs in cases.items():
        built = to_tree(text.split(), words, order=order)  # type: ignore[arg-type]
        assert built.repairs == repairs, text
        assert built.tree.leaves() == words, text
