"""The shared sentencepiece model: exact detokenization, valid tokens, caching by content."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqtrans.plugin import SPECIALS, DataError
from seqtrans_translation import subwords
from seqtrans_translation.readers import read_lines
from seqtrans_translation.subwords import Subwords, SubwordSettings
from translation_data import MULTI30K


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return [text for lang in ("en", "de") for _, text in read_lines(MULTI30K / f"train.{lang}.gz")]


@pytest.fixture(scope="module")
def model(corpus: list[str]) -> Subwords:
    return Subwords(subwords.train(corpus, SubwordSettings(vocab_size=4000)))


def test_detokenization_gives_back_the_raw_text(model: Subwords) -> None:
    # every line of every Multi30k file, trailing spaces, tabs and no-break spaces included,
    # and characters never seen in training
    lines = [text for path in sorted(MULTI30K.glob("*.gz")) for _, text in read_lines(path)]
    assert len(lines) == 2 * (29000 + 1014 + 1000 + 1000 + 461 + 1071)
    assert any(t.endswith(" ") for t in lines) and any("\u00a0" in t for t in lines)
    unseen = ["Übermäßig große Öl-Tanks für 5 €!", "東京の夜景 ✓ 😀", "  two  leading spaces \t tab ", ""]
    for text in lines + unseen:
        assert model.decode(model.encode(text)) == text


def test_pieces_are_valid_tokens_and_the_vocabulary_is_the_model(model: Subwords) -> None:
    pieces = [p for text in ["a\u00a0b\tc", "Ein Mann fährt Fahrrad."] for p in model.encode(text)]
    assert all(p and not any(c.isspace() for c in p) for p in pieces)
    assert "<0xC2>" in pieces and "<0x09>" in pieces  # white space other than " " goes as bytes
    assert len(model.vocab) == 4000 - 1 + len(SPECIALS)  # sentencepiece's <unk> is the engine's
    assert model.vocab.symbols[: len(SPECIALS)] == SPECIALS
    assert all(model.vocab.index(p) > 3 for p in pieces)
    assert model.decode(["▁Ein", "<unk>", "▁Mann"]) == "Ein Mann"  # an unknown id decodes to nothing


def test_models_are_cached_by_the_content_of_their_text_and_settings(
        tmp_path: Path, corpus: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    texts = corpus[:2000]
    settings = SubwordSettings(vocab_size=600)
    first = subwords.build(texts, settings, tmp_path)
    cached = list((tmp_path / "sentencepiece").iterdir())
    assert [p.name for p in cached] == [subwords.fingerprint(texts, settings) + ".model"]

    def no_training(*args: object) -> bytes:
        raise AssertionError("trained again")

    monkeypatch.setattr(subwords, "train", no_training)
    assert subwords.build(list(texts), settings, tmp_path).model == first.model
    for other_texts, other_settings in [(texts[:-1] + [texts[-1] + " "], settings),
                                        (texts, SubwordSettings(vocab_size=601)),
                                        (texts, SubwordSettings(vocab_size=600, model_type="unigram"))]:
        assert subwords.fingerprint(other_texts, other_settings) != subwords.fingerprint(texts, settings)
    monkeypatch.undo()
    unigram = subwords.build(texts, SubwordSettings(vocab_size=600, model_type="unigram"), tmp_path)
    assert unigram.model != first.model and len(list((tmp_path / "sentencepiece").iterdir())) == 2
    assert unigram.decode(unigram.encode(texts[7])) == texts[7]


def test_training_is_deterministic_and_samples_large_inputs(corpus: list[str]) -> None:
    settings = SubwordSettings(vocab_size=500, sample_sentences=3000)
    assert subwords.train(corpus, settings) == subwords.train(corpus, settings)
    assert subwords.train(corpus, settings) != subwords.train(corpus[:3000], settings)


def test_the_model_travels_in_the_vocabulary_directory(tmp_path: Path, model: Subwords) -> None:
    model.save(tmp_path)
    assert Subwords.load(tmp_path).vocab == model.vocab
    (tmp_path / subwords.MODEL_FILE).write_bytes(b"not a model")
    with pytest.raises(DataError, match="not a sentencepiece model"):
        Subwords.load(tmp_path)


def test_the_subword_sample_keeps_everything_in_order_when_it_fits() -> None:
    from seqtrans_translation.subwords import sample

    texts = [f"s{i}" for i in range(50)]
    assert sample(iter(texts), 50, seed=1) == texts
    assert sample(iter(texts), 0, seed=1) == texts
    assert sample(iter(texts), 80, seed=1) == texts


def test_the_subword_sample_is_uniform_over_the_stream() -> None:
    from collections import Counter

    from seqtrans_translation.subwords import sample

    n, k, rounds = 200, 20, 3000
    counts: Counter[int] = Counter()
    for seed in range(rounds):
        chosen = sample((str(i) for i in range(n)), k, seed=seed)
        assert len(set(chosen)) == k
        counts.update(int(c) for c in chosen)
    expected = rounds * k / n  # 300 a text; the binomial spread is about 17
    assert all(abs(counts[i] - expected) < 6 * 17.3 for i in range(n))
    first, last = sum(counts[i] for i in range(50)), sum(counts[i] for i in range(150, 200))
    assert abs(first - last) < 0.06 * first  # no drift along the stream
    assert sample((str(i) for i in range(n)), k, seed=7) == sample((str(i) for i in range(n)), k, seed=7)
