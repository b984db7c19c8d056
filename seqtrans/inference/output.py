"""How ``predict`` writes each input's outputs: text lines, or one JSON object per input,
with the fields asked for (per-token log-probabilities, word alignments)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from seqtrans.data.batches import prediction
from seqtrans.decoding.alignment import pharaoh
from seqtrans.decoding.search import Hypothesis, length_penalty
from seqtrans.inference.loading import Loaded

FORMATS = ("text", "jsonl")


@dataclass(frozen=True)
class OutputOptions:
    """What ``predict`` writes. ``format``: ``text`` (one line per output, as before) or
    ``jsonl`` (one object per input). ``token_log_probs``: each token's log-probability;
    ``alignments``: source-target word alignments in Pharaoh ``i-j`` format, from decoder
    layer ``alignment_layer`` (from 1; None: the mean of all layers)."""

    format: Literal["text", "jsonl"] = "text"
    token_log_probs: bool = False
    alignments: bool = False
    alignment_layer: int | None = None

    @property
    def details(self) -> bool:
        """Whether a teacher-forced pass over the outputs is needed."""
        return self.token_log_probs or self.alignments


#: Text lines, as ``predict`` writes by default.
TEXT = OutputOptions()


def render(loaded: Loaded, options: OutputOptions, *, number: int, source: Any, hyps: Sequence[Hypothesis],
           alignments: Sequence[list[tuple[int, int]]] | None) -> list[str]:
    """The lines written for input line ``number``: its outputs ``hyps`` (best first,
    or samples in the order drawn, as :meth:`Loaded.decode` returns them with their text)
    and, where asked for, their alignments."""
    several = loaded.config.decode.outputs_per_input > 1
    hyps = hyps if several or options.format == "jsonl" else hyps[:1]
    texts = [_text(h) for h in hyps]
    if options.format == "jsonl":
        alpha = loaded.config.decode.alpha
        records = []
        for k, (hyp, text) in enumerate(zip(hyps, texts)):
            record: dict[str, Any] = {
                "output": text, "tokens": loaded.codec.vocabularies.target.decode(hyp.tokens),
                "log_prob": hyp.log_prob, "score": hyp.score,
                "normalized_score": hyp.log_prob / float(length_penalty(float(len(hyp.tokens) + 1), alpha))}
            if options.token_log_probs:
                record["token_log_probs"] = list(hyp.token_log_probs or ())
            if alignments is not None:
                record["alignment"] = pharaoh(alignments[k])
            records.append(record)
        return [json.dumps({"line": number, "hypotheses": records}, ensure_ascii=False)]
    lines = []
    for k, (hyp, text) in enumerate(zip(hyps, texts)):
        columns = [f"{k + 1}", f"{hyp.score:.4f}", text] if several else [text]
        if alignments is not None:
            columns.append(pharaoh(alignments[k]))
        if options.token_log_probs:
            columns.append(" ".join(f"{x:.4f}" for x in hyp.token_log_probs or ()))
        lines.append("\t".join(columns))
    if several:
        return [*lines, ""]
    return lines or [loaded.task.format(prediction(loaded.codec, [], source))]  # no output found


def _text(hyp: Hypothesis) -> str:
    if hyp.text is None:  # the search functions' own hypotheses know no task
        raise ValueError("a hypothesis without its text: render what Loaded.decode returns")
    return hyp.text


def render_failure(loaded: Loaded, options: OutputOptions, *, number: int, problem: str) -> list[str]:
    """The lines written for an input line that could not be decoded: an empty output,
    or in ``jsonl`` an object with its error."""
    if options.format == "jsonl":
        return [json.dumps({"line": number, "error": problem}, ensure_ascii=False)]
    return [""]
