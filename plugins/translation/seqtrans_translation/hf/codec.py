"""The codec of an imported Hugging Face model: its own tokenizer cuts text into its
ids, which :mod:`.vocabulary` names as seqtrans symbols, and the family's layout adds
the tokens around them (a language code before a source or a target, BART's ``<s>``).

The tokenizer is read from ``tokenizer.json`` with Hugging Face's ``tokenizers``
library (the ``hf`` extra), which runs the file's whole pipeline (normaliser,
pre-tokeniser, model, decoder) as transformers does; nothing of a tokenizer is written
here. A run directory keeps ``tokenizer.json``, ``hf.json`` (the ids, the layout and
the languages) and ``vocab.txt`` in its ``vocab/``.

Languages are settings: a multilingual model's codec is bound to a source and a
target language (:meth:`HFCodec.with_languages`, from ``decode.source_lang`` and
``decode.target_lang``); the target language's code is the output's first token,
forced (:meth:`HFCodec.target_prefix`), and left out of the prediction.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from seqtrans.data.vocab import Vocab, Vocabularies
from seqtrans.errors import ConfigError, DataError
from seqtrans_translation.hf.vocabulary import IdMap
from seqtrans_translation.subwords import one_line

TOKENIZER = "tokenizer.json"
LAYOUT = "hf.json"
VOCAB_FILE = "vocab.txt"
FILES = (TOKENIZER, LAYOUT, VOCAB_FILE)
#: The model directory's own settings, kept as they were for ``export --to hf``, each
#: under ``hf-NAME`` in the run's ``vocab/``.
ORIGINALS = ("config.json", "generation_config.json", "tokenizer_config.json")
SOURCE_LANG, TARGET_LANG = "{source_lang}", "{target_lang}"


def has_hf_files(directory: Path) -> bool:
    return (directory / LAYOUT).is_file()


def load_tokenizer(data: bytes, origin: Path) -> Any:
    """A ``tokenizers.Tokenizer`` from the bytes of a ``tokenizer.json``."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise DataError(origin, None, "reading it needs Hugging Face's tokenizers library: "
                                      "pip install 'seqtrans-translation[hf]'") from None
    try:
        return Tokenizer.from_str(data.decode("utf-8"))
    except Exception as exc:  # noqa: BLE001 - the library raises a bare Exception for a bad file
        raise DataError(origin, None, f"not a tokenizers file: {str(exc)[:200]}") from None


# transformers' clean_up_tokenization: spaces before punctuation and in English contractions
_CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
             (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


@dataclass(frozen=True)
class Layout:
    """What a family adds around a text's tokens, and the languages it knows."""

    source_prefix: tuple[str, ...] = ()  # model tokens; SOURCE_LANG / TARGET_LANG stand for the codes
    target_prefix: tuple[str, ...] = ()
    languages: tuple[str, ...] = ()
    source_lang: str | None = None
    target_lang: str | None = None
    clean_up_spaces: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"source_prefix": list(self.source_prefix), "target_prefix": list(self.target_prefix),
                "languages": list(self.languages), "source_lang": self.source_lang,
                "target_lang": self.target_lang, "clean_up_spaces": self.clean_up_spaces}


