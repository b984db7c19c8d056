"""The parsing task's sentencepiece model: its own seed pieces, counted against a scan of
the running text, and a vocabulary that reaches the size asked for."""

from __future__ import annotations

import re
from pathlib import Path

import sentencepiece as spm

from parsing_data import SHARED_DATA
from seqtrans_parsing.subwords import WORD_START, seed_pieces, train_sentencepiece
from seqtrans_parsing.trees import preprocess, read_trees

WORDS = "the cat sat on the mat , the cats sat on the hat . 1990 1991".split()


def test_seed_pieces_are_the_substrings_of_marked_words_seen_twice_scored_by_frequency_times_length() -> None:
    text = " ".join(WORD_START + w for w in WORDS)
    seeds = seed_pieces(WORDS, max_length=5)
    candidates = {m[i:j] for w in WORDS for m in [WORD_START + w]
                  for i in range(len(m)) for j in range(i + 2, min(len(m), i + 5) + 1)}
    # overlapping occurrences in the running text; no piece holds a space, so none crosses words
    expected = {p: len(re.findall(f"(?={re.escape(p)})", text)) for p in candidates}
    assert dict(seeds) == {p: n * len(p) for p, n in expected.items() if n >= 2}
    assert ("\u2581the", 4 * 4) in seeds and ("at", 6 * 2) in seeds and ("\u2581199", 2 * 4) in seeds
    assert all(p not in dict(seeds) for p in ("\u2581mat", "\u2581hat", "t", "\u2581"))  # once, or 1 char
    scores = [s for _, s in seeds]
    assert scores == sorted(scores, reverse=True)
    assert seed_pieces(WORDS, max_length=5, limit=3) == seeds[:3]


def test_the_sample_vocabulary_reaches_the_size_asked_for(tmp_path: Path) -> None:
    # sentencepiece 0.2.3's own seeds gave 5,965 pieces here (1,994 word types whole)
    text = (SHARED_DATA / "ptb-sample" / "train.trees").read_text()
    sentences = []
    for raw, _ in read_trees(text):
        tree = preprocess(raw)
        if tree is not None:
            sentences.append(" ".join(tree.leaves()))
    model = tmp_path / "m.model"
    train_sentencepiece(sentences, model, vocab_size=8000, model_type="unigram")
    sp = spm.SentencePieceProcessor(model_file=str(model))
    assert sp.get_piece_size() == 8000
    types = {w for s in sentences for w in s.split()}
    whole = sum(len(sp.encode(w, out_type=str)) == 1 for w in types)
    assert whole > 0.45 * len(types)
    # digits are still split, one piece each
    assert sp.encode("1990", out_type=str) == [WORD_START, "1", "9", "9", "0"]
