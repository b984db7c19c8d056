"""EVALB, the bracket scorer of Sekine and Collins (1997; Ellis' 2006 revision), in Python.

A reimplementation of the reference program's scoring, written from its documented
behaviour and its outputs: the parameter file (:func:`read_parameters`), the reading
of each line, error and skip sentences, function tags, deleted labels, the quote
repair of 2006, duplicate brackets, crossing brackets, the per-sentence lines, the
summary for all sentences and for those up to ``CUTOFF_LEN`` words, and the ``DEBUG``
output. :meth:`Report.text` is, byte for byte, what ``evalb`` prints on stdout, and
:attr:`Report.messages` what it prints on stderr.

Where the reference program has undefined behaviour, this module does something
defined and says so:

- A sentence past the program's fixed buffers (a line of more than 4,998 bytes, more
  than 200 words or 200 brackets) is an error sentence with a message naming the
  limit (the reference program overflows or splits the line); ``limits=False``
  scores it instead.
- A closing bracket with nothing open is an error (``Bracketing unbalance (too many
  close bracket)``) and is ignored; the reference program reads outside its stack.

Usage::

    report = evalb(gold_lines, test_lines, COLLINS)
    report.all.fmeasure, report.text()
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from seqtrans.errors import DataError

__all__ = ["COLLINS", "Parameters", "Report", "SentenceResult", "Summary", "evalb",
           "read_parameters", "parse_parameters"]

MAX_LINE_BYTES = 4998  # fgets(buff, 5000) holds 4,999 bytes, the newline included
MAX_WORDS = 200
MAX_BRACKETS = 200

HEADER = (
    "  Sent.                        Matched  Bracket   Cross        Correct Tag\n"
    " ID  Len.  Stat. Recal  Prec.  Bracket gold test Bracket Words  Tags Accracy\n"
    "============================================================================\n"
)
RULE = "============================================================================\n"


# --------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class Parameters:
    """The settings of a ``.prm`` file; the defaults are the program's own (no file)."""

    debug: int = 0
    max_error: int = 10
    cutoff_len: int = 40
    labeled: bool = True
    delete_labels: tuple[str, ...] = ()
    delete_labels_for_length: tuple[str, ...] = ()
    quote_labels: tuple[str, ...] = ()
    eq_labels: tuple[tuple[str, str], ...] = ()
    eq_words: tuple[tuple[str, str], ...] = ()


#: ``COLLINS.prm``, the standard setting for Penn Treebank results.
COLLINS = Parameters(
    debug=0, max_error=10, cutoff_len=40, labeled=True,
    delete_labels=("TOP", "-NONE-", ",", ":", "``", "''", "."),
    delete_labels_for_length=("-NONE-",),
    eq_labels=(("ADVP", "PRT"),),
)

_C_SPACE = " \t\n\v\f\r"  # isspace() in the C locale
_SP = "[ \t\n\v\f\r]"


def _atoi(text: str) -> int:
    """C's atoi: leading white space, an optional sign, digits; 0 when there are none."""
    m = re.match(r"[ \t\n\v\f\r]*([+-]?\d+)", text)
    return int(m.group(1)) if m else 0


def _keyword(line: str, key: str) -> bool:
    return line.startswith(key) and (len(line) == len(key) or line[len(key)] in _C_SPACE)


