"""The ``parsing`` task: English constituency parsing as sequence transduction
(Vinyals et al. 2015; Vaswani et al. 2017, section 6.3).

Source: the words, encoded with a sentencepiece model trained on the training words.
Target: the tree's bracket sequence, top-down or in-order (:mod:`seqtrans_parsing.linearize`). Metric:
EVALB's bracketing F1 with COLLINS.prm (:mod:`seqtrans_parsing.evalb`).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from seqtrans.plugin import (
    SPECIALS,
    ConfigError,
    DataError,
    Example,
    ModelExtending,
    Skipped,
    TaskClass,
    Upgrading,
    Vocab,
    Vocabularies,
    check_split,
    option,
)
from seqtrans_parsing import treebank
from seqtrans_parsing.augment import substitute
from seqtrans_parsing.evalb import COLLINS, evalb
from seqtrans_parsing.linearize import PLACEHOLDER, Order, is_close, is_open, linearize, to_tree
from seqtrans_parsing.sampling import UnigramSampler
from seqtrans_parsing.subwords import WORD_START, train_sentencepiece
from seqtrans_parsing.trees import Tree, preprocess, read_trees
from seqtrans_parsing.walk import SourceWalk

if TYPE_CHECKING:
    from seqtrans.plugin import ModelConfig, ModelExtension
    from seqtrans_parsing.constraint import BracketConstraint
    from seqtrans_parsing.vectors import VectorSource, WordVectors

log = logging.getLogger(__name__)

__all__ = ["Parse", "ParsingCodec", "ParsingConfig", "ParsingTask", "Sentence"]

# The phrase labels of the Penn Treebank (Bies et al. 1995), always in the target
# vocabulary so that a label rare enough to miss the training data stays a label.
PTB_LABELS = ("ADJP", "ADVP", "CONJP", "FRAG", "INTJ", "LST", "NAC", "NP", "NX", "PP", "PRN", "PRT",
              "QP", "RRC", "S", "SBAR", "SBARQ", "SINV", "SQ", "UCP", "VP", "WHADJP", "WHADVP", "WHNP",
              "WHPP", "X", "TOP")

# The part-of-speech tags of the Penn Treebank (Santorini 1990), always in the target
# vocabulary of a model that predicts tags (data.preterminals=tags).
PTB_TAGS = ("#", "$", "''", ",", "-LRB-", "-RRB-", ".", ":", "CC", "CD", "DT", "EX", "FW", "IN", "JJ",
            "JJR", "JJS", "LS", "MD", "NN", "NNP", "NNPS", "NNS", "PDT", "POS", "PRP", "PRP$", "RB", "RBR",
            "RBS", "RP", "SYM", "TO", "UH", "VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "WDT", "WP", "WP$",
            "WRB", "``")

VECTORS_FILE = "vectors.json"  # which word vectors a run uses (data.word_vectors)

# Penn Treebank escapes of brackets in words, applied to `predict` input.
_ESCAPES = {"(": "-LRB-", ")": "-RRB-", "[": "-LSB-", "]": "-RSB-", "{": "-LCB-", "}": "-RCB-"}


@dataclass(frozen=True)
class Sentence:
    """A source: the words, and the gold part-of-speech tags when they are known."""

    words: tuple[str, ...]
    tags: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Parse:
    """A prediction: the tree over the sentence's words (gold tags where known, else the
    decoded preterminals), the repairs the decoded sequence needed (0: well formed) and the
    decoded preterminals, one per word while they last (the tags of a tagging model)."""

    tree: Tree
    repairs: int
    preterminals: tuple[str, ...] = ()

    @property
    def malformed(self) -> bool:
        return self.repairs > 0


@dataclass(frozen=True)
class ParsingConfig:
    """The ``data`` section of a parsing run."""

    corpus: str = option("treebank", "NLTK corpus read by name through nltk.corpus when no WSJ root or "
                         "files are given (fetched by NLTK's downloader when missing).")
    train_files: str = option("1-139", "File numbers of the NLTK corpus for training (wsj_0001-wsj_0139).")
    dev_files: str = option("140-169", "File numbers of the NLTK corpus for development.")
    test_files: str = option("170-199", "File numbers of the NLTK corpus for testing.")
    nltk_data: str = option("", "Directory of NLTK data, searched first and downloaded into; empty: "
                            "NLTK's own search path (NLTK_DATA honoured).")
    download: bool = option(True, "Fetch the NLTK corpus with nltk.download when it is missing.")
    wsj_root: str = option("", "Root of the WSJ .mrg layout (sections 00 .. 24 as directories); "
                           "when set, the sections below replace the NLTK corpus.")
    train_sections: str = option("02-21", "WSJ sections for training (the standard split).")
    dev_sections: str = option("22", "WSJ sections for development.")
    test_sections: str = option("23", "WSJ sections for testing.")
    train: str = option("", "Training trees: a file (.mrg or one tree per line), a directory or a glob; "
                        "overrides the corpus and WSJ settings for this split.")
    dev: str = option("", "Development trees (file, directory or glob); overrides for this split.")
    test: str = option("", "Test trees (file, directory or glob); overrides for this split.")
    malformed: Literal["error", "skip"] = option(
        "error", "A malformed tree is an error naming its file and line ('error'), or is skipped and "
        "counted ('skip').")
    vocab_size: int = option(2000, "Sentencepiece vocabulary of the source words (the paper: 16K for WSJ).")
    sentencepiece_model: Literal["unigram", "bpe"] = option("unigram", "Sentencepiece model type.")
    preterminals: Literal["placeholder", "tags"] = option(
        "placeholder", "What the target writes for each word: the placeholder XX (Vinyals et al. 2015), or "
        "its part-of-speech tag, which the model then also predicts (scoring still uses the gold tags).")
    linearization: Order = option(
        "top_down", "The order of the target's brackets: 'top_down', each opening before its constituent "
        "(Vinyals et al. 2015), or 'in_order', each opening after its constituent's first child (Liu and "
        "Zhang 2017; Fernández-González and Gómez-Rodríguez 2020).")
    substitute: float = option(
        0.0, "Subtree substitution (Shi et al. 2021): add this many new training trees per training tree "
        "(0.5: half as many), each a training tree with one phrase replaced by a phrase of the same label "
        "from the training trees; 0 adds none.")
    substitute_seed: int = option(1, "Seed of the trees data.substitute draws.")
    word_vectors: str = option(
        "", "Pretrained word vectors for the source words, fed to the encoder at each word's first piece "
        "through a learned projection (docs/tasks/parsing-model.md, 'Pretrained word vectors'): "
        "'glove-6b-50d' (GloVe 6B, 50 dimensions, from the package the plugin's 'vectors' extra installs) "
        "or a text file of GloVe or word2vec vectors; empty: none.")
    source_cursor: bool = option(
        False, "Add to each decoder input the (projected) encoder state of the first word its output has "
        "not yet placed (docs/tasks/parsing-model.md, 'The source cursor').")
    span_cursor: bool = option(
        False, "Add to each decoder input the (separately projected) encoder state of the word where the "
        "innermost constituent its output has opened and not closed starts; top-down targets only "
        "(docs/tasks/parsing-model.md, 'The source cursor'). Independent of data.source_cursor.")
    cache_dir: str = option(
        "", "Where the run's prepared data is kept (under prepared/); empty uses $SEQTRANS_CACHE_DIR or "
        "~/.cache/seqtrans. The NLTK corpus goes to data.nltk_data.")

    def __post_init__(self) -> None:
        if self.vocab_size < 8:
            raise ConfigError("data.vocab_size", f"must be at least 8, got {self.vocab_size}")
        if self.substitute < 0:
            raise ConfigError("data.substitute", f"must not be negative, got {self.substitute}")
        for key in ("train_files", "dev_files", "test_files", "train_sections", "dev_sections",
                    "test_sections"):
            treebank.parse_range(getattr(self, key), key=f"data.{key}")
        if self.span_cursor and self.linearization != "top_down":
            raise ConfigError("data.span_cursor", "in-order targets open a constituent after its first "
                              "child, so the next word is not where the constituent starts: the span cursor "
                              "needs data.linearization=top_down")


# The model for the treebank sample (about 3,000 training trees): small, with small
# batches for many updates, the source cursor, tags for preterminals (the tagging target
# is the extra supervision such a small treebank needs), segmentations of the words
# sampled anew every epoch (alpha 0.2) as the main regulariser, at 0.7 times the
# schedule's peak learning rate; see docs/tasks/parsing.md.
_SAMPLE: dict[str, Any] = {
    "model": {"encoder_layers": 4, "decoder_layers": 2, "d_model": 256, "d_ff": 1024, "heads": 4,
              "dropout": 0.1, "attention_dropout": 0.0},
    "train": {"max_tokens": 2048, "warmup": 800, "lr_scale": 0.7, "max_steps": 8000,
              "eval_every": 1000, "checkpoint_every": 200, "keep_checkpoints": 5, "average_last": 5,
              "valid_beam": 1, "log_every": 100, "label_smoothing": 0.1, "subword_sampling": 0.2},
    "data": {"vocab_size": 8000, "preterminals": "tags", "source_cursor": True},
}


@dataclass(frozen=True)
class ParsingCodec:
    """Words to sentencepiece pieces; trees to bracket sequences (in ``order``) and back.

    The preterminals are the target's symbols for words (the placeholder, or the tags).
    Besides the conversions it has the three optional abilities: the bracket constraint,
    sampled segmentations of the words, and the model's extensions (the cursors, whose
    walk has each preterminal consume one word, a word starting at its piece marked "▁";
    the word vectors).
    """

    pieces: Any  # sentencepiece.SentencePieceProcessor (it pickles)
    vocabularies: Vocabularies
    tags: bool  # the target writes part-of-speech tags for the words (data.preterminals=tags)
    unigram: bool = True  # a unigram model (else BPE), whose segmentations can be sampled
    order: Order = "top_down"  # the linearization (data.linearization)
    vectors: VectorSource | None = None  # pretrained word vectors (data.word_vectors)
    source_cursor: bool = False  # data.source_cursor
    span_cursor: bool = False  # data.span_cursor
    preterminals: frozenset[str] = field(init=False)
    sampler: UnigramSampler | None = field(init=False, compare=False)

    def __post_init__(self) -> None:
        target = self.vocabularies.target
        object.__setattr__(self, "preterminals", frozenset(
            s for s in target.symbols[len(SPECIALS):] if not is_open(s) and not is_close(s)))
        object.__setattr__(self, "sampler", UnigramSampler.of(self.pieces) if self.unigram else None)

    def source_tokens(self, source: Sentence) -> list[str]:
        # each word's first piece is marked "▁" (a piece of its own before an unseen
        # character), which is how the source walk counts words
        return list(self.pieces.encode(" ".join(source.words), out_type=str))

    def target_tokens(self, target: Tree) -> list[str]:
        return linearize(target, tags=self.tags, order=self.order)

    def prediction(self, tokens: list[str], source: Sentence) -> Parse:
        built = to_tree(tokens, source.words, source.tags, preterminals=self.preterminals, order=self.order)
        decoded = tuple(t for t in tokens if t in self.preterminals)[: len(source.words)]
        return Parse(built.tree, built.repairs, decoded)

    def constraint(self, sources: Sequence[Sentence]) -> BracketConstraint:
        from seqtrans_parsing.constraint import BracketConstraint

        return BracketConstraint([len(s.words) for s in sources], self.vocabularies.target,
                                 preterminals=self.preterminals, order=self.order)

    def sample_source_tokens(self, sources: Sequence[Sentence], alpha: float, seed: int) -> list[list[str]]:
        """Each source with a segmentation sampled from the unigram model's full lattice at
        smoothing ``alpha`` (Kudo 2018), the same in every process for the same ``seed``
        (:mod:`seqtrans_parsing.sampling`); one piece per word is still marked "▁" (the
        walk's count holds)."""
        if self.sampler is None:
            raise ConfigError("train.subword_sampling", "sampled segmentations need a unigram model "
                              "(data.sentencepiece_model=unigram)")
        rng = random.Random(seed)
        return [self.sampler.sample(s.words, alpha, rng) for s in sources]

    def source_vectors(self) -> WordVectors | None:
        """The word vectors at each word's first piece (data.word_vectors), or None."""
        if self.vectors is None:
            return None
        from seqtrans_parsing.vectors import WordVectors, load

        return WordVectors(load(self.vectors), self.vocabularies.source.symbols)

    def model_extensions(self, model: ModelConfig) -> dict[str, ModelExtension]:
        """The cursors and the word-vector input the settings ask for (:mod:`seqtrans_parsing.extensions`)."""
        from seqtrans_parsing.extensions import build

        return build(model, walk=self.source_walk(), source_cursor=self.source_cursor,
                     span_cursor=self.span_cursor, vectors=self.source_vectors())

    def source_walk(self) -> SourceWalk:
        # brackets are spans over the words, for the span cursor: "(X" opens one at the
        # next word to place, ")X" closes the innermost. Only top-down: in in-order output
        # "(X" follows its first child, so the next word is not where its span starts.
        source, target = self.vocabularies.source, self.vocabularies.target
        symbols = list(enumerate(target.symbols))[len(SPECIALS):] if self.order == "top_down" else []
        return SourceWalk(advance=tuple(sorted(target.index(s) for s in self.preterminals)),
                          starts=tuple(i for i, p in enumerate(source.symbols) if p.startswith(WORD_START)),
                          opens=tuple(i for i, s in symbols if is_open(s)),
                          closes=tuple(i for i, s in symbols if is_close(s)))


class ParsingTask:
    """Penn Treebank constituency parsing."""

    name = "parsing"
    Config = ParsingConfig
    metric = "f1"
    defaults: ClassVar[dict[str, Any]] = {
        # Vaswani et al. 2017, 6.3: beam 21, alpha 0.3, maximum output length input + 300
        # (|x| counts sentencepiece pieces, at least the words: the limit is never below
        # the paper's).
        "decode": {"beam": 21, "alpha": 0.3, "max_len_a": 1.0, "max_len_b": 300,
                   "compare_unconstrained": True},
        "model": {"share_embeddings": False},
    }
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "default": _SAMPLE,
        # the same model on a 2-core CPU: as many updates as 30 minutes allow
        "cpu": {**_SAMPLE, "train": {**_SAMPLE["train"], "max_minutes": 30.0, "max_steps": 100000}},
        "wsj": {
            "model": {"encoder_layers": 4, "decoder_layers": 4, "d_model": 1024, "d_ff": 4096,
                      "heads": 16, "dropout": 0.3, "attention_dropout": 0.1},
            "train": {"max_tokens": 25000, "warmup": 4000, "max_steps": 100000, "eval_every": 2000,
                      "checkpoint_every": 2000, "valid_max_examples": 500},
            "data": {"vocab_size": 16000},
        },
    }

    def __init__(self, config: ParsingConfig) -> None:
        self.config = config

    @staticmethod
    def upgrade(config: dict[str, Any], weights: dict[str, Any]) -> list[str]:
        """Runs saved by seqtrans 0.1.0, whose engine held the cursors and word vectors
        (:mod:`seqtrans_parsing.upgrade`)."""
        from seqtrans_parsing.upgrade import upgrade

        return upgrade(config, weights)

    # -------------------------------------------------------------- data

    def trees(self, split: str, skipped: list[str]) -> Iterator[tuple[Tree, str]]:
        """The raw trees of a split with their origins (``file:line``); with
        ``data.malformed=skip``, ``file:line: problem`` of each malformed one is appended
        to ``skipped``."""
        check_split(split)
        c = self.config
        skip = c.malformed == "skip"
        explicit = {"train": c.train, "dev": c.dev, "test": c.test}[split]
        if explicit:
            yield from treebank.read_files(treebank.expand(explicit), skip=skip, skipped=skipped)
        elif c.wsj_root:
            sections = getattr(c, f"{split}_sections")
            numbers = treebank.parse_range(sections, key=f"data.{split}_sections")
            files = treebank.wsj_files(c.wsj_root, numbers)
            yield from treebank.read_files(files, skip=skip, skipped=skipped)
        else:
            numbers = treebank.parse_range(getattr(c, f"{split}_files"), key=f"data.{split}_files")
            yield from treebank.read_nltk(c.corpus, numbers, data_dir=c.nltk_data, download=c.download,
                                          skip=skip, skipped=skipped)

    def source_of(self, split: str) -> str:
        """Where the trees of a split are read from, as messages name it."""
        c = self.config
        explicit = {"train": c.train, "dev": c.dev, "test": c.test}[split]
        if explicit:
            return explicit
        if c.wsj_root:
            return f"{c.wsj_root} (WSJ sections {getattr(c, f'{split}_sections')})"
        return f"{c.corpus} (NLTK files {getattr(c, f'{split}_files')})"

    def read(self, split: str) -> Iterator[Example[Sentence, Tree] | Skipped]:
        check_split(split)
        return self._read(split)

    def _read(self, split: str) -> Iterator[Example[Sentence, Tree] | Skipped]:
        malformed: list[str] = []
        kept: list[tuple[Tree, str]] = []
        augment = split == "train" and self.config.substitute > 0
        for raw, origin in self.trees(split, malformed):
            yield from _skipped(malformed)
            tree = preprocess(raw)
            if tree is None:
                yield Skipped(origin, "the tree holds only empty elements")
                continue
            if augment:
                kept.append((tree, origin))
            yield _example(tree, origin)
        yield from _skipped(malformed)
        if augment:
            count = round(self.config.substitute * len(kept))
            made = substitute([t for t, _ in kept], count, seed=self.config.substitute_seed)
            log.info("train: %d trees made by subtree substitution (data.substitute=%g)", len(made),
                     self.config.substitute)
            for s in made:
                yield _example(s.tree, f"{kept[s.recipient][1]} with a {s.label} of {kept[s.donor][1]}")

    # -------------------------------------------------------------- vocabularies

    def build_vocabulary(self, directory: Path, train: Iterable[Example[Sentence, Tree]]) -> ParsingCodec:
        import sentencepiece as spm

        model_path = directory / "sentencepiece.model"
        examples = list(train)
        if not examples:
            raise DataError(self.source_of("train"), None, "holds no training trees to build the "
                            "vocabulary from")
        sentences = [" ".join(e.source.words) for e in examples]
        train_sentencepiece(sentences, model_path, vocab_size=self.config.vocab_size,
                            model_type=self.config.sentencepiece_model)
        sp = spm.SentencePieceProcessor(model_file=str(model_path))
        log.info("sentencepiece %s: %d pieces (data.vocab_size=%d)", spm.__version__, sp.get_piece_size(),
                 self.config.vocab_size)
        source = Vocab(p for p in (sp.id_to_piece(i) for i in range(1, sp.get_piece_size()))
                       if p and not any(ch.isspace() for ch in p))
        labels: set[str] = set(PTB_LABELS)
        for e in examples:  # every order writes the same openings
            labels.update(tok[1:] for tok in linearize(e.target) if tok[0] == "(")
        preterminals = [PLACEHOLDER]
        if self.config.preterminals == "tags":
            preterminals = sorted(set(PTB_TAGS).union(*(e.source.tags or () for e in examples)))
        target = Vocab(preterminals + [f"{b}{label}" for label in sorted(labels) for b in "()"])
        source.save(directory / "source.vocab")
        target.save(directory / "target.vocab")
        return self._codec(sp, source, target, self._vectors(directory, sp, examples))

    def load_vocabulary(self, directory: Path) -> ParsingCodec:
        import sentencepiece as spm

        model_path = directory / "sentencepiece.model"
        try:
            sp = spm.SentencePieceProcessor(model_file=str(model_path))
        except (OSError, RuntimeError) as exc:
            raise DataError(model_path, None, f"cannot load the sentencepiece model: {exc}") from None
        source = Vocab.load(directory / "source.vocab")
        target = Vocab.load(directory / "target.vocab")
        vectors = None
        if self.config.word_vectors:
            from seqtrans_parsing.vectors import VectorSource

            vectors = VectorSource.load(directory / VECTORS_FILE)
        return self._codec(sp, source, target, vectors)

    def _codec(self, sp: Any, source: Vocab, target: Vocab, vectors: VectorSource | None) -> ParsingCodec:
        return ParsingCodec(sp, Vocabularies(source, target), tags=self.config.preterminals == "tags",
                            unigram=self.config.sentencepiece_model == "unigram",
                            order=self.config.linearization, vectors=vectors,
                            source_cursor=self.config.source_cursor, span_cursor=self.config.span_cursor)

    def _vectors(self, directory: Path, sp: Any,
                 examples: list[Example[Sentence, Tree]]) -> VectorSource | None:
        """The word vectors of data.word_vectors, recorded in ``directory``; logs how many
        of the training words they know."""
        if not self.config.word_vectors:
            return None
        from seqtrans_parsing.vectors import WordVectors, describe, load

        vectors = describe(self.config.word_vectors)
        vectors.save(directory / VECTORS_FILE)
        table = WordVectors(load(vectors), [sp.id_to_piece(i) for i in range(sp.get_piece_size())])
        sources = [sp.encode(" ".join(e.source.words)) for e in examples]
        log.info("word vectors %s: %.1f %% of the training words have one", vectors.name,
                 100 * table.coverage(sources))
        return vectors

    def parse_source(self, line: str) -> Sentence:
        return Sentence(tuple(_ESCAPES.get(w, w) for w in line.split()))

    def parse_target(self, line: str) -> Tree:
        """One bracketed tree, preprocessed as the training trees are."""
        trees = [tree for tree, _ in read_trees(line)]
        if len(trees) != 1:
            raise DataError(None, None, f"a target line must hold one tree, not {len(trees)}")
        tree = preprocess(trees[0])
        if tree is None:
            raise DataError(None, None, "the tree holds only empty elements")
        return tree

    def format(self, prediction: Parse) -> str:
        return str(_with_root(prediction.tree))

    # -------------------------------------------------------------- metrics

    def score(self, predictions: Sequence[Parse],
              examples: Sequence[Example[Sentence, Tree]]) -> dict[str, float]:
        gold = [str(_with_root(e.target)) for e in examples]
        test = [str(_with_root(p.tree)) for p in predictions]
        report = evalb(gold, test, COLLINS, limits=False, max_error=-1)
        a, s = report.all, report.short
        n = max(len(predictions), 1)

        def num(x: float) -> float:
            return 0.0 if math.isnan(x) else round(x, 2)

        scores = {
            "f1": num(a.fmeasure), "recall": num(a.recall), "precision": num(a.precision),
            "complete_match": num(a.complete_match), "f1_len40": num(s.fmeasure),
            "evalb_errors": float(a.errors + a.skips),
            "malformed": round(sum(p.malformed for p in predictions) / n * 100, 2),
            "repairs": float(sum(p.repairs for p in predictions)),
        }
        if self.config.preterminals == "tags":
            # the decoded tags against the gold ones, every word counted (a missing tag is wrong)
            words = correct = 0
            for p, e in zip(predictions, examples, strict=True):
                gold_tags = e.source.tags or ()
                words += len(gold_tags)
                correct += sum(t == g for t, g in zip(p.preterminals, gold_tags))
            scores["tag_accuracy"] = round(correct / words * 100, 2) if words else 0.0
        return scores


def _skipped(malformed: list[str]) -> Iterator[Skipped]:
    """The malformed trees reported so far, as :class:`Skipped` (the list is emptied)."""
    for entry in malformed:
        yield Skipped(entry, "malformed tree (data.malformed=skip)")
    malformed.clear()


def _example(tree: Tree, origin: str) -> Example[Sentence, Tree]:
    tagged = tree.tagged()
    return Example(Sentence(tuple(w for _, w in tagged), tuple(t for t, _ in tagged)), tree, origin)


def _with_root(tree: Tree) -> Tree:
    """The tree under a ``TOP`` root, the convention gold and predictions share for EVALB."""
    return tree if tree.label == "TOP" else Tree("TOP", [tree])


# mypy checks the task against the contract and its abilities here
_contract: TaskClass[Sentence, Tree, Parse] = ParsingTask
_upgrading: Upgrading = ParsingTask
_extending: type[ModelExtending] = ParsingCodec
