"""Reading one line of bracketed text as EVALB does: its words, tags, brackets and
quote-like terminals, and the errors it reports while reading."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from seqtrans_parsing.evalb.params import C_SPACE, SPACE, Parameters

_NT = "[^ \t\n\v\f\r()]"
# One token per match: an opening '(' with its label, and, when white space follows,
# the next atom and a ')' right after it (a terminal); a ')'; or a stray character.
_TOKEN = re.compile(rf"{SPACE}*(?:\(({_NT}*)(?:{SPACE}+({_NT}*)(\))?)?|(\))|({_NT}))")


@dataclass
class Quote:
    word: str
    label: str
    index: int
    bracket: int
    ends: tuple[int, ...]


@dataclass
class Line:
    """One side of a sentence as the reference program stores it."""

    words: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    quotes: list[Quote] = field(default_factory=list)
    length: int = 0  # words whose tag is not in DELETE_LABEL_FOR_LENGTH
    errors: list[str] = field(default_factory=list)
    stuck: bool = False  # the reference program would report 'Reading sentence' until it exits
    buf_starts: list[int] = field(default_factory=list)  # for DEBUG 2
    buf_ends: list[int] = field(default_factory=list)
    debug: list[str] = field(default_factory=list)
    # per bracket: 0 unmatched, 1 matched, 5 deleted, 9 unset
    results: list[int] = field(default_factory=list)
    tag_results: list[int] = field(default_factory=list)  # per word: 0 wrong tag, 1 right, 9 unset


class Setup:
    """Parameters turned into fast look-ups."""

    def __init__(self, p: Parameters) -> None:
        self.p = p
        self.delete = frozenset(p.delete_labels)
        self.delete_for_length = frozenset(p.delete_labels_for_length)
        self.quote = frozenset(p.quote_labels)
        self.eq_labels = frozenset(p.eq_labels) | frozenset((b, a) for a, b in p.eq_labels)
        self.eq_words = frozenset(p.eq_words) | frozenset((b, a) for a, b in p.eq_words)
        self._modified: dict[str, tuple[str, bool]] = {}

    def label_eq(self, a: str, b: str) -> bool:
        return a == b or (a, b) in self.eq_labels

    def word_eq(self, a: str, b: str) -> bool:
        return a == b or (a, b) in self.eq_words

    def bracket_label(self, label: str) -> tuple[str, bool]:
        """The label with its function tags cut at the first '-' or '=', and whether it
        is deleted (compared to DELETE_LABEL with the EQ_LABEL pairs, as the program does)."""
        found = self._modified.get(label)
        if found is None:
            cut = len(label)
            for sep in "-=":
                k = label.find(sep)
                if k != -1 and k < cut:
                    cut = k
            short = label[:cut]
            deleted = any(self.label_eq(short, d) for d in self.p.delete_labels)
            found = self._modified[label] = (short, deleted)
        return found


def is_quote(s: Setup, label: str, word: str) -> bool:
    return label in s.quote and word in ("'", '"', "/")


def read_fast(text: str, s: Setup) -> Line:
    out = Line()
    words, tags, starts, ends, labels = out.words, out.tags, out.starts, out.ends, out.labels
    stack: list[int] = []
    delete, delete_len, quote = s.delete, s.delete_for_length, s.quote
    length = 0
    for label, word, tclose, close, stray in _TOKEN.findall(text):
        if tclose:  # (label word)
            if label not in delete_len:
                length += 1
            if label in quote and is_quote(s, label, word):
                out.quotes.append(Quote(word, label, len(words), len(starts), tuple(stack)))
            if label not in delete:
                words.append(word)
                tags.append(label)
        elif close:
            if stack:
                ends[stack.pop()] = len(words)
            else:
                out.errors.append("Bracketing unbalance (too many close bracket)\n")
        elif stray:
            out.stuck = True
            break
        else:
            if word:  # '(label word' followed by neither ')' nor '('
                out.errors.append("More than two elements in a bracket\n")
                out.stuck = True
                break
            stack.append(len(starts))
            starts.append(len(words))
            ends.append(-1)
            labels.append(label)
    if stack and not out.stuck:
        out.errors.append("Bracketing is unbalanced (too many open bracket)\n")
    out.length = length
    return out


def read_literal(text: str, s: Setup, *, debug: int) -> Line:
    """The reading loop character by character, with the program's DEBUG 2 output and
    buffer offsets; the reference for :func:`read_fast`."""
    out = Line()
    stack: list[int] = []
    n = len(text)

    def atom(i: int) -> tuple[str, int]:
        j = i
        while j < n and text[j] not in C_SPACE and text[j] not in "()":
            j += 1
        return text[i:j], j

    p = 0
    while p < n:
        c = text[p]
        if c in C_SPACE:
            p += 1
        elif c == "(":
            label, p = atom(p + 1)
            if p < n and text[p] in C_SPACE:
                q = p
                while q < n and text[q] in C_SPACE:
                    q += 1
                word, q = atom(q)
                nxt = text[q] if q < n else ""
                if nxt == ")" and label not in s.delete_for_length:
                    out.length += 1
                if debug > 1:
                    out.debug.append(f"label={label}, word={word}, wid={len(out.words)}\n")
                if nxt == ")" and is_quote(s, label, word):
                    out.quotes.append(Quote(word, label, len(out.words), len(out.starts), tuple(stack)))
                if nxt == ")":
                    if label not in s.delete:
                        out.words.append(word)
                        out.tags.append(label)
                    p = q + 1
                    continue
                if nxt != "(":
                    out.errors.append("More than two elements in a bracket\n")
                    out.stuck = True
                    return out
            stack.append(len(out.starts))
            out.starts.append(len(out.words))
            out.ends.append(-1)
            out.labels.append(label)
            out.buf_starts.append(p)
            out.buf_ends.append(p)
        elif c == ")":
            if stack:
                b = stack.pop()
                out.ends[b] = len(out.words)
                out.buf_ends[b] = p
            else:
                out.errors.append("Bracketing unbalance (too many close bracket)\n")
            p += 1
        else:
            out.stuck = True
            return out
    if stack:
        out.errors.append("Bracketing is unbalanced (too many open bracket)\n")
    return out


