"""The codec of an imported Hugging Face model: its own tokenizer cuts text into its
ids, which :mod:`.vocabulary` names as seqtrans symbols, and the family's layout adds
the tokens around them (a language code before a source or a target, BART's ``<s>``).

The tokenizer is read from ``tokenizer.json`` with Hugging Face's ``tokenizers``
library (the ``hf`` extra), which runs the file's whole pipeline (normaliser,
pre-tokeniser, model, decoder) as transformers does; nothing of a tokenizer is written
here. Two other kinds (:class:`TextTokenizer`) serve directories without that file: a
sentencepiece model (``spiece.model``, older T5 directories), read with
``sentencepiece``, and ByT5's bytes, which have no model at all (:class:`ByteTokenizer`,
the mapping ByT5 defines). A run directory keeps the tokenizer's file (none for bytes),
``hf.json`` (the kind, the ids, the layout and the languages) and ``vocab.txt`` in its
``vocab/``.

Languages are settings: a multilingual model's codec is bound to a source and a
target language (:meth:`HFCodec.with_languages`, from ``decode.source_lang`` and
``decode.target_lang``); the target language's code is the output's first token,
forced (:meth:`HFCodec.target_prefix`), and left out of the prediction.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from seqtrans.plugin import ConfigError, DataError, Vocab, Vocabularies
from seqtrans_translation.hf.vocabulary import IdMap
from seqtrans_translation.subwords import one_line

TOKENIZER = "tokenizer.json"
SENTENCEPIECE = "spiece.model"
LAYOUT = "hf.json"
VOCAB_FILE = "vocab.txt"
#: The kinds of tokenizer, and the file each keeps in a run's ``vocab/``.
TOKENIZER_FILES = {"tokenizers": TOKENIZER, "sentencepiece": SENTENCEPIECE, "bytes": None}
TOKENIZER_CONFIG = "tokenizer_config.json"
#: The model directory's own settings, kept as they were for ``export --to hf``, each
#: under ``hf-NAME`` in the run's ``vocab/`` (``added_tokens.json``: an older T5
#: tokenizer's sentinels).
ORIGINALS = ("config.json", "generation_config.json", TOKENIZER_CONFIG, "added_tokens.json")
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


class TextTokenizer(Protocol):
    """Text to a model's ids and back, whatever reads the text."""

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``, without the special tokens a template would add."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens left out."""
        ...

    def token_to_id(self, token: str) -> int | None: ...

    def tokens(self) -> dict[int, str]:
        """Each id's token string, where it has one (a byte has none)."""
        ...


class LibraryTokenizer:
    """A ``tokenizer.json``, run by Hugging Face's ``tokenizers``."""

    def __init__(self, data: bytes, origin: Path) -> None:
        self.tokenizer = load_tokenizer(data, origin)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def token_to_id(self, token: str) -> int | None:
        found = self.tokenizer.token_to_id(token)
        return None if found is None else int(found)

    def tokens(self) -> dict[int, str]:
        return {i: t for t, i in self.tokenizer.get_vocab(with_added_tokens=True).items()}


