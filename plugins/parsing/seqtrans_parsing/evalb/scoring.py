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

from collections.abc import Iterable, Sequence
from dataclasses import replace

from seqtrans_parsing.evalb.params import COLLINS, Parameters
from seqtrans_parsing.evalb.reading import Line, Quote, Setup, read_fast, read_literal
from seqtrans_parsing.evalb.report import Report, SentenceResult, Summary, Totals

MAX_LINE_BYTES = 4998  # fgets(buff, 5000) holds 4,999 bytes, the newline included
MAX_WORDS = 200
MAX_BRACKETS = 200



class _Abort(Exception):
    """More errors than MAX_ERROR allows: the program exits."""


class _Scorer:
    def __init__(self, params: Parameters, *, limits: bool) -> None:
        self.s = Setup(params)
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

    def read(self, text: str) -> Line:
        line = (read_literal(text, self.s, debug=self.p.debug) if self.p.debug > 1
                else read_fast(text, self.s))
        for message in line.errors:
            self.error(message)
        if line.stuck:
            self.stuck()
        return line

    def over_limits(self, texts: Sequence[str], lines: Sequence[Line]) -> str | None:
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

    def _result(self, gold: Line, wn: int, r_bn1: int, r_bn2: int, match: int, crossing: int,
                correct: int) -> SentenceResult:
        return SentenceResult(
            id=self.line_no, length=gold.length, status=self.status,
            recall=100.0 * match / r_bn1 if r_bn1 else 0.0,
            precision=100.0 * match / r_bn2 if r_bn2 else 0.0,
            matched=match, gold_brackets=r_bn1, test_brackets=r_bn2, crossing=crossing, words=wn,
            correct_tags=correct, tag_accuracy=100.0 * correct / wn if wn else 0.0)

    def _calc(self, gold: Line, test: Line, gold_text: str, test_text: str,
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


def _massage(side: Line, s: Setup) -> tuple[list[str], list[int]]:
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


def _match_fast(gold: Line, test: Line, g_lab: list[str], t_lab: list[str], g_keep: list[int],
                t_keep: list[int], s: Setup) -> int:
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


def _crossing_fast(gold: Line, test: Line, g_keep: list[int], t_keep: list[int]) -> int:
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


def _crossing_pairs(gold: Line, test: Line, g_keep: list[int], t_keep: list[int]) -> int:
    crossing = 0
    for j in t_keep:
        s, e = test.starts[j], test.ends[j]
        for i in g_keep:
            a, b = gold.starts[i], gold.ends[i]
            if (a < s and s < b < e) or (a > s and a < e and b > e):
                crossing += 1
                break
    return crossing


def _match_literal(gold: Line, test: Line, g_lab: list[str], t_lab: list[str], s: Setup,
                   gold_text: str, test_text: str, dbg: list[str]) -> tuple[int, int]:
    """The program's pairwise loops with their DEBUG 2 output (and the reference for
    :func:`_match_fast` and :func:`_crossing_fast`)."""
    gr, tr = gold.results, test.results

    def span(side: Line, text: str, i: int) -> str:
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


def _fix_quote(gold: Line, test: Line, s: Setup, dbg: list[str] | None) -> None:
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


def _reinsert(q: Quote, side: Line, dbg: list[str] | None) -> None:
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


def _dsp_info(gold: Line, test: Line, r: SentenceResult) -> str:
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
    total, short = Totals(), Totals()
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