def parse_parameters(text: str, *, base: Parameters | None = None) -> tuple[Parameters, list[str]]:
    """Read the text of a ``.prm`` file on top of ``base``: the parameters and the
    warnings the reference program prints on stderr (unknown keywords, empty values)."""
    p = base or Parameters()
    warnings: list[str] = []
    lists: dict[str, list] = {
        "delete_labels": list(p.delete_labels), "delete_labels_for_length": list(p.delete_labels_for_length),
        "quote_labels": list(p.quote_labels), "eq_labels": list(p.eq_labels), "eq_words": list(p.eq_words),
    }
    scalars = {"debug": p.debug, "max_error": p.max_error, "cutoff_len": p.cutoff_len, "labeled": p.labeled}
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw[:1] + raw[1:].rstrip(_C_SPACE)
        if line.startswith("#") or len(line) < 3:
            continue
        i = 0
        while i < len(line) and line[i] not in _C_SPACE:
            i += 1
        while i < len(line) and line[i] in _C_SPACE:
            i += 1
        value = line[i:]
        if not value:
            warnings.append(f"Empty value in parameter file ({number})\n")
        if _keyword(line, "DEBUG"):
            scalars["debug"] = _atoi(value)
        elif _keyword(line, "MAX_ERROR"):
            scalars["max_error"] = _atoi(value)
        elif _keyword(line, "CUTOFF_LEN"):
            scalars["cutoff_len"] = _atoi(value)
        elif _keyword(line, "LABELED"):
            scalars["labeled"] = _atoi(value) != 0
        elif _keyword(line, "DELETE_LABEL"):
            lists["delete_labels"].append(value)
        elif _keyword(line, "DELETE_LABEL_FOR_LENGTH"):
            lists["delete_labels_for_length"].append(value)
        elif _keyword(line, "QUOTE_LABEL"):
            lists["quote_labels"].append(value)
        elif _keyword(line, "EQ_LABEL") or _keyword(line, "EQ_WORD"):
            key = "eq_labels" if line.startswith("EQ_LABEL") else "eq_words"
            parts = [t for t in re.split(_SP + "+", value) if t]
            if len(parts) != 2:
                warnings.append(f"{'EQ_LABEL' if key == 'eq_labels' else 'EQ_WORD'} requires two values\n")
                continue
            lists[key].append((parts[0], parts[1]))
        else:
            warnings.append(f"Unknown keyword ({line}) in parameter file\n")
    params = Parameters(
        debug=int(scalars["debug"]), max_error=int(scalars["max_error"]),
        cutoff_len=int(scalars["cutoff_len"]), labeled=bool(scalars["labeled"]),
        delete_labels=tuple(lists["delete_labels"]),
        delete_labels_for_length=tuple(lists["delete_labels_for_length"]),
        quote_labels=tuple(lists["quote_labels"]), eq_labels=tuple(lists["eq_labels"]),
        eq_words=tuple(lists["eq_words"]))
    return params, warnings


def read_parameters(path: str | Path, *, base: Parameters | None = None) -> tuple[Parameters, list[str]]:
    """:func:`parse_parameters` of a file; a missing file raises :class:`DataError`."""
    try:
        text = Path(path).read_bytes().decode("utf-8", "surrogateescape")
    except OSError as exc:
        raise DataError(path, None, f"cannot read the parameter file: {exc.strerror}") from None
    return parse_parameters(text, base=base)


# --------------------------------------------------------------------------- reading a line

_NT = "[^ \t\n\v\f\r()]"
# One token per match: an opening '(' with its label, and, when white space follows,
# the next atom and a ')' right after it (a terminal); a ')'; or a stray character.
_TOKEN = re.compile(rf"{_SP}*(?:\(({_NT}*)(?:{_SP}+({_NT}*)(\))?)?|(\))|({_NT}))")


@dataclass
class _Quote:
    word: str
    label: str
    index: int
    bracket: int
    ends: tuple[int, ...]


@dataclass
class _Line:
    """One side of a sentence as the reference program stores it."""

    words: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    quotes: list[_Quote] = field(default_factory=list)
    length: int = 0  # words whose tag is not in DELETE_LABEL_FOR_LENGTH
    errors: list[str] = field(default_factory=list)
    stuck: bool = False  # the reference program would report 'Reading sentence' until it exits
    buf_starts: list[int] = field(default_factory=list)  # for DEBUG 2
    buf_ends: list[int] = field(default_factory=list)
    debug: list[str] = field(default_factory=list)
    # per bracket: 0 unmatched, 1 matched, 5 deleted, 9 unset
    results: list[int] = field(default_factory=list)
    tag_results: list[int] = field(default_factory=list)  # per word: 0 wrong tag, 1 right, 9 unset


