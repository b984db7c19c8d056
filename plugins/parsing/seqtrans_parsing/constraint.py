"""The bracket constraint: only continuations that can still complete a well-formed tree.

Shapes: N hypotheses, t tokens so far, V target vocabulary.

For a sentence of n words a hypothesis may, at every step:

- open a bracket: as its first token (the root), or inside the root while fewer than
  n placeholders are out (an opening needs a word below it);
- emit a placeholder (any preterminal symbol: the placeholder, or a part-of-speech tag
  for a model that predicts them): inside the root, while fewer than n are out;
- close the innermost open bracket, with its label: not right after it opened (no
  empty constituents), and the root only once all n placeholders are out;
- end: once the root is closed;

and only when what it then needs at least (n - k placeholders, a closing for each of
the d open brackets, the end symbol) still fits in the tokens it has left. Every
hypothesis the search returns is then a tree with exactly n preterminals.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch
from torch import Tensor

from seqtrans.vocab import EOS, Vocab
from seqtrans_parsing.linearize import is_close, is_open

__all__ = ["BracketConstraint"]

_OTHER, _OPEN, _CLOSE, _XX = 0, 1, 2, 3


class BracketConstraint:
    """``allowed(prefix, rows=, remaining=)`` for the sentences of one batch; ``lengths``
    are their numbers of words."""

    def __init__(self, lengths: Sequence[int], vocab: Vocab, *, preterminals: Collection[str]) -> None:
        preterminals = frozenset(preterminals)
        v = len(vocab)
        kind = torch.zeros(v, dtype=torch.long)
        close_of = torch.full((v,), EOS, dtype=torch.long)  # opening id -> its closing id
        for i, sym in enumerate(vocab.symbols):
            if sym in preterminals:
                kind[i] = _XX
            elif is_open(sym):
                kind[i] = _OPEN
                if ")" + sym[1:] in vocab:
                    close_of[i] = vocab.index(")" + sym[1:])
            elif is_close(sym):
                kind[i] = _CLOSE
        self.kind = kind
        self.close_of = close_of
        self.step = torch.tensor([0, 1, -1, 0])[kind]  # [V] change of depth
        self.is_open = kind == _OPEN  # [V]
        self.is_xx = kind == _XX  # [V]
        # openings without a closing in the vocabulary can never be closed
        self.is_open &= close_of != EOS
        self.lengths = torch.tensor(list(lengths), dtype=torch.long)  # [B]

    def state(self, prefix: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(depth, placeholders out, last token's kind, closing id of the innermost
        open bracket), each [N], from the prefixes [N, t]."""
        n, t = prefix.shape
        dev = prefix.device
        if t == 0:
            zeros = torch.zeros(n, dtype=torch.long, device=dev)
            return zeros, zeros, zeros, torch.full((n,), EOS, dtype=torch.long, device=dev)
        kind = self.kind.to(dev)[prefix]  # [N, t]
        depth_after = self.step.to(dev)[prefix].cumsum(1)  # [N, t]
        depth = depth_after[:, -1]
        placed = (kind == _XX).sum(1)
        last = kind[:, -1]
        # the innermost open bracket opened right after the last time the depth was one less
        positions = torch.arange(t, device=dev).expand(n, t)
        below = torch.where(depth_after == (depth - 1).unsqueeze(1), positions, -1).amax(1)  # [N]
        opener = prefix.gather(1, (below + 1).clamp(max=t - 1).unsqueeze(1)).squeeze(1)  # [N]
        closing = torch.where(depth > 0, self.close_of.to(dev)[opener], EOS)
        return depth, placed, last, closing

    def allowed(self, prefix: Tensor, *, rows: Tensor, remaining: Tensor) -> Tensor:
        dev = prefix.device
        n_rows, t = prefix.shape
        depth, placed, last, closing = self.state(prefix)
        words = self.lengths.to(dev)[rows]  # [N]
        left = words - placed
        remaining = remaining.to(dev)
        started = t > 0
        inside = depth > 0
        can_open = (left + depth + 3 <= remaining) & ((inside & (left > 0)) | (not started))
        can_xx = inside & (left > 0) & (left + depth + 1 <= remaining)
        can_close = inside & (last != _OPEN) & ((depth > 1) | (left == 0)) & (left + depth <= remaining)
        can_end = (~inside) & (left == 0) & started
        mask = (can_open.unsqueeze(1) & self.is_open.to(dev)) | (can_xx.unsqueeze(1) & self.is_xx.to(dev))
        mask[torch.arange(n_rows, device=dev), closing] |= can_close
        mask[:, EOS] = can_end
        return mask
