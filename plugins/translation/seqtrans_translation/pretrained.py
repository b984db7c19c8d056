"""The vocabulary of a pretrained model: separate source and target sentencepiece models
that only cut text into pieces, and one joint vocabulary file that gives the pieces
their ids (the layout of OPUS-MT and other Marian models).

A run directory holding such a model has ``source.model``, ``target.model`` and
``vocab.txt`` (one symbol a line, the four special symbols first) in its ``vocab/``;
:meth:`~seqtrans_translation.task.TranslationTask.load_vocabulary` reads these files
where they are, and the shared ``sentencepiece.model`` otherwise. A piece the vocabulary
does not hold becomes ``<unk>``. A source that starts with a target-language code such
as ``>>fr<<`` (multilingual models) keeps the code as one token when the vocabulary
has it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from seqtrans.plugin import DataError, Vocab, Vocabularies
from seqtrans_translation.subwords import Subwords, one_line

SOURCE_MODEL = "source.model"
TARGET_MODEL = "target.model"
VOCAB_FILE = "vocab.txt"
FILES = (SOURCE_MODEL, TARGET_MODEL, VOCAB_FILE)


def has_pretrained_files(directory: Path) -> bool:
    """Whether ``directory`` holds a pretrained model's vocabulary files (any of them)."""
    return any((directory / name).exists() for name in FILES)


def language_code(text: str) -> tuple[str | None, str]:
    """A leading ``>>xx<<`` code and the rest of the text; (None, text) without one."""
    if text.startswith(">>"):
        end = text.find("<<")
        if end != -1:
            return text[: end + 2], text[end + 2 :]
    return None, text


@dataclass(frozen=True)
class PretrainedCodec:
    """Text to pieces with the source and target sentencepiece models, ids from one
    joint vocabulary."""

    source: Subwords
    target: Subwords
    vocab: Vocab
    vocabularies: Vocabularies = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "vocabularies", Vocabularies(self.vocab, self.vocab))

    @classmethod
    def load(cls, directory: Path) -> PretrainedCodec:
        missing = [name for name in FILES if not (directory / name).is_file()]
        if missing:
            raise DataError(
                directory / missing[0],
                None,
                f"missing: a pretrained model's vocabulary needs {', '.join(FILES)}",
            )
        models = []
        for name in (SOURCE_MODEL, TARGET_MODEL):
            path = directory / name
            models.append(Subwords(path.read_bytes(), origin=str(path)))
        return cls(models[0], models[1], Vocab.load(directory / VOCAB_FILE))

    def files(self) -> dict[str, bytes]:
        """The vocabulary files by name, as a run directory's ``vocab/`` holds them."""
        return {
            SOURCE_MODEL: self.source.model,
            TARGET_MODEL: self.target.model,
            VOCAB_FILE: "".join(s + "\n" for s in self.vocab.symbols).encode("utf-8"),
        }

    def source_tokens(self, source: str) -> list[str]:
        code, text = language_code(source)
        pieces = self.source.encode(text)
        return pieces if code is None else [code, *pieces]

    def target_tokens(self, target: str) -> list[str]:
        return self.target.encode(target)

    def prediction(self, tokens: list[str], source: str) -> str:
        return one_line(self.target.decode(tokens))