class _Setup:
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


def _is_quote(s: _Setup, label: str, word: str) -> bool:
    return label in s.quote and word in ("'", '"', "/")


def _read_fast(text: str, s: _Setup) -> _Line:
    out = _Line()
    words, tags, starts, ends, labels = out.words, out.tags, out.starts, out.ends, out.labels
    stack: list[int] = []
    delete, delete_len, quote = s.delete, s.delete_for_length, s.quote
    length = 0
    for label, word, tclose, close, stray in _TOKEN.findall(text):
        if tclose:  # (label word)
            if label not in delete_len:
                length += 1
            if label in quote and _is_quote(s, label, word):
                out.quotes.append(_Quote(word, label, len(words), len(starts), tuple(stack)))
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


def _read_literal(text: str, s: _Setup, *, debug: int) -> _Line:
    """The reading loop character by character, with the program's DEBUG 2 output and
    buffer offsets; the reference for :func:`_read_fast`."""
    out = _Line()
    stack: list[int] = []
    n = len(text)

    def atom(i: int) -> tuple[str, int]:
        j = i
        while j < n and text[j] not in _C_SPACE and text[j] not in "()":
            j += 1
        return text[i:j], j

    p = 0
    while p < n:
        c = text[p]
        if c in _C_SPACE:
            p += 1
        elif c == "(":
            label, p = atom(p + 1)
            if p < n and text[p] in _C_SPACE:
                q = p
                while q < n and text[q] in _C_SPACE:
                    q += 1
                word, q = atom(q)
                nxt = text[q] if q < n else ""
                if nxt == ")" and label not in s.delete_for_length:
                    out.length += 1
                if debug > 1:
                    out.debug.append(f"label={label}, word={word}, wid={len(out.words)}\n")
                if nxt == ")" and _is_quote(s, label, word):
                    out.quotes.append(_Quote(word, label, len(out.words), len(out.starts), tuple(stack)))
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


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class SentenceResult:
    """One per-sentence line of the report."""

    id: int
    length: int  # the gold length (for the cut-off)
    status: int  # 0 scored, 1 error, 2 skip
    recall: float
    precision: float
    matched: int
    gold_brackets: int
    test_brackets: int
    crossing: int
    words: int
    correct_tags: int
    tag_accuracy: float
    debug_before: str = ""
    debug_after: str = ""

    def line(self) -> str:
        return (f"{self.id:4d}  {self.length:3d}    {self.status:d}  "
                f"{self.recall:6.2f} {self.precision:6.2f}   {self.matched:3d}    "
                f"{self.gold_brackets:3d}  {self.test_brackets:3d}    {self.crossing:3d}"
                f"   {self.words:4d}  {self.correct_tags:4d}   {self.tag_accuracy:6.2f}\n")


@dataclass
class _Totals:
    sentences: int = 0
    errors: int = 0
    skips: int = 0
    gold: int = 0
    test: int = 0
    matched: int = 0
    complete: int = 0
    words: int = 0
    crossing: int = 0
    no_crossing: int = 0
    two_or_less: int = 0
    correct_tags: int = 0

    def add(self, r: SentenceResult) -> None:
        self.sentences += 1
        if r.status == 1:
            self.errors += 1
        elif r.status == 2:
            self.skips += 1
        else:
            self.gold += r.gold_brackets
            self.test += r.test_brackets
            self.matched += r.matched
            self.complete += r.gold_brackets == r.test_brackets == r.matched
            self.words += r.words
            self.crossing += r.crossing
            self.no_crossing += r.crossing == 0
            self.two_or_less += r.crossing <= 2
            self.correct_tags += r.correct_tags


