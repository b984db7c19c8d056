"""EVALB's results: the per-sentence lines, the totals and the summary, as printed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

HEADER = (
    "  Sent.                        Matched  Bracket   Cross        Correct Tag\n"
    " ID  Len.  Stat. Recal  Prec.  Bracket gold test Bracket Words  Tags Accracy\n"
    "============================================================================\n"
)
RULE = "============================================================================\n"




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
class Totals:
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
    def of(cls, t: Totals) -> Summary:
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
    _totals: Totals = field(repr=False, default_factory=Totals)

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