@dataclass(frozen=True)
class HFCodec:
    """Text to a Hugging Face model's ids and back, as seqtrans symbols."""

    tokenizer_json: bytes
    ids: IdMap
    layout: Layout
    originals: tuple[tuple[str, bytes], ...] = ()  # (name in ORIGINALS, its bytes)
    vocabularies: Vocabularies = field(init=False)
    _tokenizer: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "vocabularies", Vocabularies(self.ids.vocab, self.ids.vocab))
        object.__setattr__(self, "_tokenizer", load_tokenizer(self.tokenizer_json, Path(TOKENIZER)))
        self._check_languages()

    def _check_languages(self) -> None:
        if self.layout.languages:
            for side, lang in (("source", self.layout.source_lang), ("target", self.layout.target_lang)):
                if lang is not None:
                    self._check_language(f"decode.{side}_lang", lang)

    def __getstate__(self) -> dict[str, Any]:  # the Rust tokenizer does not pickle: remade from its file
        return {"tokenizer_json": self.tokenizer_json, "ids": self.ids, "layout": self.layout,
                "originals": self.originals}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)
        self.__post_init__()

    @classmethod
    def load(cls, directory: Path) -> HFCodec:
        missing = [name for name in FILES if not (directory / name).is_file()]
        if missing:
            raise DataError(directory / missing[0], None,
                            f"missing: an imported model's vocabulary needs {', '.join(FILES)}")
        saved = json.loads((directory / LAYOUT).read_text(encoding="utf-8"))
        layout = Layout(tuple(saved["source_prefix"]), tuple(saved["target_prefix"]),
                        tuple(saved["languages"]), saved["source_lang"], saved["target_lang"],
                        bool(saved.get("clean_up_spaces")))
        vocab = Vocab.load(directory / VOCAB_FILE)
        originals = tuple((name, (directory / f"hf-{name}").read_bytes()) for name in ORIGINALS
                          if (directory / f"hf-{name}").is_file())
        ids = IdMap(vocab, tuple(saved["hf_ids"]))
        return cls((directory / TOKENIZER).read_bytes(), ids, layout, originals)

    def files(self) -> dict[str, bytes]:
        """The vocabulary files by name, as a run directory's ``vocab/`` holds them."""
        layout = {**self.layout.to_json(), "hf_ids": list(self.ids.hf_ids)}
        return {TOKENIZER: self.tokenizer_json,
                LAYOUT: json.dumps(layout, ensure_ascii=False, indent=1).encode("utf-8"),
                VOCAB_FILE: "".join(s + "\n" for s in self.ids.vocab.symbols).encode("utf-8"),
                **{f"hf-{name}": data for name, data in self.originals}}

    # languages (seqtrans.tasks.Multilingual)

    @property
    def languages(self) -> Sequence[str]:
        return self.layout.languages

    def with_languages(self, source: str | None, target: str | None) -> HFCodec:
        """This codec with its source and target languages set (None keeps the one it has)."""
        if not self.layout.languages:
            given = [f"decode.{side}_lang" for side, lang in (("source", source), ("target", target)) if lang]
            if given:
                raise ConfigError(given[0], "this model has no language codes; leave it unset")
            return self
        layout = replace(self.layout, source_lang=source or self.layout.source_lang,
                         target_lang=target or self.layout.target_lang)
        bound = object.__new__(HFCodec)  # the parsed tokenizer is shared, not parsed again
        for name in ("tokenizer_json", "ids", "originals", "vocabularies", "_tokenizer"):
            object.__setattr__(bound, name, getattr(self, name))
        object.__setattr__(bound, "layout", layout)
        bound._check_languages()
        return bound

    def _check_language(self, key: str, lang: str) -> None:
        if lang not in self.layout.languages:
            raise ConfigError(key, f"unknown language code {lang!r}; this model's codes: "
                                   f"{', '.join(self.layout.languages)}")

    def _tokens(self, prefix: tuple[str, ...]) -> list[str]:
        out = []
        for token in prefix:
            if token in (SOURCE_LANG, TARGET_LANG):
                key = "decode.source_lang" if token == SOURCE_LANG else "decode.target_lang"
                lang = self.layout.source_lang if token == SOURCE_LANG else self.layout.target_lang
                if lang is None:
                    codes = ", ".join(self.layout.languages[:8])
                    raise ConfigError(key, f"this model translates between several languages: set {key} "
                                           f"to one of its codes ({codes}, ...)")
                token = lang
            hf_id = self._tokenizer.token_to_id(token)
            out.append(self.ids.symbols_of([hf_id])[0])
        return out

    # the Codec protocol

    def _pieces(self, text: str) -> list[str]:
        return self.ids.symbols_of(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def source_tokens(self, source: str) -> list[str]:
        return self._tokens(self.layout.source_prefix) + self._pieces(source)

    def target_tokens(self, target: str) -> list[str]:
        return self.target_prefix() + self._pieces(target)

    def target_prefix(self) -> list[str]:
        """The tokens every output starts with, forced (a target language's code)."""
        return self._tokens(self.layout.target_prefix)

    def prediction(self, tokens: list[str], source: str) -> str:
        prefix = self.target_prefix()
        if tokens[: len(prefix)] == prefix:
            tokens = tokens[len(prefix):]
        text = self._tokenizer.decode(self.ids.ids_of(tokens), skip_special_tokens=True)
        if self.layout.clean_up_spaces:
            for before, after in _CLEAN_UP:
                text = text.replace(before, after)
        return one_line(text)