@dataclass(frozen=True)
class Summary:
    """One block of the summary (all sentences, or those up to the cut-off length);
    percentages as printed; ``fmeasure`` is NaN when recall and precision are both 0."""

    sentences: int
    errors: int
    skips: int
    valid: int
    recall: float
    precision: float
    fmeasure: float
    complete_match: float
    average_crossing: float
    no_crossing: float
    two_or_less_crossing: float
    tagging_accuracy: float
    matched: int
    gold_brackets: int
    test_brackets: int

    @classmethod
    def of(cls, t: _Totals) -> Summary:
        valid = t.sentences - t.errors - t.skips
        r = 100.0 * t.matched / t.gold if t.gold > 0 else 0.0
        p = 100.0 * t.matched / t.test if t.test > 0 else 0.0
        f = 2 * p * r / (p + r) if p + r != 0 else math.nan
        return cls(
            sentences=t.sentences, errors=t.errors, skips=t.skips, valid=valid, recall=r, precision=p,
            fmeasure=f, complete_match=100.0 * t.complete / valid if valid > 0 else 0.0,
            average_crossing=1.0 * t.crossing / valid if valid > 0 else 0.0,
            no_crossing=100.0 * t.no_crossing / valid if valid > 0 else 0.0,
            two_or_less_crossing=100.0 * t.two_or_less / valid if valid > 0 else 0.0,
            tagging_accuracy=100.0 * t.correct_tags / t.words if t.words > 0 else 0.0,
            matched=t.matched, gold_brackets=t.gold, test_brackets=t.test)

    def text(self) -> str:
        # 0/0 is a NaN with its sign bit set on the reference platform: printf shows "-nan"
        f = "  -nan" if math.isnan(self.fmeasure) else f"{self.fmeasure:6.2f}"
        return (f"Number of sentence        = {self.sentences:6d}\n"
                f"Number of Error sentence  = {self.errors:6d}\n"
                f"Number of Skip  sentence  = {self.skips:6d}\n"
                f"Number of Valid sentence  = {self.valid:6d}\n"
                f"Bracketing Recall         = {self.recall:6.2f}\n"
                f"Bracketing Precision      = {self.precision:6.2f}\n"
                f"Bracketing FMeasure       = {f}\n"
                f"Complete match            = {self.complete_match:6.2f}\n"
                f"Average crossing          = {self.average_crossing:6.2f}\n"
                f"No crossing               = {self.no_crossing:6.2f}\n"
                f"2 or less crossing        = {self.two_or_less_crossing:6.2f}\n"
                f"Tagging accuracy          = {self.tagging_accuracy:6.2f}\n")


@dataclass
class Report:
    """What one run of EVALB produces. ``aborted``: it stopped after too many errors
    (then the text has no totals and no summary, as the program's output)."""

    sentences: list[SentenceResult]
    all: Summary
    short: Summary
    cutoff: int
    messages: list[str]
    aborted: bool
    _totals: _Totals = field(repr=False, default_factory=_Totals)

    def text(self) -> str:
        parts = [HEADER]
        for r in self.sentences:
            parts += [r.debug_before, r.line(), r.debug_after]
        if self.aborted:
            return "".join(parts)
        t = self._totals
        parts.append(RULE)
        if t.gold > 0 and t.test > 0:
            parts.append(f"                {self.all.recall:6.2f} {self.all.precision:6.2f} "
                         f"{t.matched:6d} {t.gold:5d} {t.test:5d}  {t.crossing:5d}")
        parts.append(f"  {t.words:5d} {t.correct_tags:5d}   {self.all.tagging_accuracy:6.2f}\n")
        parts.append("=== Summary ===\n\n-- All --\n")
        parts.append(self.all.text())
        parts.append(f"\n-- len<={self.cutoff} --\n")
        parts.append(self.short.text())
        return "".join(parts)

    def stderr(self) -> str:
        return "".join(self.messages)


# --------------------------------------------------------------------------- scoring


class _Abort(Exception):
    """More errors than MAX_ERROR allows: the program exits."""


