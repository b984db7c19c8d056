"""Linearization both ways, repairs, and the bracket constraint against brute force."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from parsing_data import SHARED_DATA, admitted_sequences, assert_repairs
from seqtrans.plugin import EOS, Vocab
from seqtrans_parsing.constraint import BracketConstraint
from seqtrans_parsing.linearize import linearize, to_tree
from seqtrans_parsing.trees import Tree, preprocess, read_trees


def _test_trees() -> list[Tree]:
    text = (SHARED_DATA / "ptb-sample" / "test.trees").read_text()
    return [t for t in (preprocess(raw) for raw, _ in read_trees(text)) if t is not None]


def test_linearization_round_trips_every_test_tree() -> None:
    trees = _test_trees()
    for tree in trees:
        tagged = tree.tagged()
        built = to_tree(linearize(tree), [w for _, w in tagged], [t for t, _ in tagged])
        assert built.repairs == 0 and str(built.tree) == str(tree)
    tree = trees[0]
    tokens = linearize(tree)
    assert tokens[0] == "(S" and tokens[-1] == ")S" and tokens.count("XX") == len(tree.leaves())


def test_with_tags_the_preterminals_are_the_tags_and_come_back_without_gold_ones() -> None:
    tree = preprocess(next(read_trees("((S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .)))"))[0])
    assert tree is not None
    assert linearize(tree, tags=True) == "(S (NP DT NN )NP (VP VBD )VP . )S".split()
    for tree in _test_trees():
        tagged = tree.tagged()
        tags = {t for t, _ in tagged}
        built = to_tree(linearize(tree, tags=True), [w for _, w in tagged], preterminals=tags)
        assert built.repairs == 0 and str(built.tree) == str(tree)
    # gold tags, where given, win over the decoded ones; a missing word gets the placeholder
    built = to_tree("(S NN VB )S".split(), ["a", "b", "c"], preterminals={"NN", "VB"})
    assert str(built.tree) == "(S (NN a) (VB b) (XX c))" and built.repairs == 1
    built = to_tree("(S NN VB )S".split(), ["a", "b"], ["DT", "NN"], preterminals={"NN", "VB"})
    assert str(built.tree) == "(S (DT a) (NN b))" and built.repairs == 0


def test_repairs_are_counted_and_the_words_always_come_back() -> None:
    words = ["a", "b", "c"]
    cases = {
        "(S XX XX XX )S": 0,
        "(S XX (NP XX XX )VP )S": 1,  # wrong closing label
        "(S XX XX XX": 1,  # left open
        "(S XX XX )S )S XX": 2,  # extra closing, a word outside the root
        "(S (NP )NP XX XX XX )S": 1,  # empty constituent
        "(S XX XX XX XX )S": 1,  # one placeholder too many
        "(S XX )S": 2,  # two words missing
        "(NP XX )NP (VP XX XX )VP": 1,  # two roots
        "<unk> (S XX XX XX )S": 1,
        "": 4,
    }
    assert_repairs(cases, words)
    two_roots = to_tree("(NP XX )NP (VP XX XX )VP".split(), words).tree
    assert str(two_roots) == "(TOP (NP (XX a)) (VP (XX b) (XX c)))"
    rng = random.Random(0)
    vocab = ["(S", ")S", "(NP", ")NP", "XX", "<unk>"]
    for _ in range(500):
        n = rng.randint(1, 6)
        ws = [f"w{i}" for i in range(n)]
        built = to_tree([rng.choice(vocab) for _ in range(rng.randint(0, 15))], ws)
        assert built.tree.leaves() == ws


def _well_formed(tokens: list[str], n: int, preterminals: frozenset[str] = frozenset({"XX"})) -> bool:
    """An independent recursive-descent check: one constituent, labels matching,
    no empty constituents, exactly n preterminals."""
    pos = 0
    count = 0

    def node() -> bool:
        nonlocal pos, count
        if pos < len(tokens) and tokens[pos] in preterminals:
            pos += 1
            count += 1
            return True
        if pos >= len(tokens) or not tokens[pos].startswith("("):
            return False
        label = tokens[pos][1:]
        pos += 1
        children = 0
        while pos < len(tokens) and not tokens[pos].startswith(")"):
            if not node():
                return False
            children += 1
        if pos >= len(tokens) or tokens[pos] != ")" + label or children == 0:
            return False
        pos += 1
        return True

    return bool(tokens) and tokens[0].startswith("(") and node() and pos == len(tokens) and count == n


def _openings_in_a_row(seq: tuple[str, ...]) -> int:
    longest = run = 0
    for token in seq:
        run = run + 1 if token.startswith("(") else 0
        longest = max(longest, run)
    return longest


@pytest.mark.parametrize("preterminals, sizes, max_open", [
    (("XX",), ((1, 5), (2, 7), (3, 8)), 10),  # the default bound, out of reach at these lengths
    (("NN", "VB"), ((1, 5), (2, 7)), 10),  # a tagging model: any tag stands for a word
    (("XX",), ((1, 7), (2, 8), (3, 8)), 1),  # the bound on openings in a row binds
    (("XX",), ((1, 7), (2, 8)), 2),
])
def test_the_constraint_admits_exactly_the_well_formed_trees_that_fit(
        preterminals: tuple[str, ...], sizes: tuple[tuple[int, int], ...], max_open: int) -> None:
    vocab = Vocab([*preterminals, "(A", ")A", "(B", ")B"])
    symbols = list(vocab.symbols[4:])
    for n, max_len in sizes:
        constraint = BracketConstraint([n], vocab, preterminals=preterminals, max_open=max_open)
        admitted = admitted_sequences(constraint, vocab, max_len)
        valid = {seq for length in range(1, max_len + 1) for seq in itertools.product(symbols, repeat=length)
                 if _well_formed(list(seq), n, frozenset(preterminals))
                 and _openings_in_a_row(seq) <= max_open}
        assert admitted == valid and valid
        # the state, stepped along each admitted sequence, allows its tokens
        for seq in sorted(admitted)[:200]:
            state = constraint.start(torch.tensor([0]))
            for i, sym in enumerate(seq):
                assert state.allowed(remaining=torch.tensor([max_len + 1 - i]))[0, vocab.index(sym)], seq
                state.advance(torch.tensor([vocab.index(sym)]))
            assert state.allowed(remaining=torch.tensor([max_len + 1 - len(seq)]))[0, EOS], seq


def test_the_constraint_state_is_computed_per_row_in_one_batch() -> None:
    vocab = Vocab(["XX", "(A", ")A", "(B", ")B"])
    c = BracketConstraint([2, 1], vocab, preterminals=["XX"])
    ids = {s: vocab.index(s) for s in vocab.symbols}
    prefixes = torch.tensor([[ids["(A"], ids["(B"], ids["XX"]], [ids["(B"], ids["XX"], ids[")B"]]])
    mask = c.allowed(prefixes, rows=torch.tensor([0, 1]), remaining=torch.tensor([10, 10]))
    allowed = [{vocab.symbols[i] for i in row.nonzero().flatten().tolist()} for row in mask]
    assert allowed == [{"XX", "(A", "(B", ")B"}, {"</s>"}]
