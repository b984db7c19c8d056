"""The translation task: parallel text in, shared subwords, sacreBLEU out."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

from seqtrans import download
from seqtrans.errors import ConfigError, UsageError
from seqtrans.tasks import SPLITS, Example
from seqtrans.vocab import Vocabularies
from seqtrans_translation import datasets, metrics
from seqtrans_translation.config import TranslationConfig
from seqtrans_translation.presets import DEFAULTS, PRESETS
from seqtrans_translation.readers import TextFile, read_parallel, read_tsv
from seqtrans_translation.subwords import Subwords, SubwordSettings, build

log = logging.getLogger(__name__)


class TranslationTask:
    """Sentence-level translation between two languages with one shared subword vocabulary.

    Sources and targets are raw sentences (strings); the model sees sentencepiece
    pieces; predictions are detokenized text, scored with sacreBLEU against the raw
    references.
    """

    name: ClassVar[str] = "translation"
    Config: ClassVar[type] = TranslationConfig
    metric: ClassVar[str] = "bleu"
    defaults: ClassVar[dict[str, Any]] = DEFAULTS
    presets: ClassVar[dict[str, dict[str, Any]]] = PRESETS

    def __init__(self, config: TranslationConfig) -> None:
        self.config = config
        self._subwords: Subwords | None = None

    # -------------------------------------------------------------- data

    def read(self, split: str) -> Iterator[Example]:
        """The examples of a split, in file order. Training pairs with an empty side are
        skipped (and counted in the log); dev and test examples are all kept."""
        if split not in SPLITS:
            raise UsageError(f"unknown split '{split}'; choose one of {', '.join(SPLITS)}")
        examples = self._examples(split)
        if split == "train":
            return self._training(examples)
        return examples

    def _examples(self, split: str) -> Iterator[Example]:
        c = self.config
        local = c.local(split)
        if isinstance(local, tuple):
            return read_parallel(TextFile.of(local[0]), TextFile.of(local[1]))
        if isinstance(local, str):
            return read_tsv(local)
        if c.dataset == "none":
            raise ConfigError(f"data.{split}_src", f"data.dataset is 'none' and no local {split} files "
                              f"are given (data.{split}_src and data.{split}_tgt, or data.{split}_tsv)")
        dataset = datasets.get(c.dataset)
        corpora = {"train": dataset.train, "dev": dataset.dev,
                   "test": dataset.tests[c.test_set or dataset.default_test]}[split]
        where = datasets.Where(cache=c.cache_dir, mirror=c.mirror)
        pair = (c.source_lang, c.target_lang)
        files = [datasets.corpus_files(dataset, corpus, pair, where) for corpus in corpora]
        return itertools.chain.from_iterable(read_parallel(src, tgt) for src, tgt in files)

    def _training(self, examples: Iterator[Example]) -> Iterator[Example]:
        c = self.config
        read = empty = cleaned = 0
        for ex in itertools.islice(examples, c.max_train_examples or None):
            read += 1
            if not ex.source.strip() or not ex.target.strip():
                empty += 1
                continue
            if c.max_train_words or c.max_train_ratio:
                n_src, n_tgt = len(ex.source.split()), len(ex.target.split())
                if (c.max_train_words and max(n_src, n_tgt) > c.max_train_words) or \
                        (c.max_train_ratio and max(n_src, n_tgt) > c.max_train_ratio * min(n_src, n_tgt)):
                    cleaned += 1
                    continue
            yield ex
        if empty:
            log.warning("skipped %d of %d training pairs with an empty source or target", empty, read)
        if cleaned:
            log.warning("skipped %d of %d training pairs longer than data.max_train_words=%d words or "
                        "with a length ratio above data.max_train_ratio=%g", cleaned, read,
                        c.max_train_words, c.max_train_ratio)

    # -------------------------------------------------------------- subwords

    def vocabulary(self, directory: Path, train: Iterable[Example] | None) -> Vocabularies:
        """One sentencepiece model for both languages, trained on the training pairs
        (or reused from the cache) and stored in ``directory``; loaded from there when
        ``train`` is None."""
        if train is None:
            subwords = Subwords.load(directory)
        else:
            c = self.config
            settings = SubwordSettings(model_type=c.subword_model, vocab_size=c.vocab_size,
                                       character_coverage=c.character_coverage,
                                       normalization=c.normalization, sample_sentences=c.subword_sample)
            texts = [text for ex in train for text in (ex.source, ex.target)]
            subwords = build(texts, settings, download.cache_dir(c.cache_dir or None))
            subwords.save(directory)
        self._subwords = subwords
        return Vocabularies(subwords.vocab, subwords.vocab)

    @property
    def subwords(self) -> Subwords:
        if self._subwords is None:
            raise RuntimeError("call vocabulary() before tokenizing")
        return self._subwords

    def source_tokens(self, source: str) -> list[str]:
        return self.subwords.encode(source)

    def target_tokens(self, target: str) -> list[str]:
        return self.subwords.encode(target)

    def prediction(self, tokens: list[str], source: str) -> str:
        return self.subwords.decode(tokens)

    def parse_source(self, line: str) -> str:
        return line

    def format(self, prediction: str) -> str:
        # a model may emit the bytes of a line break; the output stays one line per input
        return prediction.replace("\r", " ").replace("\n", " ")

    # -------------------------------------------------------------- metrics

    def score(self, predictions: Sequence[str], examples: Sequence[Example]) -> dict[str, float | str]:
        return metrics.score(predictions, [ex.target for ex in examples], tokenize=self.config.bleu_tokenize)

    def constraint(self, sources: Sequence[str], vocabularies: Vocabularies) -> None:
        return None
