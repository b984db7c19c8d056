"""The bracket constraint: only continuations that can still complete a well-formed tree.

Shapes: N hypotheses, t tokens so far, V target vocabulary.

For a sentence of n words, in the top-down order (the default), a hypothesis may, at
every step:

- open a bracket: as its first token (the root), or inside the root while fewer than
  n placeholders are out (an opening needs a word below it), and no more than
  ``max_open`` openings in a row (the treebank sample's longest run is 6; without a
  bound a model can nest openings over one word until the length runs out, deeper than
  any reader of trees accepts);
- emit a placeholder (any preterminal symbol: the placeholder, or a part-of-speech tag
  for a model that predicts them): inside the root, while fewer than n are out;
- close the innermost open bracket, with its label: not right after it opened (no
  empty constituents), and the root only once all n placeholders are out;
- end: once the root is closed;

and only when what it then needs at least (n - k placeholders, a closing for each of
the d open brackets, the end symbol) still fits in the tokens it has left. Every
hypothesis the search returns is then a tree with exactly n preterminals.

In the in-order order (``order="in_order"``, :mod:`seqtrans_parsing.linearize`) an
opening comes after its constituent's first child, and a hypothesis may:

- emit a placeholder: as its first token, or inside an open bracket, while fewer than
  n are out (at the top level after the first token there is a finished subtree
  already, and a second one could never join it);
- open a bracket: right after a finished subtree (a placeholder or a closing), which
  becomes its first child;
- close the innermost open bracket, with its label: at any time, right after it opened
  too (a unary constituent, whose only child is the first), but no more than
  ``max_unary`` unary constituents in a row over one subtree (the treebank sample's
  longest such chain is 3; without a bound, a model can wrap a subtree in unary
  brackets until the length runs out, which nothing else in the order prevents); an
  opening with the chain at its bound needs a word left, as its second child;
- end: once nothing is open, all n placeholders are out and the last token is a
  closing (the one finished subtree is a constituent, not a bare preterminal);

and only when the least it then needs still fits: with d brackets open, n - k
placeholders, d closings and the end; with none open, at the start n + 2 and the end
(a placeholder, then an opening and its closing above it), after a bare first
placeholder n - k + 2 and the end, after a closing the end alone or, with words left,
n - k + 2 and the end (an opening above the tree so far, the words, its closing).

In search the constraint keeps this per hypothesis (:class:`BracketState`: the depth,
the placeholders out, the last token's kind, the unary chain and the stack of closings
the open brackets need), updated with each token, so that a step costs the same however long the prefix;
both orders keep the same state and differ only in the rules above.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from seqtrans.plugin import EOS, Vocab
from seqtrans_parsing.linearize import ORDERS, Order, is_close, is_open

__all__ = ["BracketConstraint", "BracketState"]

_OTHER, _OPEN, _CLOSE, _XX = 0, 1, 2, 3


class BracketConstraint:
    """``allowed(prefix, rows=, remaining=)`` for the sentences of one batch, and
    ``start(rows)``, the same as a state kept per hypothesis; ``lengths`` are their
    numbers of words, ``order`` the linearization the sequences follow."""

    def __init__(self, lengths: Sequence[int], vocab: Vocab, *, preterminals: Collection[str],
                 order: Order = "top_down", max_unary: int = 3, max_open: int = 10) -> None:
        if order not in ORDERS:
            raise ValueError(f"unknown linearization order {order!r}, expected one of {ORDERS}")
        if max_unary < 1 or max_open < 1:
            raise ValueError(f"max_unary and max_open must be at least 1, not {max_unary} and {max_open}")
        self.order = order
        self.max_unary = max_unary  # in-order only: unary constituents in a row over one subtree
        self.max_open = max_open  # top-down only: openings in a row
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
        # allowed tokens by (may open, may place a preterminal); closings and the end are per row
        none = torch.zeros_like(self.is_open)
        self.table = torch.stack([none, self.is_xx, self.is_open, self.is_open | self.is_xx])  # [4, V]

    def state(self, prefix: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(depth, placeholders out, last token's kind, closing id of the innermost
        open bracket, chain), each [N], from the prefixes [N, t]. The chain is the run of
        openings at the end (top-down) or of unary constituents over one subtree (in-order)."""
        n, t = prefix.shape
        dev = prefix.device
        if t == 0:
            zeros = torch.zeros(n, dtype=torch.long, device=dev)
            return zeros, zeros, zeros, torch.full((n,), EOS, dtype=torch.long, device=dev), zeros
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
        if self.order == "top_down":
            last_other = torch.where(kind != _OPEN, positions, -1).amax(1)  # [N]
            return depth, placed, last, closing, (t - 1) - last_other
        # the unary closings (right after their opening) since the last placeholder or
        # other closing, which end a chain
        after_open = F.pad(kind[:, :-1] == _OPEN, (1, 0))  # [N, t]
        unary = (kind == _CLOSE) & after_open
        resets = (kind == _XX) | ((kind == _CLOSE) & ~after_open)
        counted = unary.long().cumsum(1)  # [N, t]
        reset_at = torch.where(resets, positions, -1).amax(1)  # [N]
        at_reset = counted.gather(1, reset_at.clamp(min=0).unsqueeze(1)).squeeze(1)
        before = torch.where(reset_at >= 0, at_reset, 0)
        return depth, placed, last, closing, counted[:, -1] - before

    def allowed(self, prefix: Tensor, *, rows: Tensor, remaining: Tensor) -> Tensor:
        depth, placed, last, closing, chain = self.state(prefix)
        return self.mask(self.lengths.to(prefix.device)[rows], depth, placed, last, closing, chain,
                         remaining=remaining, started=prefix.size(1) > 0)

    def mask(self, words: Tensor, depth: Tensor, placed: Tensor, last: Tensor, closing: Tensor,
             chain: Tensor, *, remaining: Tensor, started: bool) -> Tensor:
        """The allowed next tokens [N, V] of hypotheses in the state (depth, placeholders
        out, last token's kind, closing of the innermost open bracket, chain), each
        [N], of sentences of ``words`` [N] words; ``started``: the prefixes are not empty."""
        remaining = remaining.to(depth.device)
        if self.order == "top_down":
            can_open, can_xx, can_close, can_end = _top_down(words - placed, depth, last, remaining,
                                                             started=started)
            can_open = can_open & (chain < self.max_open)
        else:
            can_open, can_xx, can_close, can_end = _in_order(words - placed, depth, last, remaining,
                                                             started=started)
            at_bound = chain >= self.max_unary
            can_close = can_close & ~(at_bound & (last == _OPEN))
            can_open = can_open & (~at_bound | (words > placed))
        n_rows = depth.numel()
        # one row of the table per (can_open, can_xx): [4, V] -> [N, V]
        mask = self.table.to(depth.device)[can_open.long() * 2 + can_xx.long()]
        mask[torch.arange(n_rows, device=depth.device), closing] |= can_close
        mask[:, EOS] = can_end
        return mask

    def start(self, rows: Tensor) -> BracketState:
        return BracketState(self, self.lengths.to(rows.device)[rows])


