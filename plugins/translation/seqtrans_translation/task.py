"""The translation task: parallel text in, shared subwords, sacreBLEU out."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from seqtrans.plugin import (
    ConfigError,
    DataDigest,
    DataError,
    Example,
    Skipped,
    TaskClass,
    TrainingFiles,
    Vocabularies,
    cache_dir,
    check_split,
    sha256_file,
)
from seqtrans_translation import datasets, metrics
from seqtrans_translation.config import TranslationConfig
from seqtrans_translation.hf.codec import HFCodec, has_hf_files
from seqtrans_translation.presets import DEFAULTS, PRESETS
from seqtrans_translation.pretrained import PretrainedCodec, has_pretrained_files
from seqtrans_translation.readers import TextFile, join_examples, read_parallel, read_tsv
from seqtrans_translation.subwords import TEXT_FORM, Subwords, SubwordSettings, build, one_line


@dataclass(frozen=True)
class TranslationCodec:
    """Text to pieces of the shared sentencepiece model and back."""

    subwords: Subwords
    vocabularies: Vocabularies = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "vocabularies", Vocabularies(self.subwords.vocab, self.subwords.vocab))

    def source_tokens(self, source: str) -> list[str]:
        return self.subwords.encode(source)  # in NFC (Subwords.encode), as in training

    def target_tokens(self, target: str) -> list[str]:
        return self.subwords.encode(target)

    def prediction(self, tokens: list[str], source: str) -> str:
        return one_line(self.subwords.decode(tokens))

    def source_words(self, tokens: list[str]) -> list[int]:
        return words_of_pieces(tokens)

    def target_words(self, tokens: list[str]) -> list[int]:
        return words_of_pieces(tokens)


def words_of_pieces(pieces: list[str]) -> list[int]:
    """The word of each piece: sentencepiece marks a word's first piece with U+2581 (a
    first piece without it still opens word 0)."""
    out: list[int] = []
    word = -1
    for piece in pieces:
        if piece.startswith("\u2581") or word < 0:
            word += 1
        out.append(word)
    return out


# options that do not change the training pairs or the vocabulary
_NOT_TRAINING = frozenset({"test_set", "dev_src", "dev_tgt", "dev_tsv", "test_src", "test_tgt", "test_tsv",
                           "bleu_tokenize", "cache_dir", "mirror"})


def _file_digest(path: Path) -> str:
    try:
        return sha256_file(path)
    except FileNotFoundError:
        raise DataError(path, None, "no such file") from None
    except OSError as exc:
        raise DataError(path, None, f"cannot read: {exc.strerror}") from None


class TranslationTask:
    """Sentence-level translation between two languages with one shared subword vocabulary.

    Sources and targets are raw sentences (strings); the model sees sentencepiece
    pieces; predictions are detokenized text, scored with sacreBLEU against the raw
    references.
    """

    name = "translation"
    Config = TranslationConfig
    metric = "bleu"
    defaults: ClassVar[dict[str, Any]] = DEFAULTS
    presets: ClassVar[dict[str, dict[str, Any]]] = PRESETS

    def __init__(self, config: TranslationConfig) -> None:
        self.config = config

    # -------------------------------------------------------------- data

    def read(self, split: str) -> Iterator[Example[str, str] | Skipped]:
        """The examples of a split, in file order. Training pairs with an empty side, or
        beyond the length limits, are left out (as :class:`Skipped`); dev and test
        examples are all kept."""
        check_split(split)
        examples = self._examples(split)
        if split == "train":
            return self._training(examples)
        return examples

    def _examples(self, split: str) -> Iterator[Example[str, str]]:
        c = self.config
        local = c.local(split)
        if isinstance(local, tuple):
            return join_examples(read_parallel(TextFile.of(local[0]), TextFile.of(local[1])), c.join_lines)
        if isinstance(local, str):
            return join_examples(read_tsv(local), c.join_lines)
        if c.dataset == "none":
            raise ConfigError(f"data.{split}_src", f"data.dataset is 'none' and no local {split} files "
                              f"are given (data.{split}_src and data.{split}_tgt, or data.{split}_tsv)")
        dataset = datasets.get(c.dataset)
        corpora = {"train": dataset.train, "dev": dataset.dev,
                   "test": dataset.tests[c.test_set or dataset.default_test]}[split]
        where = datasets.Where(cache=c.cache_dir, mirror=c.mirror)
        pair = (c.source_lang, c.target_lang)
        files = [datasets.corpus_files(dataset, corpus, pair, where) for corpus in corpora]
        # documents (data.join_lines) never span two files, so never two splits
        return itertools.chain.from_iterable(join_examples(read_parallel(src, tgt), c.join_lines)
                                             for src, tgt in files)

    def _training(self, examples: Iterator[Example[str, str]]) -> Iterator[Example[str, str] | Skipped]:
        c = self.config
        for ex in itertools.islice(examples, c.max_train_examples or None):
            if not ex.source.strip() or not ex.target.strip():
                yield Skipped(ex.origin, "empty source or target")
                continue
            if c.max_train_words or c.max_train_ratio:
                n_src, n_tgt = len(ex.source.split()), len(ex.target.split())
                if c.max_train_words and max(n_src, n_tgt) > c.max_train_words:
                    yield Skipped(ex.origin, f"more than data.max_train_words={c.max_train_words} words")
                    continue
                if c.max_train_ratio and max(n_src, n_tgt) > c.max_train_ratio * min(n_src, n_tgt):
                    yield Skipped(ex.origin, f"length ratio above data.max_train_ratio={c.max_train_ratio:g}")
                    continue
            yield ex

    # -------------------------------------------------------------- subwords

    def build_vocabulary(self, directory: Path, train: Iterable[Example[str, str]]) -> TranslationCodec:
        """One sentencepiece model for both languages, trained on the training pairs
        (or reused from the cache) and stored in ``directory``."""
        c = self.config
        settings = SubwordSettings(model_type=c.subword_model, vocab_size=c.vocab_size,
                                   character_coverage=c.character_coverage,
                                   normalization=c.normalization, sample_sentences=c.subword_sample)
        texts = (text for ex in train for text in (ex.source, ex.target))
        subwords = build(texts, settings, cache_dir(c.cache_dir or None),
                         origin=self.source_of("train"))
        subwords.save(directory)
        return TranslationCodec(subwords)

    def load_vocabulary(self, directory: Path) -> TranslationCodec | PretrainedCodec | HFCodec:
        """The sentencepiece model stored in ``directory``, a Marian model's source and
        target models with their joint vocabulary (:mod:`seqtrans_translation.pretrained`),
        or an imported Hugging Face model's tokenizer (:mod:`seqtrans_translation.hf.codec`)."""
        if has_hf_files(directory):
            return HFCodec.load(directory)
        if has_pretrained_files(directory):
            return PretrainedCodec.load(directory)
        return TranslationCodec(Subwords.load(directory))

    def source_of(self, split: str) -> str:
        """Where the pairs of a split are read from, as messages name it."""
        local = self.config.local(split)
        if isinstance(local, tuple):
            return f"{local[0]} (with {local[1]})"
        return local or f"{self.config.dataset} ({split} corpora)"

    def train_digest(self) -> str:
        """sha256 of the training files (a named dataset's published digests; local files
        read in full) and of every option that shapes the training pairs or the vocabulary
        (:class:`~seqtrans.plugin.DataDigest`)."""
        c = self.config
        options = {k: v for k, v in dataclasses.asdict(c).items() if k not in _NOT_TRAINING}
        options["text_form"] = TEXT_FORM  # data prepared before texts were normalized is encoded anew
        digest = hashlib.sha256(json.dumps(options, sort_keys=True).encode())
        local = c.local("train")
        if local is not None:
            for path in (local,) if isinstance(local, str) else local:
                digest.update(_file_digest(Path(path)).encode())
        else:
            dataset = datasets.get(c.dataset)
            for corpus in dataset.train:
                for lang in (c.source_lang, c.target_lang):
                    side = corpus[lang]
                    digest.update(f"{side.remote.sha256}:{side.member}:{lang}\n".encode())
        return digest.hexdigest()

    def parse_source(self, line: str) -> str:
        return line

    def format_source(self, source: str) -> str:
        return source

    def format_target(self, target: str) -> str:
        return target

    def training_files(self, source: Path, target: Path) -> dict[str, str]:
        """Train on two line-aligned files (a distilled corpus, ``seqtrans distill``) instead of
        the dataset's or the configured training files; dev and test stay as configured."""
        return {"train_src": str(source), "train_tgt": str(target), "train_tsv": ""}

    def parse_target(self, line: str) -> str:
        return line

    def format(self, prediction: str) -> str:
        # a model may emit the bytes of a line break; the output stays one line per input
        return prediction.replace("\r", " ").replace("\n", " ")

    # -------------------------------------------------------------- metrics

    def score(self, predictions: Sequence[str],
              examples: Sequence[Example[str, str]]) -> dict[str, float | str]:
        return metrics.score(predictions, [ex.target for ex in examples], tokenize=self.config.bleu_tokenize)


# mypy checks the task against the contract here
_contract: TaskClass[str, str, str] = TranslationTask
_digest: type[DataDigest] = TranslationTask
_files: type[TrainingFiles] = TranslationTask
