"""The parsing task's model-side parts, attached through the engine's extension seam
(:class:`seqtrans.plugin.ModelExtension`): the source cursor and the span cursor
(:mod:`seqtrans_parsing.cursor`) on the decoder's inputs, and the word vectors on the
encoder's (:class:`VectorInput`). The codec's ``model_extensions`` builds them from the
task's settings (``data.source_cursor``, ``data.span_cursor``, ``data.word_vectors``).

Shapes: B sentences, S source length, D d_model.
"""

from __future__ import annotations

from typing import ClassVar, cast

import torch
from torch import Tensor, nn

from seqtrans.plugin import Feature, ModelConfig, ModelExtension
from seqtrans_parsing.cursor import SourceCursor, SpanCursor
from seqtrans_parsing.vectors import WordVectors
from seqtrans_parsing.walk import SourceWalk


class VectorInput(ModelExtension):
    """The word vectors, projected to the model's width and added to the source
    embeddings (``data.source_vectors``): a model extension (:class:`seqtrans.plugin.ModelExtension`).

    Only the projection is a parameter: the vectors come from the codec wherever the
    model is built, so checkpoints stay the size of the model.
    ``encoder_input(src [B, S]) -> [B, S, D]``"""

    limits: ClassVar[dict[Feature, str]] = {
        # a word's vector goes to its first piece once the word is whole: its later pieces may not
        # have arrived
        "stream": "needs whole words, whose later pieces a stream may not have read yet (train "
                  "without data.source_vectors to stream)",
        "export": "adds word vectors to the source embeddings, which CTranslate2's encoder has no "
                  "input for",
    }

    def __init__(self, vectors: WordVectors, d_model: int) -> None:
        super().__init__()
        self.vectors = vectors
        self.proj = nn.Linear(vectors.dim, d_model)

    def encoder_input(self, src: Tensor) -> Tensor:
        found = torch.from_numpy(self.vectors.lookup(src.tolist()))
        # the bias: an int8 decoding copy (seqtrans.linear.quantize.int8_only) keeps no float weight
        return cast(Tensor, self.proj(found.to(src.device, self.proj.bias.dtype)))


def build(model: ModelConfig, *, walk: SourceWalk, source_cursor: bool, span_cursor: bool,
          vectors: WordVectors | None) -> dict[str, ModelExtension]:
    """The extensions the settings ask for, in the order they are made and applied
    (the order the parameters of earlier runs were made in: seeds initialise as they did)."""
    out: dict[str, ModelExtension] = {}
    if source_cursor:
        out["source_cursor"] = SourceCursor(model.d_model, walk)
    if span_cursor:
        out["span_cursor"] = SpanCursor(model.d_model, walk)
    if vectors is not None:
        out["source_vectors"] = VectorInput(vectors, model.d_model)
    return out
