"""Where the parsing tests' data lives (the shared data directory beside the repository),
and a helper the constraint tests share."""

from pathlib import Path
from typing import Any

SHARED_DATA = Path(__file__).resolve().parents[4] / "shared" / "data"


def admitted_sequences(constraint: Any, vocab: Any, max_len: int) -> set[tuple[str, ...]]:
    """Every sequence a bracket constraint of one sentence lets search finish within
    ``max_len`` tokens (the end symbol not counted), by stepping ``allowed`` from the empty
    prefix through every token it allows; asserts that no prefix is a dead end."""
    import torch

    from seqtrans.vocab import EOS

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