class _Scorer:
    def __init__(self, params: Parameters, *, limits: bool) -> None:
        self.s = _Setup(params)
        self.p = params
        self.limits = limits
        self.error_count = 0
        self.messages: list[str] = []
        self.line_no = 0
        self.status = 0

    def error(self, message: str) -> None:
        self.status = 1
        self.messages.append(f"{self.line_no} : {message}")
        old = self.error_count
        self.error_count += 1
        if old > self.p.max_error:
            raise _Abort

    def stuck(self) -> None:
        """'Reading sentence' until the program gives up."""
        while True:
            self.error("Reading sentence\n")

    def read(self, text: str) -> _Line:
        line = (_read_literal(text, self.s, debug=self.p.debug) if self.p.debug > 1
                else _read_fast(text, self.s))
        for message in line.errors:
            self.error(message)
        if line.stuck:
            self.stuck()
        return line

    def over_limits(self, texts: Sequence[str], lines: Sequence[_Line]) -> str | None:
        for text in texts:
            if len(text) > MAX_LINE_BYTES // 4 and len(text.rstrip("\n").encode("utf-8", "surrogateescape")) \
                    > MAX_LINE_BYTES:
                return f"Line longer than EVALB's limit of {MAX_LINE_BYTES} bytes\n"
        for side in lines:
            if len(side.words) > MAX_WORDS:
                return f"More than EVALB's limit of {MAX_WORDS} words ({len(side.words)})\n"
            if len(side.starts) > MAX_BRACKETS:
                return f"More than EVALB's limit of {MAX_BRACKETS} brackets ({len(side.starts)})\n"
        return None

    def sentence(self, gold_text: str, test_text: str) -> SentenceResult:
        self.status = 0
        debug = self.p.debug
        gold = self.read(gold_text)
        test = self.read(test_text)
        before: list[str] = gold.debug + test.debug
        result = self._calc(gold, test, gold_text, test_text, before)
        after = _dsp_info(gold, test, result) if debug >= 1 else ""
        return replace(result, debug_before="".join(before), debug_after=after)

    def _result(self, gold: _Line, wn: int, r_bn1: int, r_bn2: int, match: int, crossing: int,
                correct: int) -> SentenceResult:
        return SentenceResult(
            id=self.line_no, length=gold.length, status=self.status,
            recall=100.0 * match / r_bn1 if r_bn1 else 0.0,
            precision=100.0 * match / r_bn2 if r_bn2 else 0.0,
            matched=match, gold_brackets=r_bn1, test_brackets=r_bn2, crossing=crossing, words=wn,
            correct_tags=correct, tag_accuracy=100.0 * correct / wn if wn else 0.0)

    def _calc(self, gold: _Line, test: _Line, gold_text: str, test_text: str,
              dbg: list[str]) -> SentenceResult:
        s, debug = self.s, self.p.debug
        gold.results = [9] * len(gold.starts)
        test.results = [9] * len(test.starts)
        if debug > 1:
            dbg.append("\n")
        if self.limits:
            problem = self.over_limits((gold_text, test_text), (gold, test))
            if problem is not None:
                self.error(problem)
                return self._result(gold, 0, 0, 0, 0, 0, 0)
        if not test.words:
            self.status = 2
            return self._result(gold, 0, 0, 0, 0, 0, 0)
        if len(gold.words) != len(test.words):
            _fix_quote(gold, test, s, dbg if debug > 1 else None)
            if len(gold.words) != len(test.words):
                self.error(f"Length unmatch ({len(gold.words)}|{len(test.words)})\n")
                return self._result(gold, 0, 0, 0, 0, 0, 0)
        if gold.words != test.words:
            for a, b in zip(gold.words, test.words):
                if not s.word_eq(a, b):
                    self.error(f"Words unmatch ({a}|{b})\n")
                    return self._result(gold, 0, 0, 0, 0, 0, 0)
        g_lab, g_keep = _massage(gold, s)
        t_lab, t_keep = _massage(test, s)
        if debug > 1:
            match, crossing = _match_literal(gold, test, g_lab, t_lab, s, gold_text, test_text, dbg)
        else:
            match = _match_fast(gold, test, g_lab, t_lab, g_keep, t_keep, s)
            crossing = _crossing_fast(gold, test, g_keep, t_keep)
        correct = 0
        tg = gold.tag_results = [9] * len(gold.words)
        tt = test.tag_results = [9] * len(test.words)
        for i, (a, b) in enumerate(zip(gold.tags, test.tags)):
            ok = s.label_eq(a, b)
            correct += ok
            tg[i] = tt[i] = int(ok)
        return self._result(gold, len(gold.words), len(g_keep), len(t_keep), match, crossing, correct)


