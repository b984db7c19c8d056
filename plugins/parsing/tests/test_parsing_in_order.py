"""The in-order linearization (``data.linearization=in_order``): hand-written sequences,
round trips of the treebank sample, repairs, and its constraint against brute force over
sequences generated from the definition."""

from __future__ import annotations

import functools
import itertools
import re

import pytest
import torch

from parsing_data import SHARED_DATA, admitted_sequences, assert_repairs
from seqtrans.plugin import EOS, Vocab
from seqtrans_parsing.constraint import BracketConstraint
from seqtrans_parsing.linearize import ORDERS, Order, linearize, to_tree
from seqtrans_parsing.trees import Tree, preprocess, read_trees


def _tree(text: str) -> Tree:
    tree = preprocess(next(read_trees(text))[0])
    assert tree is not None
    return tree


def test_hand_written_in_order_sequences_and_back() -> None:
    tree = _tree("((S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .)))")
    assert linearize(tree, tags=True, order="in_order") == "DT (NP NN )NP (S VBD (VP )VP . )S".split()
    assert linearize(tree, order="in_order") == "XX (NP XX )NP (S XX (VP )VP XX )S".split()
    assert linearize(tree, tags=True) == "(S (NP DT NN )NP (VP VBD )VP . )S".split()  # the default
    words = ["The", "dog", "barked", "."]
    built = to_tree("DT (NP NN )NP (S VBD (VP )VP . )S".split(), words,
                    preterminals={"DT", "NN", "VBD", "."}, order="in_order")
    assert built.repairs == 0 and str(built.tree) == str(tree)
    # a unary chain closes each constituent right after it opens
    chain = _tree("(S (VP (VBD ran)))")
    assert linearize(chain, tags=True, order="in_order") == "VBD (VP )VP (S )S".split()
    built = to_tree("VBD (VP )VP (S )S".split(), ["ran"], preterminals={"VBD"}, order="in_order")
    assert built.repairs == 0 and str(built.tree) == "(S (VP (VBD ran)))"
    # an opening takes the last finished subtree: here the NP, not the DT inside it
    nested = _tree("(S (NP (DT a) (NN b)) (VP (VB c) (NP (NN d))))")
    assert linearize(nested, tags=True, order="in_order") == \
        "DT (NP NN )NP (S VB (VP NN (NP )NP )VP )S".split()


def _sample_trees() -> list[Tree]:
    trees = []
    for split in ("train", "dev", "test"):
        text = (SHARED_DATA / "ptb-sample" / f"{split}.trees").read_text()
        trees += [t for t in (preprocess(raw) for raw, _ in read_trees(text)) if t is not None]
    return trees


@pytest.mark.parametrize("order", ORDERS)
def test_every_tree_of_the_treebank_sample_round_trips(order: Order) -> None:
    trees = _sample_trees()
    assert len(trees) > 3900
    for tree in trees:
        tagged = tree.tagged()
        words, tags = [w for _, w in tagged], [t for t, _ in tagged]
        tokens = linearize(tree, order=order)
        built = to_tree(tokens, words, tags, order=order)
        assert built.repairs == 0 and str(built.tree) == str(tree)
        tagging = linearize(tree, tags=True, order=order)
        # the preterminals in the words' order in every linearization (the source cursor's walk)
        assert [t for t in tagging if t[0] not in "()"] == tags
        built = to_tree(tagging, words, preterminals=set(tags), order=order)
        assert built.repairs == 0 and str(built.tree) == str(tree)
        # the same openings and closings in both orders, in another arrangement
        assert sorted(tokens) == sorted(linearize(tree))


def test_in_order_repairs_are_counted_and_the_words_always_come_back() -> None:
    words = ["a", "b", "c"]
    cases = {
        "XX (S XX XX )S": 0,
        "XX (S XX (NP XX )VP )S": 1,  # wrong closing label
        "XX (S XX XX": 1,  # left open
        "XX (S XX XX )S )S": 1,  # extra closing
        "XX (S XX XX XX )S": 1,  # one placeholder too many
        "XX (S )S": 2,  # two words missing (they join the root)
        "<unk> XX (S XX XX )S": 1,
        "XX XX (S XX )S": 1,  # two top-level constituents: under TOP
        "(S XX (NP XX XX )NP )S": 2,  # an opening with no first child is dropped, so is its closing
        "XX (S (NP XX )NP XX )S": 4,  # dropped opening, mislabelled closing, extra closing, two roots
        "XX": 3,  # two words missing, a bare preterminal under TOP
        "": 4,
    }
    assert_repairs(cases, words, order="in_order")
    assert str(to_tree("XX XX (S XX )S".split(), words, order="in_order").tree) == \
        "(TOP (XX a) (S (XX b) (XX c)))"
    assert str(to_tree("(S XX (NP XX XX )NP )S".split(), words, order="in_order").tree) == \
        "(NP (XX a) (XX b) (XX c))"
    assert str(to_tree("XX (S )S".split(), words, order="in_order").tree) == "(S (XX a) (XX b) (XX c))"


LABELS = ("A", "B")


