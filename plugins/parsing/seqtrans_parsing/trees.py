"""Penn Treebank trees: reading bracketed text with line numbers, and the standard
preprocessing (no empty elements, no function tags, no empty root).

A tree is a :class:`Tree` whose children are trees or, for a preterminal, one word.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from seqtrans.plugin import DataError

__all__ = ["Tree", "MalformedTree", "MAX_DEPTH", "read_trees", "preprocess", "strip_function_tags"]

Child = Union["Tree", str]

# The root labels the treebank (empty) and parsers (TOP, ROOT) put above the sentence.
ROOT_LABELS = frozenset({"", "TOP", "ROOT"})


@dataclass
class Tree:
    """A constituent: its label and its children (subtrees, or one word for a preterminal)."""

    label: str
    children: list[Child]

    @property
    def is_preterminal(self) -> bool:
        return len(self.children) == 1 and isinstance(self.children[0], str)

    def leaves(self) -> list[str]:
        return [w for _, w in self.tagged()]

    def tagged(self) -> list[tuple[str, str]]:
        """(tag, word) of every preterminal, left to right."""
        out: list[tuple[str, str]] = []
        stack: list[Tree] = [self]
        while stack:
            node = stack.pop()
            if node.is_preterminal:
                out.append((node.label, node.children[0]))  # type: ignore[arg-type]
            else:
                stack.extend(c for c in reversed(node.children) if isinstance(c, Tree))
        return out

    def __str__(self) -> str:
        parts: list[str] = []
        _write(self, parts)
        return "".join(parts)


def _write(tree: Tree, parts: list[str]) -> None:
    # iterative: a decoded tree may be nested deeper than Python's recursion limit
    stack: list[Child] = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, Tree):
            parts.append("(" + item.label)
            stack.append(")")
            for child in reversed(item.children):
                stack.append(child)
                stack.append(" ")
        else:
            parts.append(item)


class MalformedTree(DataError):
    """Bracketed text that is not a tree; names the file and line."""


_TOKEN = re.compile(r"\(|\)|[^\s()]+")

#: Trees nested deeper are malformed: preprocessing, copying and pickling walk trees
#: recursively, and treebanks nest a few dozen brackets at most.
MAX_DEPTH = 100


def read_trees(text: str, *, path: str | Path | None = None, skip_malformed: bool = False,
               skipped: list[str] | None = None) -> Iterator[tuple[Tree, int]]:
    """The trees of bracketed text (``.mrg`` files, or one tree per line), each with the
    line it starts on.

    A node is ``(LABEL WORD)`` or ``(LABEL SUBTREE...)``; the label may be empty. A
    malformed tree raises :class:`MalformedTree` naming the file and line, or, with
    ``skip_malformed``, is skipped and ``file:line: problem`` appended to ``skipped``.
    Reading resumes after a malformed tree's closing bracket; after text outside any
    tree, at the next line; after a tree left open, at the next line that starts with
    ``(``. A byte-order mark at the start of the text is ignored.
    """
    text = text.removeprefix("\ufeff")
    tokens: list[tuple[str, int, int]] = []  # (token, line, column)
    for number, line in enumerate(text.split("\n"), 1):
        tokens.extend((m.group(), number, m.start()) for m in _TOKEN.finditer(line))
    i = 0
    while i < len(tokens):
        tok, number, _ = tokens[i]
        problem: tuple[int, str] | None = None
        tree: Tree | None = None
        end: int | None = None  # where a balanced but malformed tree ends
        if tok == ")":
            problem = (number, "unbalanced ')' with no open bracket")
        elif tok != "(":
            problem = (number, f"text {tok!r} outside any tree")
        else:
            depth, j = 0, i
            while j < len(tokens):
                if tokens[j][0] == "(":
                    depth += 1
                elif tokens[j][0] == ")":
                    depth -= 1
                j += 1
                if depth == 0:
                    break
            if depth > 0:
                problem = (number, f"tree not closed: {depth} bracket(s) still open at the end of the input")
            else:
                tree, problem = _build(tokens[i:j])
                end = j
                if problem is None:
                    i = j
                    assert tree is not None
                    yield tree, number
                    continue
        assert problem is not None
        if not skip_malformed:
            raise MalformedTree(path, problem[0], problem[1])
        if skipped is not None:
            skipped.append(f"{path if path is not None else '<input>'}:{problem[0]}: {problem[1]}")
        if end is not None:
            i = end
        elif tok != "(":  # the rest of the line is reported with it; the next line is read
            i += 1
            while i < len(tokens) and tokens[i][1] == number:
                i += 1
        else:  # an open tree ends where the next one starts, at the start of a line
            i += 1
            while i < len(tokens) and not (tokens[i][0] == "(" and tokens[i][2] == 0
                                           and tokens[i][1] > number):
                i += 1


def _build(tokens: list[tuple[str, int, int]]) -> tuple[Tree | None, tuple[int, str] | None]:
    """One tree from the tokens of a balanced top-level bracket."""
    stack: list[Tree] = []
    expect_label = False
    root: Tree | None = None
    for tok, number, _ in tokens:
        if tok == "(":
            node = Tree("", [])
            if stack:
                parent = stack[-1]
                if parent.children and isinstance(parent.children[0], str):
                    return None, (number, f"({parent.label} ...) holds both a word and a subtree")
                parent.children.append(node)
            stack.append(node)
            if len(stack) > MAX_DEPTH:
                return None, (number, f"brackets nested more than {MAX_DEPTH} deep")
            expect_label = True
        elif tok == ")":
            node = stack.pop()
            if not node.children:
                return None, (number, f"empty bracket ({node.label})")
            if not stack:
                root = node
            expect_label = False
        else:
            node = stack[-1]
            if expect_label:
                node.label = tok
                expect_label = False
            elif node.children:
                kind = "a second word" if isinstance(node.children[0], str) else "a word after subtrees"
                return None, (number, f"({node.label} ...) holds {kind}: {tok!r}")
            else:
                node.children.append(tok)
    return root, None


def strip_function_tags(label: str) -> str:
    """``NP-SBJ-1`` -> ``NP``, ``NP=2`` -> ``NP``; labels that start with ``-`` (``-NONE-``,
    ``-LRB-``) are kept whole."""
    if label.startswith("-"):
        return label
    for i, c in enumerate(label):
        if c in "-=":
            return label[:i]
    return label


def preprocess(tree: Tree) -> Tree | None:
    """The standard preprocessing: remove ``-NONE-`` elements and the constituents left
    empty, strip function tags and indices from phrase labels, drop the empty (or TOP)
    root above a single constituent. None when nothing is left."""
    cleaned = _clean(tree)
    if cleaned is None:
        return None
    while cleaned.label in ROOT_LABELS and len(cleaned.children) == 1 \
            and isinstance(cleaned.children[0], Tree) and not cleaned.children[0].is_preterminal:
        cleaned = cleaned.children[0]
    if cleaned.label in ROOT_LABELS or cleaned.is_preterminal:
        cleaned = Tree("TOP", cleaned.children if cleaned.label in ROOT_LABELS else [cleaned])
    return cleaned


def _clean(tree: Tree) -> Tree | None:
    if tree.is_preterminal:
        return None if tree.label == "-NONE-" else Tree(tree.label, list(tree.children))
    children = [c for c in (_clean(ch) for ch in tree.children if isinstance(ch, Tree)) if c is not None]
    if not children:
        return None
    return Tree(strip_function_tags(tree.label), list(children))