def _massage(side: _Line, s: _Setup) -> tuple[list[str], list[int]]:
    """Labels without function tags, and the indices of the brackets that count
    (not covering zero words, not deleted); sets the program's result codes."""
    labels = list(side.labels)
    keep: list[int] = []
    results = side.results
    for i, (a, b) in enumerate(zip(side.starts, side.ends)):
        if a == b:
            results[i] = 5
            continue
        short, deleted = s.bracket_label(labels[i])
        labels[i] = short
        if deleted:
            results[i] = 5
        else:
            results[i] = 0
            keep.append(i)
    side.labels = labels
    return labels, keep


def _match_fast(gold: _Line, test: _Line, g_lab: list[str], t_lab: list[str], g_keep: list[int],
                t_keep: list[int], s: _Setup) -> int:
    """Each gold bracket, in order, takes the first unmatched test bracket of the same
    span whose label is equal (or EQ_LABEL); n gold and m test duplicates match min(n, m)."""
    by_span: dict[tuple[int, int], list[int]] = {}
    for j in t_keep:
        by_span.setdefault((test.starts[j], test.ends[j]), []).append(j)
    gr, tr = gold.results, test.results
    labeled, eq = s.p.labeled, s.eq_labels
    match = 0
    for i in g_keep:
        cands = by_span.get((gold.starts[i], gold.ends[i]))
        if not cands:
            continue
        a = g_lab[i]
        for k, j in enumerate(cands):
            b = t_lab[j]
            if not labeled or a == b or (a, b) in eq:
                gr[i] = tr[j] = 1
                match += 1
                del cands[k]
                break
    return match


def _crossing_fast(gold: _Line, test: _Line, g_keep: list[int], t_keep: list[int]) -> int:
    """Test brackets that cross some gold bracket: (a, b) crosses (s, e) when
    a < s < b < e or s < a < e < b. Bit sets over positions instead of all pairs."""
    gs, ge, ts, te = gold.starts, gold.ends, test.starts, test.ends
    if any(ge[i] < 0 for i in g_keep) or any(te[j] < 0 for j in t_keep):
        return _crossing_pairs(gold, test, g_keep, t_keep)
    n = max([ge[i] for i in g_keep] + [te[j] for j in t_keep] + [0]) + 1
    ends_by_start = [0] * (n + 1)
    starts_by_end = [0] * (n + 1)
    for i in g_keep:
        ends_by_start[gs[i]] |= 1 << ge[i]
        starts_by_end[ge[i]] |= 1 << gs[i]
    ends_before = [0] * (n + 1)  # [x]: ends of gold brackets starting before x
    acc = 0
    for x in range(n + 1):
        ends_before[x] = acc
        acc |= ends_by_start[x]
    starts_after = [0] * (n + 1)  # [x]: starts of gold brackets ending after x
    acc = 0
    for x in range(n, -1, -1):
        starts_after[x] = acc
        acc |= starts_by_end[x]
    crossing = 0
    for j in t_keep:
        a, b = ts[j], te[j]
        if b - a < 2:
            continue
        inside = ((1 << b) - 1) ^ ((1 << (a + 1)) - 1)  # positions a+1 .. b-1
        if ends_before[a] & inside or starts_after[b] & inside:
            crossing += 1
    return crossing


def _crossing_pairs(gold: _Line, test: _Line, g_keep: list[int], t_keep: list[int]) -> int:
    crossing = 0
    for j in t_keep:
        s, e = test.starts[j], test.ends[j]
        for i in g_keep:
            a, b = gold.starts[i], gold.ends[i]
            if (a < s and s < b < e) or (a > s and a < e and b > e):
                crossing += 1
                break
    return crossing


