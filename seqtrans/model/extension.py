"""The model-extension seam: model-side parts a task adds to the Transformer.

A task whose model needs more than its tokens (fixed word vectors on the source side,
a pointer into the source on the target side, features of a speech frame) does not
edit the engine: its codec has the :class:`~seqtrans.tasks.ModelExtending` ability and
returns :class:`ModelExtension` modules, which :func:`seqtrans.model.transformer.build_model`
attaches to the model under their names. Their parameters are the model's: trained
with it, saved in its checkpoints (``extensions.NAME.*``), averaged, quantized and
moved to a device with it.

An extension overrides the hooks it needs; the others add nothing:

- :meth:`ModelExtension.encoder_input`: an addition to each source embedding;
- :meth:`ModelExtension.source_context`: what it keeps of each source once encoded
  (computed once per source, like the encoder's output);
- :meth:`ModelExtension.decoder_input`: an addition to each decoder input of whole
  targets (training, scoring: teacher forcing);
- :meth:`ModelExtension.start` and :meth:`ModelExtension.step`: the same additions one
  step at a time during search, from an :class:`ExtensionState` that search, ensembles
  and streaming reorder like the attention caches (a dataclass whose tensor fields are
  marked ``field(metadata=ROW)`` or ``SENTENCE`` reorders with :func:`reorder_fields`).

``decoder_input`` and ``step`` must agree: decoding step by step computes what teacher
forcing computes (the tests of an extension check that against each other).

What the engine cannot do with an extension is asked of the extension, not known to
the engine by name: each operation (:data:`Feature`) checks every extension's
:attr:`ModelExtension.limits` and raises :class:`ExtensionError` naming the extension
and its reason.

Shapes: B sentences, K hypotheses per sentence, N = B*K rows, S source length,
T target positions (this call), D d_model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Literal, Protocol

from torch import Tensor, nn

# what an extension's state marks its fields with, and reorders them by
from seqtrans.attention.common import ROW, SENTENCE, reorder_fields
from seqtrans.errors import UsageError

__all__ = ["ROW", "SENTENCE", "ExtensionError", "ExtensionState", "Feature", "ModelExtension",
           "check_supported", "reorder_fields"]

#: The operations an extension may be unable to take part in.
Feature = Literal["export", "quantize", "stream", "ensemble"]

_ASKED = {"export": "exporting it", "quantize": "int8 decoding (decode.precision=int8)",
          "stream": "streaming (predict --stream)", "ensemble": "decoding it in an ensemble"}

# What the engine itself cannot do with an extension of any kind, when the extension
# gives no reason of its own: a foreign format has no place for a task's module, and a
# source that arrives while decoding has no whole encoder output to keep.
_NEVER: Mapping[Feature, str] = {
    "export": "is a task's module, which the export format has no place for",
    "stream": "needs the whole source, which a stream does not have while decoding",
}


class ExtensionError(UsageError):
    """An operation was asked of a model whose extension cannot take part in it."""


class ExtensionState(Protocol):
    """What an extension keeps between decoding steps, for N hypotheses."""

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Follow the search: keep hypotheses ``rows`` [N'] and sentences ``sentences`` [B']."""
        ...


class ModelExtension(nn.Module):
    """A task's model-side part. Subclass it, give it parameters, override the hooks it
    needs; every hook's default adds nothing."""

    #: The operations (:data:`Feature`) this extension cannot take part in, each with
    #: the reason a user reads ("reads whole sources", ...). The engine adds its own for
    #: ``export`` and ``stream`` unless the extension says it streams (an empty reason).
    limits: ClassVar[Mapping[Feature, str]] = {}

    def encoder_input(self, src: Tensor) -> Tensor | None:
        """An addition to the source embeddings (scaled, positions added), or None.
        src [B, S] -> [B, S, D]"""
        return None

    def source_context(self, src: Tensor, memory: Tensor) -> Any:
        """What the target-side hooks need of each source, computed once after encoding
        (None when nothing).  src [B, S], memory [B, S, D] -> any, per sentence"""
        return None

    def decoder_input(self, tokens: Tensor, context: Any) -> Tensor | None:
        """An addition to the decoder inputs of whole (shifted) targets, or None.
        tokens [N, T] -> [N, T, D]"""
        return None

    def start(self, context: Any, rows: int) -> ExtensionState | None:
        """The state of ``rows`` hypotheses (K per sentence of ``context``) before any
        target token, or None when the extension keeps none."""
        return None

    def step(self, tokens: Tensor, state: ExtensionState | None) -> Tensor | None:
        """The additions for the next tokens of each hypothesis, advancing ``state``.
        tokens [N, T] -> [N, T, D]"""
        return None

    def limit(self, feature: Feature) -> str | None:
        """Why this extension cannot take part in ``feature``, or None when it can."""
        if feature in self.limits:
            return self.limits[feature] or None
        return _NEVER.get(feature)


def check_supported(extensions: Iterable[tuple[str, ModelExtension]], feature: Feature) -> None:
    """Raise :class:`ExtensionError` naming the first extension that cannot take part in ``feature``."""
    for name, extension in extensions:
        reason = extension.limit(feature)
        if reason:
            raise ExtensionError(f"{_ASKED[feature]} is not possible with this model: its task's model "
                                 f"extension '{name}' ({type(extension).__name__}) {reason}")
