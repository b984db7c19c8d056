"""The model: the Transformer (:mod:`.transformer`), its masks and dropout, and the
extension seam through which a task adds model-side parts (:mod:`.extension`).

``from seqtrans.model import Transformer`` keeps working: the names of
:mod:`.transformer` are served from here, imported on first use so that the lower
layers can import :mod:`.masks` or :mod:`.extension` without the whole model."""

from seqtrans._moved import forwarding

__getattr__ = forwarding("seqtrans.model", "seqtrans.model", "seqtrans.model.transformer", warn=False)
