"""Search: greedy and batched beam search with the GNMT length penalty, n-best output
and a per-hypothesis constraint hook; the math in :mod:`.search`, the loops in :mod:`.beam`.
What they search is a model or an :class:`~.ensemble.Ensemble` of models (:mod:`.protocol`)."""

from seqtrans.decoding.beam import beam_search, greedy_search
from seqtrans.decoding.constraints import Constraint
from seqtrans.decoding.generate import generate, max_output_length
from seqtrans.decoding.search import Hypothesis, length_penalty

__all__ = ["Constraint", "Hypothesis", "beam_search", "generate", "greedy_search",
           "length_penalty", "max_output_length"]