_Rules = tuple[Tensor, Tensor, Tensor, Tensor]


def _top_down(left: Tensor, depth: Tensor, last: Tensor, remaining: Tensor, *, started: bool) -> _Rules:
    """(may open, may place a preterminal, may close the innermost bracket, may end), each
    [N], of hypotheses with ``left`` words to place, in the top-down order."""
    inside = depth > 0
    can_open = (left + depth + 3 <= remaining) & ((inside & (left > 0)) | (not started))
    can_xx = inside & (left > 0) & (left + depth + 1 <= remaining)
    can_close = inside & (last != _OPEN) & ((depth > 1) | (left == 0)) & (left + depth <= remaining)
    can_end = (~inside) & (left == 0) & started
    return can_open, can_xx, can_close, can_end


def _in_order(left: Tensor, depth: Tensor, last: Tensor, remaining: Tensor, *, started: bool) -> _Rules:
    """The same in the in-order order; each condition on ``remaining`` counts the token
    itself and the least the hypothesis needs after it (see the module's docstring)."""
    inside = depth > 0
    finished = (last == _XX) | (last == _CLOSE)  # the last token ended a subtree
    first = left + 3 <= remaining if not started else torch.zeros_like(inside)
    can_xx = (left > 0) & ((inside & (left + depth + 1 <= remaining)) | first)
    can_open = finished & (left + depth + 3 <= remaining) if started else torch.zeros_like(inside)
    # closing the last open bracket leaves one tree: it ends there, or takes an opening above it
    after_last = torch.where(left == 0, remaining >= 2, left + 4 <= remaining)
    can_close = inside & torch.where(depth > 1, left + depth + 1 <= remaining, after_last)
    can_end = (depth == 0) & (left == 0) & (last == _CLOSE)
    return can_open, can_xx, can_close, can_end


