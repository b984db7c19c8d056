"""The ``data`` section of a translation run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from seqtrans.plugin import ConfigError, option
from seqtrans_translation import datasets

SPLIT_FILES = ("train", "dev", "test")
BLEU_TOKENIZERS = ("13a", "intl", "none", "zh", "char", "ja-mecab", "ko-mecab", "flores101", "flores200")


@dataclass(frozen=True)
class TranslationConfig:
    """Data, subwords and scoring of a translation run."""

    dataset: str = option(
        "multi30k", "Named dataset, downloaded and verified on first use: 'multi30k' (Multi30k task 1) or "
        "'wmt14-en-de' (WMT 2014, the paper's); 'none' to use only local files.")
    source_lang: str = option("en", "Source language of the dataset (en or de).")
    target_lang: str = option("de", "Target language of the dataset (de or en).")
    test_set: str = option(
        "", "The dataset's test set; empty for its standard one (multi30k: test_2016_flickr, also "
        "test_2017_flickr, test_2017_mscoco, test_2018_flickr; wmt14-en-de: newstest2014).")
    train_src: str = option("", "Local training source file (plain or gzipped, a sentence a line); "
                                "replaces the dataset's training data together with train_tgt.")
    train_tgt: str = option("", "Local training target file, line-aligned with train_src.")
    train_tsv: str = option(
        "", "Local training pairs as 'source<TAB>target' lines (instead of train_src/tgt).")
    dev_src: str = option("", "Local development source file (with dev_tgt).")
    dev_tgt: str = option("", "Local development target file.")
    dev_tsv: str = option("", "Local development pairs, tab-separated.")
    test_src: str = option(
        "", "Local test source file (with test_tgt); its lines are all translated, in order.")
    test_tgt: str = option("", "Local test reference file.")
    test_tsv: str = option("", "Local test pairs, tab-separated.")
    join_lines: int = option(
        1, "Join this many consecutive lines of each corpus into one example, on both sides (with a "
        "space between them), to translate documents as one sequence: each split's documents come "
        "from its own files only, in file order, and a file's last document holds the lines that "
        "remain (fewer than N). 1 keeps one sentence an example.")
    max_train_examples: int = option(0, "Use only the first N training pairs; 0 uses all.")
    max_train_words: int = option(
        0, "Skip training pairs with more words (white-space separated) on a side; 0 keeps all.")
    max_train_ratio: float = option(
        0.0, "Skip training pairs whose longer side has more than this many times the words of the "
        "shorter; 0 keeps all.")
    subword_model: Literal["bpe", "unigram"] = option(
        "bpe", "sentencepiece model type of the shared source-target subword vocabulary.")
    vocab_size: int = option(
        8000, "Size of the shared sentencepiece vocabulary (the paper: about 37,000 for WMT 2014 en-de).")
    subword_sample: int = option(
        2_000_000, "Train sentencepiece on a seeded sample of this many sentences; 0 uses all.")
    character_coverage: float = option(1.0, "sentencepiece character_coverage (0.9995 for large alphabets).")
    normalization: Literal["identity", "nmt_nfkc"] = option(
        "identity", "sentencepiece normalization, after every text is put in NFC; 'identity' keeps "
        "detokenization exact (of the NFC text), 'nmt_nfkc' applies NFKC first (outputs are then "
        "NFKC-normalized).")
    bleu_tokenize: str = option("13a", "sacreBLEU's tokenizer for BLEU (13a is the WMT standard).")
    cache_dir: str = option(
        "", "Where downloads, subword models and the prepared data (under prepared/) are cached; empty "
        "uses $SEQTRANS_CACHE_DIR or ~/.cache/seqtrans.")
    mirror: str = option(
        "", "Fetch dataset files from this base URL (file:// or http(s)://, or a directory) by file "
        "name instead of their published URLs; empty uses $SEQTRANS_MIRROR, if set.")

    def __post_init__(self) -> None:
        for split in SPLIT_FILES:
            src, tgt, tsv = (getattr(self, f"{split}_{k}") for k in ("src", "tgt", "tsv"))
            if bool(src) != bool(tgt):
                missing = f"data.{split}_tgt" if src else f"data.{split}_src"
                raise ConfigError(missing, f"data.{split}_src and data.{split}_tgt go together")
            if tsv and src:
                raise ConfigError(f"data.{split}_tsv", f"give either data.{split}_tsv or "
                                  f"data.{split}_src/_tgt, not both")
        if self.source_lang == self.target_lang:
            raise ConfigError("data.target_lang", f"equals the source language '{self.source_lang}'")
        if self.dataset != "none":
            dataset = datasets.get(self.dataset)
            for key in ("source_lang", "target_lang"):
                if getattr(self, key) not in dataset.languages:
                    raise ConfigError(f"data.{key}", f"{self.dataset} has the languages "
                                      f"{' and '.join(dataset.languages)}, not '{getattr(self, key)}'")
            if self.test_set and self.test_set not in dataset.tests:
                raise ConfigError("data.test_set", f"{self.dataset} has the test sets "
                                  f"{', '.join(dataset.tests)}, not '{self.test_set}'")
        elif self.test_set:
            raise ConfigError("data.test_set", "names a dataset's test set, but data.dataset is 'none'")
        if self.vocab_size < 300:
            raise ConfigError("data.vocab_size", f"must be at least 300 (256 byte pieces and the "
                              f"characters), got {self.vocab_size}")
        if self.join_lines < 1:
            raise ConfigError("data.join_lines", f"must be at least 1, got {self.join_lines}")
        for key in ("max_train_examples", "subword_sample", "max_train_words", "max_train_ratio"):
            if getattr(self, key) < 0:
                raise ConfigError(f"data.{key}", f"must not be negative, got {getattr(self, key)}")
        if not 0.0 < self.character_coverage <= 1.0:
            raise ConfigError("data.character_coverage", f"must be in (0, 1], got {self.character_coverage}")
        if self.bleu_tokenize not in BLEU_TOKENIZERS:
            raise ConfigError("data.bleu_tokenize", f"must be one of {', '.join(BLEU_TOKENIZERS)}")

    def local(self, split: str) -> tuple[str, str] | str | None:
        """The local files configured for ``split``: (source, target), a TSV path, or None."""
        src, tgt, tsv = (getattr(self, f"{split}_{k}") for k in ("src", "tgt", "tsv"))
        if src:
            return src, tgt
        return tsv or None