class SentencePieceTokenizer:
    """A sentencepiece model, read with ``sentencepiece``, and the tokens a model adds
    after its pieces (``added``, T5's sentinels), which are special: never cut from text,
    left out of decoded text."""

    def __init__(self, data: bytes, added: Mapping[str, int], origin: Path) -> None:
        import sentencepiece as spm

        self.model = spm.SentencePieceProcessor()
        try:
            self.model.LoadFromSerializedProto(data)
        except Exception as exc:  # noqa: BLE001 - the library raises RuntimeError or OSError
            raise DataError(origin, None, f"not a sentencepiece model: {str(exc)[:200]}") from None
        self.added = dict(added)
        self.size = self.model.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return list(self.model.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        special = {self.model.pad_id(), self.model.eos_id(), self.model.unk_id(), self.model.bos_id()}
        return str(self.model.decode([i for i in ids if i < self.size and i not in special]))

    def token_to_id(self, token: str) -> int | None:
        if token in self.added:
            return self.added[token]
        found = self.model.piece_to_id(token)
        return found if found != self.model.unk_id() or token == self.model.id_to_piece(found) else None

    def tokens(self) -> dict[int, str]:
        out = {i: self.model.id_to_piece(i) for i in range(self.size)}
        out.update({i: t for t, i in self.added.items()})
        return out


class ByteTokenizer:
    """ByT5's tokenizer, which has no model: byte b of a text's UTF-8 is id b + 3 after
    ``<pad>`` 0, ``</s>`` 1 and ``<unk>`` 2, and the tokens ``added`` after the 256 bytes
    (its sentinels) are special. Decoding drops every special token and the bytes that do
    not form UTF-8, as ``ByT5Tokenizer.decode`` does (``errors="ignore"``)."""

    OFFSET = 3
    SPECIALS = {"<pad>": 0, "</s>": 1, "<unk>": 2}

    def __init__(self, added: Mapping[str, int]) -> None:
        self.added = {**self.SPECIALS, **added}

    def encode(self, text: str) -> list[int]:
        return [b + self.OFFSET for b in text.encode("utf-8")]

    def decode(self, ids: Sequence[int]) -> str:
        data = bytes(i - self.OFFSET for i in ids if self.OFFSET <= i < self.OFFSET + 256)
        return data.decode("utf-8", errors="ignore")

    def token_to_id(self, token: str) -> int | None:
        return self.added.get(token)

    def tokens(self) -> dict[int, str]:
        return {i: t for t, i in self.added.items()}  # bytes have no token string: <hf:ID> symbols


def make_tokenizer(kind: str, data: bytes, added: Mapping[str, int], origin: Path) -> TextTokenizer:
    """The tokenizer of ``kind`` (a key of :data:`TOKENIZER_FILES`) from its file's bytes."""
    if kind == "tokenizers":
        return LibraryTokenizer(data, origin)
    if kind == "sentencepiece":
        return SentencePieceTokenizer(data, added, origin)
    if kind == "bytes":
        return ByteTokenizer(added)
    raise DataError(origin, None, f"unknown tokenizer kind {kind!r}; known: {', '.join(TOKENIZER_FILES)}")


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
    """Text to a Hugging Face model's ids and back, as seqtrans symbols.

    ``tokenizer_json`` holds the bytes of the tokenizer's file: ``tokenizer.json``, or
    the sentencepiece model where ``tokenizer_kind`` is ``sentencepiece`` (nothing for
    ``bytes``); ``added`` the tokens that kind adds after its own (content -> id)."""

    tokenizer_json: bytes
    ids: IdMap
    layout: Layout
    originals: tuple[tuple[str, bytes], ...] = ()  # (name in ORIGINALS, its bytes)
    tokenizer_kind: str = "tokenizers"
    added: tuple[tuple[str, int], ...] = ()
    vocabularies: Vocabularies = field(init=False)
    _tokenizer: TextTokenizer = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "vocabularies", Vocabularies(self.ids.vocab, self.ids.vocab))
        origin = Path(TOKENIZER_FILES.get(self.tokenizer_kind) or LAYOUT)
        object.__setattr__(self, "_tokenizer", make_tokenizer(self.tokenizer_kind, self.tokenizer_json,
                                                              dict(self.added), origin))
        self._check_languages()

    def _check_languages(self) -> None:
        if self.layout.languages:
            for side, lang in (("source", self.layout.source_lang), ("target", self.layout.target_lang)):
                if lang is not None:
                    self._check_language(f"decode.{side}_lang", lang)

    def __getstate__(self) -> dict[str, Any]:  # the Rust tokenizer does not pickle: remade from its file
        return {"tokenizer_json": self.tokenizer_json, "ids": self.ids, "layout": self.layout,
                "originals": self.originals, "tokenizer_kind": self.tokenizer_kind, "added": self.added}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)
        self.__post_init__()

    @classmethod
    def load(cls, directory: Path) -> HFCodec:
        saved = json.loads((directory / LAYOUT).read_text(encoding="utf-8"))
        kind = saved.get("tokenizer", "tokenizers")
        if kind not in TOKENIZER_FILES:
            raise DataError(directory / LAYOUT, None, f"unknown tokenizer kind {kind!r}")
        tokenizer_file = TOKENIZER_FILES[kind]
        needed = [name for name in (tokenizer_file, LAYOUT, VOCAB_FILE) if name is not None]
        missing = [name for name in needed if not (directory / name).is_file()]
        if missing:
            raise DataError(directory / missing[0], None,
                            f"missing: an imported model's vocabulary needs {', '.join(needed)}")
        layout = Layout(tuple(saved["source_prefix"]), tuple(saved["target_prefix"]),
                        tuple(saved["languages"]), saved["source_lang"], saved["target_lang"],
                        bool(saved.get("clean_up_spaces")))
        vocab = Vocab.load(directory / VOCAB_FILE)
        originals = tuple((name, (directory / f"hf-{name}").read_bytes()) for name in ORIGINALS
                          if (directory / f"hf-{name}").is_file())
        ids = IdMap(vocab, tuple(saved["hf_ids"]))
        data = (directory / tokenizer_file).read_bytes() if tokenizer_file is not None else b""
        added = tuple((str(t), int(i)) for t, i in saved.get("added_tokens", {}).items())
        return cls(data, ids, layout, originals, kind, added)

    def files(self) -> dict[str, bytes]:
        """The vocabulary files by name, as a run directory's ``vocab/`` holds them."""
        layout = {**self.layout.to_json(), "hf_ids": list(self.ids.hf_ids), "tokenizer": self.tokenizer_kind,
                  "added_tokens": dict(self.added)}
        tokenizer_file = TOKENIZER_FILES[self.tokenizer_kind]
        return {**({tokenizer_file: self.tokenizer_json} if tokenizer_file is not None else {}),
                LAYOUT: json.dumps(layout, ensure_ascii=False, indent=1).encode("utf-8"),
                VOCAB_FILE: "".join(s + "\n" for s in self.ids.vocab.symbols).encode("utf-8"),
                **{f"hf-{name}": data for name, data in self.originals}}

    # languages (seqtrans.plugin.Multilingual)

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
        for name in ("tokenizer_json", "ids", "originals", "tokenizer_kind", "added", "vocabularies",
                     "_tokenizer"):
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
            if hf_id is None:
                raise DataError(Path(LAYOUT), None, f"the tokenizer has no token {token!r}")
            out.append(self.ids.symbols_of([hf_id])[0])
        return out

    # the Codec protocol

    def _pieces(self, text: str) -> list[str]:
        return self.ids.symbols_of(self._tokenizer.encode(text))

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
        text = self._tokenizer.decode(self.ids.ids_of(tokens))
        if self.layout.clean_up_spaces:
            for before, after in _CLEAN_UP:
                text = text.replace(before, after)
        return one_line(text)
