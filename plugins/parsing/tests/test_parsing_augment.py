"""Subtree substitution (data.substitute): each new tree is a training tree with exactly
one phrase swapped for a same-label phrase of a training tree, checked by brute force
over every such swap."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from parsing_data import SHARED_DATA
from seqtrans.plugin import ConfigError
from seqtrans_parsing import ParsingConfig, ParsingTask
from seqtrans_parsing.augment import substitute
from seqtrans_parsing.trees import Tree, preprocess, read_trees

DEV = SHARED_DATA / "ptb-sample" / "dev.trees"


def _trees(n: int) -> list[Tree]:
    out = []
    for raw, _ in read_trees(DEV.read_text()):
        tree = preprocess(raw)
        if tree is not None:
            out.append(tree)
        if len(out) == n:
            break
    return out


def _phrase_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, label) of every bracketed phrase in a tree's text below its root,
    preterminals excluded: found from the characters alone."""
    spans, stack = [], []
    for i, ch in enumerate(text):
        if ch == "(":
            stack.append(i)
        elif ch == ")":
            start = stack.pop()
            inner = text[start + 1:i]
            if stack and "(" in inner:  # not the root, not a preterminal
                spans.append((start, i + 1, inner.split(" ", 1)[0]))
    return spans


def test_each_new_tree_is_one_same_label_swap_from_a_recipient_and_a_donor() -> None:
    trees = _trees(40)
    made = substitute(trees, 60, seed=3)
    assert len(made) == 60
    for s in made:
        recipient, donor, result = str(trees[s.recipient]), str(trees[s.donor]), str(s.tree)
        swaps = {recipient[:a] + donor[c:d] + recipient[b:]
                 for a, b, label in _phrase_spans(recipient) if label == s.label
                 for c, d, other in _phrase_spans(donor) if other == label}
        assert result in swaps and result != recipient
        # still a tree that reads back, with one tag per word
        (back, _), = read_trees(result)
        assert str(back) == result and len(back.tagged()) == len(back.leaves())


def test_substitution_is_seeded_bounded_and_leaves_the_originals_alone() -> None:
    trees = _trees(40)
    before = [str(t) for t in trees]
    first = [str(s.tree) for s in substitute(trees, 30, seed=1)]
    assert [str(s.tree) for s in substitute(trees, 30, seed=1)] == first
    assert [str(s.tree) for s in substitute(trees, 30, seed=2)] != first
    assert [str(t) for t in trees] == before
    assert all(len(s.tree.leaves()) <= 12 for s in substitute(trees, 30, seed=1, max_words=12))
    longest = max(len(t.leaves()) for t in trees)
    assert all(len(s.tree.leaves()) <= longest for s in substitute(trees, 30, seed=1))
    # no phrase has a partner of its label in a single flat tree: nothing can be made
    assert substitute([Tree("S", [Tree("NP", [Tree("NN", ["dog"])])])], 5, seed=1) == []


def test_the_task_adds_the_new_trees_to_the_training_split_only(tmp_path: Path) -> None:
    options = {"vocab_size": 200, "train": str(DEV), "dev": str(DEV)}
    plain = list(ParsingTask(ParsingConfig(**options)).read("train"))
    task = ParsingTask(ParsingConfig(**options, substitute=0.5, substitute_seed=4))
    train = list(task.read("train"))
    assert len(train) == len(plain) + round(0.5 * len(plain))
    assert [e.origin for e in train[:len(plain)]] == [e.origin for e in plain]
    new = train[len(plain):]
    assert all(" with a " in e.origin and e.origin.count("dev.trees:") == 2 for e in new)
    assert all(e.source.words == tuple(e.target.leaves()) for e in new)
    assert all(e.source.tags == tuple(t for t, _ in e.target.tagged()) for e in new)
    assert Counter(str(e.target) for e in new) != Counter(str(e.target) for e in plain)
    assert len(list(task.read("dev"))) == len(plain)
    with pytest.raises(ConfigError, match="data.substitute"):
        ParsingConfig(substitute=-1)