def _match_literal(gold: _Line, test: _Line, g_lab: list[str], t_lab: list[str], s: _Setup,
                   gold_text: str, test_text: str, dbg: list[str]) -> tuple[int, int]:
    """The program's pairwise loops with their DEBUG 2 output (and the reference for
    :func:`_match_fast` and :func:`_crossing_fast`)."""
    gr, tr = gold.results, test.results

    def span(side: _Line, text: str, i: int) -> str:
        if not side.buf_starts:
            return ""
        return text[side.buf_starts[i]: side.buf_ends[i]]

    match = 0
    matched_label = [False] * len(test.starts)
    for i in range(len(gold.starts)):
        found = False
        for j in range(len(test.starts)):
            dbg.append(f"1.res={gr[i]}, 2.res={tr[j]}, 1.start={gold.starts[i]}, 2.start={test.starts[j]}, "
                       f"1.end={gold.ends[i]}, 2.end={test.ends[j]}\n")
            if gr[i] != 5 and tr[j] == 0 and gold.starts[i] == test.starts[j] \
                    and gold.ends[i] == test.ends[j]:
                if not s.p.labeled or s.label_eq(g_lab[i], t_lab[j]):
                    gr[i] = tr[j] = 1
                    match += 1
                    found = True
                    break
                dbg.append(f"  LABEL[{gold.starts[i]}-{gold.ends[i] - 1}]: {span(gold, gold_text, i)}\n")
                found = True
                matched_label[j] = True
        if not found and gr[i] != 5:
            dbg.append(f"  BRACKET[{gold.starts[i]}-{gold.ends[i] - 1}]: {span(gold, gold_text, i)}\n")
    for j in range(len(test.starts)):
        if tr[j] == 0 and not matched_label[j]:
            dbg.append(f"  EXTRA[{test.starts[j]}-{test.ends[j] - 1}]: {span(test, test_text, j)}\n")
    crossing = 0
    last_i = -1
    for j in range(len(test.starts)):
        for i in range(len(gold.starts)):
            a, b, c, d = gold.starts[i], gold.ends[i], test.starts[j], test.ends[j]
            if gr[i] != 5 and tr[j] != 5 and ((a < c and b > c and b < d) or (a > c and a < d and b > d)):
                if i != last_i:
                    dbg.append(f"  CROSSING[{a}-{b - 1}]: {span(gold, gold_text, i)}\n")
                    last_i = i
                crossing += 1
                break
    return match, crossing


def _fix_quote(gold: _Line, test: _Line, s: _Setup, dbg: list[str] | None) -> None:
    """Ellis' 2006 repair: a quote-like terminal deleted on one side only (say ``('' ")``
    in gold and ``(NN ")`` in test) is put back on the deleting side."""
    q1, q2 = gold.quotes, test.quotes
    if dbg is not None:
        for i in range(max(len(q1), len(q2))):
            if i < len(q1):
                dbg.append(f"{q1[i].index}: {q1[i].label} - {q1[i].word}\n")
            if i < len(q2):
                dbg.append(f"{q2[i].index}: {q2[i].label} - {q2[i].word}\n")
    for i in range(len(q2)):
        ind = q2[i].index
        for j in range(len(q1)):
            if q1[j].index == ind and q1[j].label != q2[i].label:
                if q1[j].label in s.delete and q2[i].label not in s.delete:
                    _reinsert(q1[j], gold, dbg)
                    for k in range(j, len(q1)):
                        q1[k].index += 1
                elif q2[i].label in s.delete and q1[j].label not in s.delete:
                    _reinsert(q2[i], test, dbg)
                    for k in range(i, len(q2)):
                        q2[k].index += 1


