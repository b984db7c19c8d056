"""Subtree substitution (SUB², Shi, Livescu and Gimpel 2021): new training trees made
from the treebank's own, each a training tree with one phrase replaced by another
phrase of the same label taken from a training tree.

The new trees are well formed by construction (a phrase for a phrase of the same
label), their words and tags are the treebank's, and their sentences are new, which is
what a model trained on a few thousand trees sees too little of.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from dataclasses import dataclass

from seqtrans_parsing.trees import Tree

__all__ = ["Substitution", "substitute"]


@dataclass(frozen=True)
class Substitution:
    """A new tree, the indices of the tree it was made from and of the tree that gave the
    phrase, and the label of the phrase replaced."""

    tree: Tree
    recipient: int
    donor: int
    label: str


def _phrases(tree: Tree) -> list[Tree]:
    """The phrases below the root, preterminals excluded, in preorder."""
    out: list[Tree] = []
    stack = [c for c in reversed(tree.children) if isinstance(c, Tree)]
    while stack:
        node = stack.pop()
        if node.is_preterminal:
            continue
        out.append(node)
        stack.extend(c for c in reversed(node.children) if isinstance(c, Tree))
    return out


def _replaced(tree: Tree, old: Tree, new: Tree) -> Tree:
    """A copy of ``tree`` with the node ``old`` (by identity) replaced by a copy of ``new``."""
    if tree is old:
        return copy.deepcopy(new)
    return Tree(tree.label, [_replaced(c, old, new) if isinstance(c, Tree) else c for c in tree.children])


def substitute(trees: Sequence[Tree], count: int, *, seed: int,
               max_words: int | None = None) -> list[Substitution]:
    """``count`` new trees: each time a random tree, a random phrase in it, and a random
    phrase of the same label from another tree (or another place in the same one) in its
    place. A draw whose result would have more than ``max_words`` words (default: the
    longest of ``trees``) or that has no other phrase of its label is drawn again; after
    ``20 * count`` draws, fewer than ``count`` trees are returned."""
    rng = random.Random(seed)
    phrases = [_phrases(t) for t in trees]
    pools: dict[str, list[tuple[int, Tree]]] = {}
    for i, nodes in enumerate(phrases):
        for node in nodes:
            pools.setdefault(node.label, []).append((i, node))
    sizes = [len(t.leaves()) for t in trees]
    limit = max(sizes, default=0) if max_words is None else max_words
    candidates = [i for i, nodes in enumerate(phrases) if nodes]
    out: list[Substitution] = []
    for _ in range(20 * count):
        if len(out) == count or not candidates:
            break
        recipient = rng.choice(candidates)
        old = rng.choice(phrases[recipient])
        donor, new = rng.choice(pools[old.label])
        words = sizes[recipient] - len(old.leaves()) + len(new.leaves())
        if words > limit or str(new) == str(old):
            continue
        out.append(Substitution(_replaced(trees[recipient], old, new), recipient, donor, old.label))
    return out