@functools.cache
def _trees(n: int, length: int, preterminals: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """Every in-order sequence, straight from the definition, of a tree (a bare
    preterminal included) with ``n`` preterminals and ``length`` tokens."""
    out = [(p,) for p in preterminals] if (n, length) == (1, 1) else []
    for label in LABELS:
        for first, *rest in _forests(n, length - 2, preterminals):
            out.append((*first, "(" + label, *itertools.chain(*rest), ")" + label))
    return tuple(out)


@functools.cache
def _forests(n: int, length: int, preterminals: tuple[str, ...]) -> tuple[tuple[tuple[str, ...], ...], ...]:
    """Every non-empty list of trees with ``n`` preterminals and ``length`` tokens in all."""
    out: list[tuple[tuple[str, ...], ...]] = []
    for n1, l1 in itertools.product(range(1, n + 1), range(1, length + 1)):
        for tree in _trees(n1, l1, preterminals):
            if (n1, l1) == (n, length):
                out.append((tree,))
            out.extend((tree, *rest) for rest in _forests(n - n1, length - l1, preterminals))
    return tuple(out)


def _well_formed(n: int, max_len: int, preterminals: tuple[str, ...],
                 max_unary: int | None = None) -> set[tuple[str, ...]]:
    """The in-order sequences of the trees with n preterminals (a constituent at the root)
    of at most ``max_len`` tokens (and no more than ``max_unary`` unary constituents in a
    row over one subtree)."""
    return {seq for length in range(2, max_len + 1) for seq in _trees(n, length, preterminals)
            if max_unary is None or _longest_unary_run(seq) <= max_unary}


def _longest_unary_run(seq: tuple[str, ...]) -> int:
    """The most "(X )X" pairs in a row: unary constituents stacked over one subtree."""
    runs = re.finditer(r"(?:\((\w+) \)\1 )+", " ".join(seq) + " ")
    return max((m.group(0).count("(") for m in runs), default=0)


def test_the_generated_sequences_are_the_ones_to_tree_reads_without_repairs() -> None:
    """Every sequence over a tiny vocabulary: none repaired exactly when it is generated."""
    symbols = ["XX", "(A", ")A", "(B", ")B"]
    max_len = 7
    for n in (1, 2, 3):
        words = [f"w{i}" for i in range(n)]
        clean = {seq for length in range(max_len + 1) for seq in itertools.product(symbols, repeat=length)
                 if to_tree(seq, words, order="in_order").repairs == 0}
        assert clean == _well_formed(n, max_len, ("XX",)) and clean


@pytest.mark.parametrize("preterminals, sizes, max_unary", [
    (("XX",), ((1, 7), (2, 8), (3, 9), (4, 8)), 3),
    (("NN", "VB"), ((1, 5), (2, 7), (3, 7)), 3),  # a tagging model: any tag stands for a word
    (("XX",), ((1, 9), (2, 9), (3, 9)), 1),  # the bound on unary chains binds
    (("XX",), ((1, 9), (2, 10)), 2),
])
def test_the_in_order_constraint_admits_exactly_the_well_formed_sequences_that_fit(
        preterminals: tuple[str, ...], sizes: tuple[tuple[int, int], ...], max_unary: int) -> None:
    vocab = Vocab([*preterminals, "(A", ")A", "(B", ")B", "(C"])  # "(C" has no closing: never allowed
    for n, max_len in sizes:
        constraint = BracketConstraint([n], vocab, preterminals=preterminals, order="in_order",
                                       max_unary=max_unary)
        admitted = admitted_sequences(constraint, vocab, max_len)
        assert admitted == _well_formed(n, max_len, preterminals, max_unary) and admitted
        # the state, stepped along each admitted sequence, allows its tokens, and the end
        # where a prefix is complete itself (a unary constituent may still follow)
        for seq in sorted(admitted)[:200]:
            state = constraint.start(torch.tensor([0]))
            for i, sym in enumerate(seq):
                remaining = torch.tensor([max_len + 1 - i])
                mask = state.allowed(remaining=remaining)[0]
                assert mask[vocab.index(sym)] and bool(mask[EOS]) == (seq[:i] in admitted), seq
                state.advance(torch.tensor([vocab.index(sym)]))
            assert state.allowed(remaining=torch.tensor([max_len + 1 - len(seq)]))[0, EOS], seq


def test_the_in_order_constraint_by_hand() -> None:
    vocab = Vocab(["XX", "(A", ")A", "(B", ")B"])
    c = BracketConstraint([2, 1, 2], vocab, preterminals=["XX"], order="in_order")
    ids = {s: vocab.index(s) for s in vocab.symbols}

    def allowed(prefixes: list[str], remaining: tuple[int, ...] = (10, 10, 10)) -> list[set[str]]:
        tokens = torch.tensor([[ids[s] for s in p.split()] for p in prefixes]).view(3, -1)
        mask = c.allowed(tokens, rows=torch.tensor([0, 1, 2]), remaining=torch.tensor(remaining))
        return [{vocab.symbols[i] for i in row.nonzero().flatten().tolist()} for row in mask]

    assert allowed(["", "", ""]) == [{"XX"}] * 3  # a preterminal first
    # after a bare first word: an opening above it; after an opening: a word or its unary closing
    assert allowed(["XX", "XX", "XX"]) == [{"(A", "(B"}] * 3
    assert allowed(["XX (A", "XX (A", "XX (B"]) == [{"XX", ")A"}, {")A"}, {"XX", ")B"}]
    # one tree closed: the end once every word is out, else an opening above it; every word
    # out inside a bracket: an opening above the last word, or the closing
    assert allowed(["XX (A )A", "XX (A )A", "XX (B XX"]) == [{"(A", "(B"}, {"(A", "(B", "</s>"},
                                                           {"(A", "(B", ")B"}]
    # closing the only open bracket with a word still out needs room for an opening above
    # the tree, the word, its closing and the end
    assert allowed(["XX (A", "XX (A", "XX (A"], remaining=(4, 4, 5)) == [{"XX"}, {")A"}, {"XX", ")A"}]
    assert allowed(["XX (A )A", "XX (A )A", "XX (A XX"], remaining=(4, 1, 2)) == [{"(A", "(B"}, {"</s>"},
                                                                                 {")A"}]