def _reinsert(q: _Quote, side: _Line, dbg: list[str] | None) -> None:
    side.words.insert(q.index, q.word)
    side.tags.insert(q.index, q.label)
    if dbg is not None:
        dbg.append(f"bra={q.bracket}, ind={q.index}\n")
    for k in range(len(side.starts)):
        if dbg is not None:
            dbg.append(f"bracket[{k}]={{{side.starts[k]},{side.ends[k]}}}\n")
        if k >= q.bracket:
            side.starts[k] += 1
            side.ends[k] += 1
    if dbg is not None:
        dbg.append(f"endslen={len(q.ends)}\n")
    for k in q.ends:
        side.ends[k] += 1


def _dsp_info(gold: _Line, test: _Line, r: SentenceResult) -> str:
    """The DEBUG 1 dump of both sides after scoring."""
    out = [f"-<1>---(wn1={len(gold.words):3d}, bn1={len(gold.starts):3d})-           "
           f"-<2>---(wn2={len(test.words):3d}, bn2={len(test.starts):3d})-\n"]
    tg, tt = gold.tag_results, test.tag_results
    for i in range(max(len(gold.words), len(test.words))):
        if i < len(gold.words) and gold.words[i]:
            res = tg[i] if i < len(tg) else 9
            out.append(f"{i:3d} : {res:d} : {gold.tags[i]:<6s}  {gold.words[i]:<16s}      ")
        else:
            out.append(" " * 40)
        if i < len(test.words) and test.words[i]:
            res = tt[i] if i < len(tt) else 9
            out.append(f"{i:3d} : {res:d} : {test.tags[i]:<6s}  {test.words[i]:<16s}\n")
        else:
            out.append("\n")
    out.append("\n")
    gr, trr = gold.results, test.results
    for i in range(max(len(gold.starts), len(test.starts))):
        if i < len(gold.starts):
            out.append(f"{i:3d} : {gr[i]:d} : {gold.starts[i]:3d}  {gold.ends[i]:3d}  "
                       f"{gold.labels[i]:<6s}      ")
        else:
            out.append(" " * 32)
        if i < len(test.starts):
            out.append(f"{i:3d} : {trr[i]:d} : {test.starts[i]:3d}  {test.ends[i]:3d}  "
                       f"{test.labels[i]:<6s}\n")
        else:
            out.append("\n")
    out.append("\n========\n")
    return "".join(out)


def _lines(source: str | Iterable[str]) -> list[str]:
    """Lines as the program's fgets loop sees them (a last line without newline counts)."""
    if isinstance(source, str):
        parts = source.split("\n")
        if parts and parts[-1] == "":
            parts.pop()
        return parts
    return [line.rstrip("\n") for line in source]


def evalb(gold: str | Iterable[str], test: str | Iterable[str], params: Parameters = COLLINS, *,
          limits: bool = True, max_error: int | None = None) -> Report:
    """Score ``test`` against ``gold``: texts with one tree per line, or sequences of
    lines. ``limits=False`` scores sentences past the reference program's fixed
    buffers; ``max_error`` overrides MAX_ERROR (a negative value: never stop)."""
    if max_error is not None:
        params = replace(params, max_error=max_error if max_error >= 0 else 2**62)
    scorer = _Scorer(params, limits=limits)
    gold_lines, test_lines = _lines(gold), _lines(test)
    results: list[SentenceResult] = []
    total, short = _Totals(), _Totals()
    cutoff = params.cutoff_len
    aborted = False
    try:
        for number, gold_text in enumerate(gold_lines, 1):
            scorer.line_no = number
            if number > len(test_lines):
                scorer.status = 0
                scorer.error("Number of lines unmatch (too many lines in gold file)\n")
                break
            r = scorer.sentence(gold_text, test_lines[number - 1])
            results.append(r)
            total.add(r)
            if r.length <= cutoff:
                short.add(r)
        else:
            scorer.line_no = len(gold_lines) + 1
            if len(test_lines) > len(gold_lines):
                scorer.error("Number of lines unmatch (too many lines in test file)\n")
    except _Abort:
        aborted = True
    return Report(results, Summary.of(total), Summary.of(short), cutoff, scorer.messages, aborted, total)
