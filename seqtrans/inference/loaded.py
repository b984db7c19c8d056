"""A trained model loaded for decoding (:class:`Loaded`), apart from how it is loaded
(:mod:`.loading`): the modules that decode with one (:mod:`.lexical`, :mod:`.session`,
:mod:`.simultaneous`, :mod:`.online`) import this, and loading imports them, without a
cycle."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from seqtrans.config import DecodeConfig, RunConfig
from seqtrans.data.encoding import prediction
from seqtrans.decoding.beam import Cancelled
from seqtrans.decoding.ensemble import Ensemble
from seqtrans.decoding.lexical import Phrases
from seqtrans.decoding.search import Hypothesis
from seqtrans.errors import UsageError
from seqtrans.inference.evaluation import decode_sources
from seqtrans.inference.inputs import check_sources, check_text, check_texts
from seqtrans.inference.phrases import Unreadable, banned_ids, target_ids
from seqtrans.inference.scoring import PairScore, score_texts
from seqtrans.model.transformer import Transformer
from seqtrans.shortlist.table import Shortlist
from seqtrans.tasks.protocol import Codec, Task, bind_languages


@dataclass
class Loaded:
    """A trained model with its task and codec, ready to decode; with ``others``, an
    ensemble of models of one vocabulary (:mod:`seqtrans.decoding.ensemble`) whose task, codec
    and decoding settings are the first's."""

    config: RunConfig
    task: Task[Any, Any, Any]
    codec: Codec[Any, Any, Any]
    model: Transformer
    device: torch.device
    others: list[Transformer] = field(default_factory=list)  # further members of an ensemble
    vocabulary_digest: str = ""  # sha256 of the vocabulary files the model was trained with
    shortlist: Shortlist | None = None  # the run's vocabulary shortlist, loaded with decode.shortlist
    assets: dict[str, bytes] = field(default_factory=dict)  # the vocabulary files (the first model's)

    @property
    def models(self) -> list[Transformer]:
        return [self.model, *self.others]

    @property
    def searcher(self) -> Transformer | Ensemble:
        """What decodes: the model, or the ensemble of all models."""
        return Ensemble(self.models) if self.others else self.model

    def codec_for(self, decode: DecodeConfig) -> Codec[Any, Any, Any]:
        """The codec bound to the languages ``decode`` names, where they are not the run's
        (a request's own, in a server); a :class:`~seqtrans.errors.ConfigError` names an
        unknown code."""
        ours = self.config.decode
        if (decode.source_lang, decode.target_lang) == (ours.source_lang, ours.target_lang):
            return self.codec
        return bind_languages(self.codec, source=decode.source_lang, target=decode.target_lang)

    def parse(self, texts: Sequence[str]) -> list[Any]:
        """Lines of text as the task reads them (``task.parse_source``), as ``seqtrans
        predict`` reads its input lines: the sources :meth:`decode` takes."""
        texts = check_texts(texts, argument="texts", instead="parse takes lines of text")
        return [self.task.parse_source(text) for text in texts]

    def predict(self, texts: Sequence[str], *, decode: DecodeConfig | None = None) -> list[str]:
        """The output of each line of text as ``seqtrans predict`` writes it (the best, or
        the first sample drawn; :meth:`decode` gives the n-best lists with their scores).
        Anything but a list of str is a :class:`~seqtrans.errors.UsageError`."""
        texts = check_texts(texts, argument="texts",
                            instead="predict takes lines of text; give parsed sources to decode(sources)")
        predictions, _ = self.decode([self.task.parse_source(text) for text in texts], decode=decode)
        return [self.task.format(p) for p in predictions]

    def target_ids(self, text: str) -> list[int]:
        """The target ids of a line of text read as the task reads a target (``parse_target``),
        as ``decode`` takes them for ``prefixes``, ``required`` and ``banned`` phrases; a
        :class:`~seqtrans.errors.UsageError` if the task cannot read it or the target
        vocabulary lacks one of its tokens."""
        check_text(text, argument="text")
        try:
            return target_ids(self.task, self.codec, text)
        except Unreadable as exc:
            raise UsageError(f"text {text[:40]!r}: {exc}") from None

    def score(self, sources: Sequence[str], targets: Sequence[str], *,
              progress: bool = False) -> list[PairScore]:
        """The log-probability of each target (a line of text) given its source (a line of
        text), as ``seqtrans score`` computes it for the same lines in two files
        (:func:`seqtrans.inference.scoring.score_texts`)."""
        return score_texts(self, sources, targets, progress=progress)

    def decode(self, sources: Sequence[Any], *, decode: DecodeConfig | None = None,
               progress: bool = False, positions: Sequence[int] | None = None,
               prefixes: Sequence[list[int]] | None = None, required: Sequence[Phrases] | None = None,
               banned: Sequence[Phrases] | None = None, cancelled: Cancelled | None = None,
               ) -> tuple[list[Any], list[list[Hypothesis]]]:
        """Predictions (task objects) and the n-best hypotheses (or samples) of parsed
        ``sources`` (what ``task.parse_source`` or :meth:`parse` returns; text goes to
        :meth:`predict`), in order, each hypothesis with its ``text``; ``positions`` seed
        the sampling streams, ``prefixes`` are forced target ids and ``required`` and
        ``banned`` phrases per source (target ids) that the outputs must and must not
        contain, besides the phrases of ``decode.banned``, and ``cancelled(i)`` whether
        source i's output is no longer wanted, asked between decoding steps (see
        :func:`decode_sources`). Text where the task's sources are parsed objects, or
        anything else that is not a source, is a :class:`~seqtrans.errors.UsageError`."""
        decode = decode or self.config.decode
        codec = self.codec_for(decode)
        sources = check_sources(self.task, codec, sources)
        common = banned_ids(self.task, codec, decode)
        if common:
            banned = [[*common, *own] for own in (banned or [[] for _ in sources])]
        predictions, hyps = decode_sources(
            self.searcher, codec, sources, decode, device=self.device, progress=progress,
            positions=positions, prefixes=prefixes, required=required, banned=banned, cancelled=cancelled,
            shortlist=self.shortlist)
        texts = [[replace(h, text=self.task.format(prediction(codec, h.tokens, source))) for h in nbest]
                 for nbest, source in zip(hyps, sources)]
        return predictions, texts
