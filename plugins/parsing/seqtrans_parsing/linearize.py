"""Trees as bracket sequences and back, in two orders.

Top-down (Vinyals et al. 2015, ``order="top_down"``):
``(S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .))`` becomes
``(S (NP XX XX )NP (VP XX )VP XX )S``: labelled openings and closings, and one
placeholder per word; the words come back from the input sentence. With ``tags=True``
the preterminals are their part-of-speech tags instead (``(S (NP DT NN )NP (VP VBD )VP . )S``),
which the model then also learns to predict.

In-order (Liu and Zhang 2017; as a sequence for seq2seq parsing, Fernández-González and
Gómez-Rodríguez 2020, ``order="in_order"``): a constituent is written after its first
child, ``in_order(c1) (X in_order(c2) ... in_order(cm) )X``, so the same tree becomes
``DT (NP NN )NP (S VBD (VP )VP . )S``; a unary constituent closes right after it opens
(``(S (VP VBD))`` is ``VBD (VP )VP (S )S``). In both orders the preterminals come in
the words' order.

:func:`to_tree` turns any token sequence into a valid tree over exactly the input's
words and counts the repairs it needed.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from seqtrans_parsing.trees import Tree

__all__ = ["ORDERS", "Order", "PLACEHOLDER", "linearize", "to_tree", "Built", "is_open", "is_close"]

PLACEHOLDER = "XX"

Order = Literal["top_down", "in_order"]
ORDERS: tuple[Order, ...] = ("top_down", "in_order")


def is_open(token: str) -> bool:
    return len(token) > 1 and token[0] == "("


def is_close(token: str) -> bool:
    return len(token) > 1 and token[0] == ")"


def linearize(tree: Tree, *, placeholder: str = PLACEHOLDER, tags: bool = False,
              order: Order = "top_down") -> list[str]:
    """The bracket sequence of a tree in ``order``; preterminals become ``placeholder``,
    or their tags with ``tags=True``."""
    if order not in ORDERS:
        raise ValueError(f"unknown linearization order {order!r}, expected one of {ORDERS}")
    out: list[str] = []
    stack: list[Tree | str] = [tree]  # iterative: a decoded tree may nest deeper than the recursion limit
    while stack:
        node = stack.pop()
        if isinstance(node, str):  # a bracket
            out.append(node)
        elif node.is_preterminal:
            out.append(node.label if tags else placeholder)
        elif order == "top_down":
            out.append("(" + node.label)
            stack.append(")" + node.label)
            stack.extend(c for c in reversed(node.children) if isinstance(c, Tree))
        else:
            kids = [c for c in node.children if isinstance(c, Tree)]
            stack.append(")" + node.label)
            stack.extend(reversed(kids[1:]))
            stack.append("(" + node.label)
            stack.extend(kids[:1])
    return out


@dataclass
class Built:
    """A tree rebuilt from decoded tokens. ``repairs`` counts what had to be fixed:
    unmatched or mislabelled closings, empty constituents, missing or extra
    placeholders, brackets left open, unknown tokens, more than one root."""

    tree: Tree
    repairs: int

    @property
    def malformed(self) -> bool:
        return self.repairs > 0


def to_tree(tokens: Sequence[str], words: Sequence[str], tags: Sequence[str] | None = None, *,
            preterminals: Collection[str] = (PLACEHOLDER,), root: str = "TOP",
            order: Order = "top_down") -> Built:
    """A valid tree over exactly ``words`` from any token sequence in ``order``.

    A token in ``preterminals`` (the placeholder, or the tags of a tagging model) stands
    for the next word. Preterminals take the tags given (the gold tags, for scoring),
    else the decoded token (the placeholder for a word the sequence left out).
    A closing bracket closes the innermost open one whatever its label. In in-order, an
    opening takes the last finished subtree as its first child; one with none to take
    (at the start, right after another opening) is dropped. Leftover words join the
    root at the end; several top-level constituents are put under a ``root`` node.
    """
    if order not in ORDERS:
        raise ValueError(f"unknown linearization order {order!r}, expected one of {ORDERS}")
    n = len(words)
    preterminals = frozenset(preterminals)

    def leaf(i: int, token: str = PLACEHOLDER) -> Tree:
        return Tree(tags[i] if tags is not None else token, [words[i]])

    repairs = 0
    top: list[Tree] = []
    stack: list[Tree] = []
    k = 0
    for tok in tokens:
        if tok in preterminals:
            if k >= n:
                repairs += 1
                continue
            (stack[-1].children if stack else top).append(leaf(k, tok))
            k += 1
        elif is_open(tok):
            if order == "top_down":
                stack.append(Tree(tok[1:], []))
                continue
            # the first child: the last finished subtree, unless it is already the
            # first child of the innermost open constituent
            siblings = stack[-1].children if stack else top
            if len(siblings) < (2 if stack else 1):
                repairs += 1
                continue
            stack.append(Tree(tok[1:], [siblings.pop()]))
        elif is_close(tok):
            if not stack:
                repairs += 1
                continue
            node = stack.pop()
            if tok[1:] != node.label:
                repairs += 1
            if not node.children:
                repairs += 1
                continue
            (stack[-1].children if stack else top).append(node)
        else:
            repairs += 1
    while stack:
        repairs += 1
        node = stack.pop()
        if node.children:
            (stack[-1].children if stack else top).append(node)
    if k < n:
        repairs += n - k
        host = top[0].children if len(top) == 1 and not top[0].is_preterminal else top
        host.extend(leaf(i) for i in range(k, n))
    if len(top) == 1 and not top[0].is_preterminal:
        return Built(top[0], repairs)
    return Built(Tree(root, list(top)), repairs + 1)
