"""Vocabulary shortlists (``decode.shortlist``), in one place: the table and its file
(:mod:`.table`), building a run's table from its training data (:mod:`.build`), and
search with the output projection restricted to it (:mod:`.search`)."""

from seqtrans._moved import forwarding

__getattr__ = forwarding("seqtrans.shortlist", "seqtrans.shortlist", "seqtrans.shortlist.table")
