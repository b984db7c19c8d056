"""A task's data as the engine holds it: symbol tables (:mod:`.vocab`), the task's
vocabulary files (:mod:`.assets`), examples to ids and back (:mod:`.encoding`), and
padding and token-based batches (:mod:`.batches`)."""

from seqtrans._moved import forwarding

__getattr__ = forwarding("seqtrans.data", "seqtrans.data", "seqtrans.data.batches")
