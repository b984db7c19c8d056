"""One sentencepiece model shared by source and target (BPE, or unigram).

Detokenization is exact: the model is trained with the identity normalization by
default and without collapsing white space, and with byte fallback, so any text,
characters never seen in training included, decodes back to itself. Characters
that Python counts as white space other than the plain space (tabs, no-break spaces)
are kept out of the learned pieces, so that every piece is a valid vocabulary token;
they are encoded as bytes.

The training text is a uniform random sample of the training sentences, drawn from
the stream in one pass (``data.subword_sample`` sentences; all of them, in order, when
there are fewer). Trained models are cached under ``CACHE/sentencepiece/`` by the
sha256 of that sample and the settings: a second run on the same data reuses the model.

Every text is put in Unicode normalization form NFC before it is encoded, and before a
model is trained on it: ``café`` typed as U+00E9 and as ``e`` + U+0301 are one input.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import math
import os
import random
import sys
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

import sentencepiece as spm

from seqtrans.plugin import SPECIALS, DataError, Vocab, write_bytes

log = logging.getLogger(__name__)

MODEL_FILE = "sentencepiece.model"
UNK = "<unk>"
#: The Unicode normalization form of every text encoded or trained on; prepared data
#: encoded under another form is not reused (the task's data digest names it).
TEXT_FORM: Final = "NFC"


def normalized(text: str) -> str:
    """``text`` in ``TEXT_FORM``: one spelling of each character, whichever way it was typed."""
    return unicodedata.normalize(TEXT_FORM, text)

# the characters str.splitlines() breaks at, and the tab
_LINE_BREAKS = str.maketrans(dict.fromkeys("\t\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029", " "))


def one_line(text: str) -> str:
    """``text`` with a space for each line break or tab: byte pieces can spell them, and an
    output must stay on its own line."""
    return text.translate(_LINE_BREAKS)


@functools.cache
def _to_space() -> dict[int, int]:
    """A translation table: every character str.isspace() accepts -> the plain space."""
    other = [c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace() and c != " "]
    return {ord(c): ord(" ") for c in other}


@dataclass(frozen=True)
class SubwordSettings:
    model_type: str = "bpe"
    vocab_size: int = 8000
    character_coverage: float = 1.0
    normalization: str = "identity"
    sample_sentences: int = 2_000_000  # sentences sampled to train on; 0 takes all
    seed: int = 1


class Subwords:
    """A loaded sentencepiece model: text to pieces and back."""

    def __init__(self, model: bytes, *, origin: str = "<memory>") -> None:
        self.model = model
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(model)
        except (RuntimeError, OSError) as exc:
            raise DataError(origin, None, f"not a sentencepiece model: {exc}") from None
        pieces = [self._sp.id_to_piece(i) for i in range(self._sp.get_piece_size())]
        bad = [p for p in pieces if not p or any(c.isspace() for c in p)]
        if bad:
            raise DataError(origin, None, f"sentencepiece pieces {bad[:3]!r} are empty or hold white space")
        self.vocab = Vocab(p for p in pieces if p not in SPECIALS)

    @classmethod
    def load(cls, directory: Path) -> Subwords:
        path = directory / MODEL_FILE
        try:
            return cls(path.read_bytes(), origin=str(path))
        except FileNotFoundError:
            raise DataError(path, None, "no sentencepiece model (was the vocabulary built?)") from None

    def save(self, directory: Path) -> None:
        (directory / MODEL_FILE).write_bytes(self.model)

    def encode(self, text: str) -> list[str]:
        return list(self._sp.encode(normalized(text), out_type=str))

    def decode(self, pieces: Sequence[str]) -> str:
        return str(self._sp.decode_pieces([p for p in pieces if p != UNK]))


def sample(texts: Iterable[str], size: int, seed: int) -> list[str]:
    """A uniform random sample of ``size`` texts from a stream read once (all of them, in
    order, when there are no more): reservoir sampling with geometric skips (Li 1994,
    Algorithm L), so that a long stream costs few random draws and ``size`` strings of memory."""
    rng = random.Random(seed)
    out: list[str] = []
    stream = iter(texts)
    for text in stream:
        out.append(text)
        if size and len(out) == size:
            break
    if not size or len(out) < size:
        return out
    w = math.exp(math.log(rng.random()) / size)
    skip = int(math.log(rng.random()) / math.log(1 - w)) if w < 1 else 0
    for text in stream:
        if skip:
            skip -= 1
            continue
        out[rng.randrange(size)] = text
        w *= math.exp(math.log(rng.random()) / size)
        skip = int(math.log(rng.random()) / math.log(1 - w)) if w < 1 else 0
    return out


def fingerprint(texts: Sequence[str], settings: SubwordSettings) -> str:
    """sha256 of the training text and the settings: the cache key of a model."""
    digest = hashlib.sha256(json.dumps(asdict(settings), sort_keys=True).encode())
    for text in texts:
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def build(texts: Iterable[str], settings: SubwordSettings, cache: Path, *,
          origin: str | None = None) -> Subwords:
    """The model for ``texts`` (a stream, read once and sampled to
    ``settings.sample_sentences``) and ``settings``: from the cache, or trained and cached.
    ``origin`` names where the texts come from in errors."""
    chosen = sample(map(normalized, texts), settings.sample_sentences, settings.seed)
    key = fingerprint(chosen, settings)
    path = cache / "sentencepiece" / f"{key}.model"
    if path.is_file():
        log.info("sentencepiece: reusing %s", path)
        return Subwords(path.read_bytes(), origin=str(path))
    model = train(chosen, settings, origin=origin)
    write_bytes(path, model)
    log.info("sentencepiece: trained %s on %d sentences, cached as %s", settings.model_type,
             len(chosen), path)
    return Subwords(model, origin=str(path))


def train(texts: Sequence[str], settings: SubwordSettings, *, origin: str | None = None) -> bytes:
    """Train a model on ``texts`` (already sampled) and return it serialized."""
    if not any(t.strip() for t in texts):
        raise DataError(origin, None, "holds no training text to learn subwords from")
    table = _to_space()
    # a generator, not a list: the trainer keeps its own copy of every sentence
    sample = (t.translate(table) for t in texts if t.strip())
    buffer = io.BytesIO()
    spm.set_random_generator_seed(settings.seed)
    spm.SentencePieceTrainer.train(
        sentence_iterator=sample, model_writer=buffer,
        model_type=settings.model_type, vocab_size=settings.vocab_size,
        character_coverage=settings.character_coverage,
        normalization_rule_name=settings.normalization, remove_extra_whitespaces=False,
        byte_fallback=True, unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1,
        hard_vocab_limit=False, input_sentence_size=0, num_threads=os.cpu_count() or 1,
        minloglevel=2,
    )
    return buffer.getvalue()
