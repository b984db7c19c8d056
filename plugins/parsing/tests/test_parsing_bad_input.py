"""Bad input to the tree reader, the tree files and linearization, much of it drawn by
hypothesis: whatever the text, reading ends in trees or in a MalformedTree naming the file
and line; skipped trees are counted; written trees and their bracket sequences read back
as they were."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqtrans.plugin import DataError
from seqtrans_parsing import ParsingConfig, ParsingTask
from seqtrans_parsing.evalb import Parameters, parse_parameters, read_parameters
from seqtrans_parsing.linearize import ORDERS, PLACEHOLDER, Order, linearize, to_tree
from seqtrans_parsing.trees import MAX_DEPTH, MalformedTree, Tree, preprocess, read_trees

# Any character a label or word may hold: no brackets, no white space (str.isspace() is
# true only for characters of the categories left out here), no lone surrogates.
_ATOM_CHAR = st.characters(exclude_characters="()", exclude_categories=("Cc", "Cs", "Zs", "Zl", "Zp"))
ATOM = st.text(_ATOM_CHAR, min_size=1, max_size=4)
LABEL = st.sampled_from(["S", "NP", "VP", "NP-SBJ-1", "PP=2", "-NONE-", "-LRB-", ".", "XX"]) | ATOM
WORD = st.sampled_from(["the", "dog", "*T*-1", "0", "-LRB-", "XX"]) | ATOM


def _preterminal(tag: str, word: str) -> Tree:
    return Tree(tag, [word])


def _phrase(label: str, children: list[Tree]) -> Tree:
    return Tree(label, list(children))


PRETERMINALS = st.builds(_preterminal, LABEL, WORD)

def _phrases_of(kids: st.SearchStrategy[Tree]) -> st.SearchStrategy[Tree]:
    return st.builds(_phrase, LABEL, st.lists(kids, min_size=1, max_size=4))


TREES = st.recursive(PRETERMINALS, _phrases_of, max_leaves=12)
PHRASES = st.builds(_phrase, LABEL, st.lists(TREES, min_size=1, max_size=3))  # a root that is no preterminal

# Text made of the pieces that matter to the reader, and of anything else.
PIECES = st.sampled_from(["(", ")", " ", "\n", "\r\n", "\t", "S", "NP", "x", "\ufeff", "-NONE-", "(NN a)"])
TEXT = st.lists(PIECES | st.text(max_size=3), max_size=40).map("".join)


@settings(max_examples=150)
@given(trees=st.lists(TREES, min_size=1, max_size=5), separator=st.sampled_from(["\n", "\r\n", " ", "\n\n"]),
       bom=st.booleans())
def test_written_trees_read_back_as_they_were(trees: list[Tree], separator: str, bom: bool) -> None:
    text = ("\ufeff" if bom else "") + separator.join(str(t) for t in trees) + separator
    assert [str(t) for t, _ in read_trees(text, path="t.mrg")] == [str(t) for t in trees]


@settings(max_examples=300)
@given(text=TEXT)
def test_any_text_gives_trees_or_an_error_naming_file_and_line(text: str) -> None:
    lines = text.count("\n") + 1
    try:
        read = list(read_trees(text, path="in.mrg"))
    except MalformedTree as err:
        assert err.path == "in.mrg" and err.line is not None and 1 <= err.line <= lines
        assert str(err) == f"in.mrg:{err.line}: {err.problem}" and err.problem
    else:
        for tree, line in read:
            assert 1 <= line <= lines
            assert [str(t) for t, _ in read_trees(str(tree))] == [str(tree)]
    skipped: list[str] = []
    kept = list(read_trees(text, path="in.mrg", skip_malformed=True, skipped=skipped))  # never raises
    for entry in skipped:
        where, line, problem = entry.split(":", 2)
        assert where == "in.mrg" and 1 <= int(line) <= lines and problem.strip()
    for tree, _ in kept:
        cleaned = preprocess(tree)  # preprocessing takes whatever the reader gives
        if cleaned is not None:
            assert not cleaned.is_preterminal
            assert cleaned.leaves() == [w for t, w in tree.tagged() if t != "-NONE-"]


# Lines malformed on their own, brackets balanced within the line, so that they cannot
# join the lines around them into a tree spread over several lines.
_LINE_CHAR = st.characters(exclude_characters="()\n", exclude_categories=("Cs",))
OUTSIDE = st.builds(lambda first, rest: first + rest, _ATOM_CHAR, st.text(_LINE_CHAR, max_size=10))  # no tree
BAD_LINES = st.sampled_from(["(S (NN a) b)", "(S (DT a b))", "(S ())", "()", "(S (NP (NN a)) x y)"]) | OUTSIDE


@settings(max_examples=150)
@given(lines=st.lists(st.tuples(st.booleans(), TREES, BAD_LINES), min_size=1, max_size=8))
def test_malformed_lines_are_skipped_and_counted_and_every_good_tree_is_kept(
        lines: list[tuple[bool, Tree, str]]) -> None:
    text = "\n".join(str(tree) if good else bad for good, tree, bad in lines) + "\n"
    skipped: list[str] = []
    read = list(read_trees(text, path="mixed.mrg", skip_malformed=True, skipped=skipped))
    assert [str(t) for t, _ in read] == [str(tree) for good, tree, _ in lines if good]
    assert [n for _, n in read] == [n for n, (good, _, _) in enumerate(lines, 1) if good]
    bad = [n for n, (good, _, _) in enumerate(lines, 1) if not good]
    assert [int(s.split(":")[1]) for s in skipped] == bad


@settings(max_examples=200)
@given(tree=PHRASES, order=st.sampled_from(ORDERS))
def test_a_tree_comes_back_from_its_bracket_sequence(tree: Tree, order: Order) -> None:
    tagged = tree.tagged()
    words, tags = [w for _, w in tagged], [t for t, _ in tagged]
    built = to_tree(linearize(tree, order=order), words, tags, order=order)
    assert built.repairs == 0 and str(built.tree) == str(tree)
    # a tagging model's target
    built = to_tree(linearize(tree, tags=True, order=order), words, preterminals=set(tags), order=order)
    assert built.repairs == 0 and str(built.tree) == str(tree)
    (again, _), = read_trees(str(tree))  # and through the text
    assert str(to_tree(linearize(again, order=order), again.leaves(), tags, order=order).tree) == str(tree)


TOKENS = st.lists(st.sampled_from([PLACEHOLDER, "(S", ")S", "(NP", ")NP", ")VP", "(", ")", "NN", "junk"]),
                  max_size=30)


@settings(max_examples=300)
@given(tokens=TOKENS, words=st.lists(WORD, max_size=6), order=st.sampled_from(ORDERS))
def test_any_token_sequence_gives_a_tree_over_exactly_the_words(tokens: list[str], words: list[str],
                                                                 order: Order) -> None:
    built = to_tree(tokens, words, order=order)
    assert built.tree.leaves() == words
    assert not built.tree.is_preterminal
    if built.repairs == 0:  # nothing was repaired: the tokens were the tree's own sequence
        assert linearize(built.tree, order=order) == tokens


def _nested(depth: int) -> str:
    return "(A " * (depth - 1) + "(B c)" + ")" * (depth - 1)


def test_trees_nested_too_deep_are_malformed_and_not_a_crash() -> None:
    with pytest.raises(MalformedTree, match=rf"deep.mrg:1: brackets nested more than {MAX_DEPTH} deep"):
        list(read_trees(_nested(MAX_DEPTH + 1), path="deep.mrg"))
    (tree, _), = read_trees(_nested(MAX_DEPTH))  # the deepest allowed goes through every step
    cleaned = preprocess(tree)
    assert cleaned is not None and str(pickle.loads(pickle.dumps(cleaned))) == _nested(MAX_DEPTH)
    assert str(to_tree(linearize(cleaned), ["c"], ["B"]).tree) == _nested(MAX_DEPTH)
    # a decoded sequence may nest deeper still: it is written and linearized without recursion
    deep = to_tree(["(A"] * 5000 + [PLACEHOLDER] + [")A"] * 5000, ["w"])
    assert deep.repairs == 0 and str(deep.tree).count("(") == 5001 and len(linearize(deep.tree)) == 10001
    deep = to_tree([PLACEHOLDER] + ["(A", ")A"] * 5000, ["w"], order="in_order")  # a unary chain
    assert deep.repairs == 0 and str(deep.tree).count("(") == 5001
    assert linearize(deep.tree, order="in_order") == [PLACEHOLDER] + ["(A", ")A"] * 5000


# ---------------------------------------------------------------- tree files


def _read(path: Path) -> list[str]:
    task = ParsingTask(ParsingConfig(train=str(path), dev=str(path), test=str(path)))
    return [str(e.target) for e in task.read("train")]  # type: ignore[union-attr]


def test_a_byte_order_mark_and_crlf_line_ends_read_like_plain_text(tmp_path: Path) -> None:
    trees = "( (S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .)))\n( (S (NP (PRP It)) (VP (VBD was))))\n"
    plain, marked = tmp_path / "plain.mrg", tmp_path / "marked.mrg"
    plain.write_bytes(trees.encode())
    marked.write_bytes(b"\xef\xbb\xbf" + trees.replace("\n", "\r\n").encode())
    assert _read(marked) == _read(plain) == ["(S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .))",
                                              "(S (NP (PRP It)) (VP (VBD was)))"]


def test_a_file_that_is_not_utf8_is_read_as_latin1_and_said_so(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "old.mrg"
    path.write_bytes(b"(S (NN a))\n(S (NN caf\xe9))\n")
    with caplog.at_level(logging.WARNING):
        assert _read(path) == ["(S (NN a))", "(S (NN caf\xe9))"]
    assert f"{path}:2: not valid UTF-8" in caplog.text and "Latin-1" in caplog.text


def test_empty_lines_between_trees_are_no_trees(tmp_path: Path) -> None:
    path = tmp_path / "gaps.mrg"
    path.write_text("\n\n(S (NN a))\n\n\n(S (NN b))\n\n")
    assert _read(path) == ["(S (NN a))", "(S (NN b))"]
    assert [e.origin for e in ParsingTask(ParsingConfig(train=str(path))).read("train")] == [
        f"{path}:3", f"{path}:6"]


def test_an_empty_training_set_names_where_the_trees_were_looked_for(tmp_path: Path) -> None:
    empty = tmp_path / "empty.mrg"
    empty.write_text("\n")
    task = ParsingTask(ParsingConfig(train=str(empty)))
    assert list(task.read("train")) == []
    with pytest.raises(DataError, match=rf"{empty}: holds no training trees"):
        task.build_vocabulary(tmp_path, [])
    with pytest.raises(DataError, match=r"no such file, directory or glob match"):
        list(ParsingTask(ParsingConfig(train=str(tmp_path / "missing*.mrg"))).read("train"))


# ---------------------------------------------------------------- EVALB parameter files

PRM_KEY = st.sampled_from(["DEBUG", "MAX_ERROR", "CUTOFF_LEN", "LABELED", "DELETE_LABEL", "QUOTE_LABEL",
                           "DELETE_LABEL_FOR_LENGTH", "EQ_LABEL", "EQ_WORD", "#", "FOO", ""])
PRM_LINE = st.builds(lambda key, gap, value: key + gap + value, PRM_KEY, st.sampled_from(["", " ", "\t"]),
                     st.text(_LINE_CHAR | st.sampled_from("()"), max_size=8))


@settings(max_examples=300)
@given(lines=st.lists(PRM_LINE | st.text(max_size=6), max_size=12), end=st.sampled_from(["\n", "\r\n"]))
def test_any_parameter_text_gives_parameters_and_the_programs_warnings(lines: list[str], end: str) -> None:
    params, warnings = parse_parameters(end.join(lines))
    assert isinstance(params, Parameters) and all(w.endswith("\n") for w in warnings)
    for value in (params.debug, params.max_error, params.cutoff_len):
        assert -(2**31) <= value < 2**31  # a C int, whatever the digits


_VALUE = st.text(_ATOM_CHAR, min_size=1, max_size=5)  # no white space of any kind
_INT = st.integers(-(2**31), 2**31 - 1)


@settings(max_examples=150)
@given(debug=_INT, max_error=_INT, cutoff=_INT, labeled=st.booleans(), deleted=st.lists(_VALUE, max_size=3),
       pairs=st.lists(st.tuples(_VALUE, _VALUE), max_size=3))
def test_written_parameters_read_back(debug: int, max_error: int, cutoff: int, labeled: bool,
                                      deleted: list[str], pairs: list[tuple[str, str]]) -> None:
    text = "".join([f"DEBUG {debug}\n", f"MAX_ERROR\t{max_error}\n", f"CUTOFF_LEN {cutoff}  \n",
                    f"LABELED {int(labeled)}\n", *(f"DELETE_LABEL {d}\n" for d in deleted),
                    *(f"EQ_LABEL {a} {b}\n" for a, b in pairs)])
    params, warnings = parse_parameters(text)
    assert params == Parameters(debug=debug, max_error=max_error, cutoff_len=cutoff, labeled=labeled,
                                delete_labels=tuple(deleted), eq_labels=tuple(pairs)) and warnings == []


def test_numbers_read_as_the_programs_atoi_reads_them(tmp_path: Path) -> None:
    huge = "9" * 5000  # more digits than int() takes
    params, _ = parse_parameters(f"DEBUG {huge}\nMAX_ERROR 4294967297\nCUTOFF_LEN -{huge}\nLABELED \u0663\n")
    assert (params.debug, params.max_error, params.cutoff_len, params.labeled) == (-1, 1, 0, False)
    path = tmp_path / "odd.prm"
    path.write_bytes(b"\xef\xbb\xbfDEBUG 1\r\nDELETE_LABEL caf\xe9\r\n")  # not UTF-8, and a mark
    params, warnings = read_parameters(path)
    assert params.delete_labels == ("caf\udce9",) and params.debug == 0  # as bytes, as the program has them
    assert warnings == ["Unknown keyword (\ufeffDEBUG 1) in parameter file\n"]
    with pytest.raises(DataError, match=r"missing.prm: cannot read the parameter file"):
        read_parameters(tmp_path / "missing.prm")
