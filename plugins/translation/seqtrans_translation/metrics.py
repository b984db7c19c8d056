"""sacreBLEU's BLEU and chrF of detokenized output against the raw references.

The scores are sacreBLEU's corpus scores with their signatures, the numbers a reader
can put beside published ones (Post 2018, "A Call for Clarity in Reporting BLEU Scores").
"""

from __future__ import annotations

from collections.abc import Sequence

from sacrebleu.metrics import BLEU, CHRF


def score(hypotheses: Sequence[str], references: Sequence[str], *,
          tokenize: str = "13a") -> dict[str, float | str]:
    """``bleu``, ``chrf``, ``bleu_length_ratio`` (output / reference length in BLEU tokens)
    and the sacreBLEU signatures ``bleu_signature`` and ``chrf_signature``."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    bleu, chrf = BLEU(tokenize=tokenize), CHRF()
    # sacreBLEU knows its signature only after scoring: an empty corpus scores one empty line
    hyps, refs = (list(hypotheses), list(references)) if references else ([""], [""])
    b = bleu.corpus_score(hyps, [refs])
    c = chrf.corpus_score(hyps, [refs])
    b_score, c_score = (b.score, c.score) if references else (0.0, 0.0)
    ratio = b.sys_len / b.ref_len if b.ref_len else 0.0
    return {"bleu": b_score, "chrf": c_score, "bleu_length_ratio": ratio,
            "bleu_signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature())}