class BracketState:
    """The bracket constraint's state of N hypotheses, each [N]: the words of its sentence,
    its depth, placeholders out, last token's kind, chain (openings in a row top-down,
    unary constituents in a row in-order), and the
    closings its open brackets need, innermost at ``stack[depth - 1]`` ([N, capacity], grown when a hypothesis
    opens deeper).

    Depths below zero (a closing with nothing open, which the constraint never allows)
    are counted but store nothing, as :meth:`BracketConstraint.state` reads them.
    """

    def __init__(self, constraint: BracketConstraint, words: Tensor, *, capacity: int = 16) -> None:
        self.constraint = constraint
        dev = words.device
        n = words.numel()
        self.kind = constraint.kind.to(dev)
        self.step = constraint.step.to(dev)
        self.close_of = constraint.close_of.to(dev)
        self.words = words
        self.depth = torch.zeros(n, dtype=torch.long, device=dev)
        self.placed = torch.zeros(n, dtype=torch.long, device=dev)
        self.last = torch.zeros(n, dtype=torch.long, device=dev)
        self.chain = torch.zeros(n, dtype=torch.long, device=dev)  # see BracketConstraint.state
        self.stack = torch.full((n, capacity), EOS, dtype=torch.long, device=dev)
        self.started = False
        # no hypothesis is deeper than this; checked against the depths only when a step
        # could pass the capacity, so that most steps read nothing back from the device
        self.depth_bound = 0

    def allowed(self, *, remaining: Tensor) -> Tensor:
        c = self.constraint
        top = (self.depth - 1).clamp(min=0, max=self.stack.size(1) - 1).unsqueeze(1)  # [N, 1]
        closing = torch.where(self.depth > 0, self.stack.gather(1, top).squeeze(1), EOS)
        return c.mask(self.words, self.depth, self.placed, self.last, closing, self.chain,
                      remaining=remaining, started=self.started)

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        self.words, self.depth, self.placed, self.last, self.chain, self.stack = (
            t.index_select(0, rows) for t in (self.words, self.depth, self.placed, self.last, self.chain,
                                              self.stack))

    def advance(self, tokens: Tensor) -> None:
        kind = self.kind[tokens]  # [N]
        opens = kind == _OPEN
        self.depth_bound += 1
        if self.depth_bound >= self.stack.size(1):
            self.depth_bound = int(self.depth.max()) + 1 if self.depth.numel() else 1
            if self.depth_bound >= self.stack.size(1):
                grown = torch.full_like(self.stack, EOS)
                self.stack = torch.cat([self.stack, grown], dim=1)
        # push the closing of each opening at its depth (only depths >= 0 are stored)
        at = self.depth.clamp(min=0).unsqueeze(1)  # [N, 1]
        below = self.stack.gather(1, at).squeeze(1)
        pushed = torch.where(opens & (self.depth >= 0), self.close_of[tokens], below)
        self.stack.scatter_(1, at, pushed.unsqueeze(1))
        self.depth = self.depth + self.step[tokens]
        self.placed = self.placed + (kind == _XX).long()
        closes = kind == _CLOSE
        if self.constraint.order == "top_down":
            self.chain = torch.where(opens, self.chain + 1, 0)
        else:
            unary = closes & (self.last == _OPEN)
            self.chain = torch.where((kind == _XX) | (closes & ~unary), 0, self.chain + unary.long())
        self.last = kind
        self.started = True
