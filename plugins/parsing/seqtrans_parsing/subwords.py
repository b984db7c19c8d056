"""The source words' sentencepiece model, trained the same way whatever the installed
sentencepiece version.

A unigram model's training starts from seed pieces that sentencepiece picks itself,
and how it picks them has changed between releases: on the treebank sample's training
words, asked for 8,000 pieces, 0.1.99 and 0.2.0 give 6,571, 0.2.2 gives 8,000 (about
5,050 of the 10,508 word types whole) and 0.2.3 gives 5,965 (1,994 whole); a model
trained on one version parsed about 2 F1 worse than on another (docs/tasks/parsing-experiments.md).
So the task writes the seeds itself, the way sentencepiece's unigram trainer long chose
them: every substring of a word, marked with the word-start sign, that occurs at least
twice, at most 16 characters long, scored by frequency times length. sentencepiece still
drops the seeds its rules forbid (digits with split_digits, mixed scripts) and adds the
characters; from these seeds 0.2.0, 0.2.2 and 0.2.3 give models that share 7,983 of their
8,000 pieces.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["WORD_START", "seed_pieces", "train_sentencepiece"]

# sentencepiece's mark of a word's first piece
WORD_START = "\u2581"

# sentencepiece's defaults: the longest piece, and how many seeds its trainer keeps
MAX_PIECE_LENGTH = 16
MAX_SEEDS = 1_000_000


def seed_pieces(words: Iterable[str], *, max_length: int = MAX_PIECE_LENGTH,
                limit: int = MAX_SEEDS) -> list[tuple[str, int]]:
    """(piece, frequency x length) of every substring of ``▁word`` with 2 to ``max_length``
    characters that occurs at least twice in ``words`` (a running text, one word per item),
    best first (ties in piece order), at most ``limit``."""
    counts: Counter[str] = Counter()
    for word, n in Counter(words).items():
        marked = WORD_START + word
        for i in range(len(marked)):
            for j in range(i + 2, min(len(marked), i + max_length) + 1):
                counts[marked[i:j]] += n
    scored = [(piece, freq * len(piece)) for piece, freq in counts.items() if freq >= 2]
    scored.sort(key=lambda item: (-item[1], item[0]))
    return scored[:limit]


def train_sentencepiece(sentences: Sequence[str], out: Path, *, vocab_size: int, model_type: str) -> None:
    """Train the source model on ``sentences`` (words separated by spaces) into ``out``:
    identity normalisation, digits split, every character kept, ``vocab_size`` a soft limit;
    a unigram model starts from :func:`seed_pieces`."""
    import sentencepiece as spm

    options: dict[str, Any] = dict(vocab_size=vocab_size, model_type=model_type, character_coverage=1.0,
                                      normalization_rule_name="identity", hard_vocab_limit=False,
                                      split_digits=True, bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0,
                                      num_threads=1, minloglevel=2)
    with tempfile.TemporaryDirectory() as tmp:
        if model_type == "unigram":
            seeds = seed_pieces(w for s in sentences for w in s.split())
            if seeds:  # sentencepiece refuses an empty seed file; then it picks its own
                path = Path(tmp) / "seeds.tsv"
                path.write_text("".join(f"{piece}\t{score}\n" for piece, score in seeds), encoding="utf-8")
                options["seed_sentencepieces_file"] = str(path)
        with out.open("wb") as writer:
            spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=writer, **options)
