"""Prepared training data: the binarized format, the cache, cleaning counts, resumption."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from fake_plugins.lines_task import LinesCodec, LinesTask
from seqtrans import prepare as prep
from seqtrans.config import RunConfig, TrainConfig
from seqtrans.data.batches import source_ids, target_ids
from seqtrans.data.vocab import EOS, Vocab, Vocabularies
from seqtrans.prepare import workers
from seqtrans.prepare.binarized import PreparedError, open_dataset
from seqtrans.tasks import Example, Skipped


@dataclass
class WordTask(LinesTask):
    """Whitespace words; ``items`` is what ``read("train")`` yields. Counts its reads."""

    items: list[Example[str, str] | Skipped]
    digest: str | None = None
    reads: list[str] = field(default_factory=list)

    def read(self, split: str) -> Iterator[Example[str, str] | Skipped]:  # type: ignore[override]
        self.reads.append(split)
        return iter(self.items)

    def build_vocabulary(self, directory: Path, train: Iterable[Example[str, str]]) -> LinesCodec:
        Vocab.build(tok for ex in train for tok in (ex.source.split() + ex.target.split())).save(
            directory / "words.vocab")
        return self.load_vocabulary(directory)

    def load_vocabulary(self, directory: Path) -> LinesCodec:
        vocab = Vocab.load(directory / "words.vocab")
        return LinesCodec(Vocabularies(vocab, vocab))


class DigestTask(WordTask):
    def train_digest(self) -> str:
        assert self.digest is not None
        return self.digest


def corpus(n: int, seed: int = 0) -> list[Example[str, str] | Skipped]:
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(40)]
    items: list[Example[str, str] | Skipped] = []
    for i in range(n):
        src = " ".join(rng.choice(words, rng.integers(1, 9)))
        tgt = " ".join(rng.choice(words, rng.integers(1, 9)))
        items.append(Example(src, tgt, origin=f"train.txt:{i + 1}"))
    return items


def config(tmp_path: Path, **train: object) -> RunConfig:
    return RunConfig(task="words", train=TrainConfig(**{"data_cache": str(tmp_path / "cache"), **train}))


def test_round_trip_offsets_and_positions(tmp_path: Path) -> None:
    items = corpus(60)
    items.insert(5, Skipped("train.txt:x", "empty source"))
    items.insert(20, Skipped("train.txt:y", "empty source"))
    task = WordTask(items)
    prepared = prep.prepare(task, config(tmp_path))
    examples = [e for e in items if isinstance(e, Example)]
    data = prepared.dataset
    assert len(data) == 60 and data.src.ids.dtype == np.uint16
    for i, ex in enumerate(examples):
        assert data.src[i].tolist() == source_ids(prepared.codec, ex.source)
        assert data.src[i][-1] == EOS
        assert data.tgt[i].tolist() == target_ids(prepared.codec, ex.target)
    assert data.positions.tolist() == list(range(60))  # positions among examples, skips not counted
    assert data.src.lengths.tolist() == [len(source_ids(prepared.codec, e.source)) for e in examples]
    assert data.src.offsets[0] == 0 and data.src.offsets[-1] == len(data.src.ids)
    assert data.meta["removed"] == {"empty source": 2} and data.meta["inputs_read"] == 62
    assert not prepared.reused
    # the same data and settings: found again (the data is read once, to hash it, not encoded)
    again = prep.prepare(task, config(tmp_path))
    assert again.reused and again.directory == prepared.directory


def test_cleaning_counts_long_and_duplicate_pairs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    items: list[Example[str, str] | Skipped] = [
        Example("a b", "c"), Example("a b c d e", "a"), Example("a b", "c"), Example("b", "a b c d"),
        Example("c", "c"), Example("a b", "c"), Skipped("f:7", "too many words"), Example("c", "c"),
    ]
    with caplog.at_level(logging.INFO):
        prepared = prep.prepare(WordTask(items), config(tmp_path, max_length=4, dedup=True))
    # "a b c d e" + EOS is 6 source tokens; "a b c d" + EOS is 5 target tokens
    assert prepared.dataset.meta["removed"] == {
        "duplicate of an earlier pair (train.dedup)": 3,
        "longer than train.max_length=4 tokens": 2,
        "too many words": 1,
    }
    assert prepared.dataset.positions.tolist() == [0, 4]  # first of each kept
    assert "removed 3 of 7 pairs: duplicate" in caplog.text
    task_filter = [r for r in caplog.records if r.getMessage().startswith("train: left out")]
    # the task's own filter is news (INFO), not a warning on every run
    assert [(r.levelno, r.getMessage()) for r in task_filter] == [
        (logging.INFO, "train: left out 1 of 8 inputs: too many words (first: f:7)")]
    # without dedup the repeats stay
    kept = prep.prepare(WordTask(items), config(tmp_path, max_length=4)).dataset
    assert kept.positions.tolist() == [0, 2, 4, 5, 6]


def test_workers_write_the_same_dataset_as_one_process(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "CHUNK", 70)  # several chunks, so that a pool of workers starts
    items = corpus(500, seed=4)
    one = prep.prepare(WordTask(items), config(tmp_path / "one", prepare_workers=1)).directory
    two = prep.prepare(WordTask(items), config(tmp_path / "two", prepare_workers=2)).directory
    for name in ("src.ids", "tgt.ids", "src.offsets.npy", "tgt.offsets.npy", "positions.npy"):
        assert (one / name).read_bytes() == (two / name).read_bytes(), name


def test_damaged_or_foreign_files_are_refused_by_name_and_rebuilt(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    task = DigestTask(corpus(50), digest="v1")
    prepared = prep.prepare(task, config(tmp_path))
    directory, key = prepared.directory, prepared.dataset.meta["key"]
    ids = directory / "src.ids"
    whole = ids.read_bytes()
    ids.write_bytes(whole[:-6])
    with pytest.raises(PreparedError, match=r"src\.ids: truncated or extended"):
        open_dataset(directory, key=key)
    ids.write_bytes(b"not ours" * 20)
    with pytest.raises(PreparedError, match="not a seqtrans ids file"):
        open_dataset(directory, key=key)
    other = prep.prepare(DigestTask(corpus(50, seed=9), digest="v2"), config(tmp_path)).directory
    shutil.copy(other / "src.ids", ids)  # another dataset's file
    with pytest.raises(PreparedError, match="belongs to prepared data"):
        open_dataset(directory, key=key)
    ids.write_bytes(whole)
    (directory / "tgt.offsets.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(PreparedError, match=r"tgt\.offsets\.npy"):
        open_dataset(directory, key=key)
    with caplog.at_level(logging.WARNING):
        rebuilt = prep.prepare(task, config(tmp_path))
    assert not rebuilt.reused and "preparing it again" in caplog.text
    assert (directory / "src.ids").read_bytes() == whole
    # a flipped bit keeps the size: only the sha256 check finds it
    flipped = bytearray(whole)
    flipped[-1] ^= 1
    ids.write_bytes(bytes(flipped))
    assert prep.prepare(task, config(tmp_path)).reused
    with caplog.at_level(logging.WARNING):
        assert not prep.prepare(task, config(tmp_path), verify=True).reused
    assert "src.ids: its sha256 differs" in caplog.text


def test_an_interrupted_preparation_resumes_from_its_shards(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "CHUNK", 40)
    items = corpus(300, seed=2)
    encoded: list[int] = []
    original = workers.encode_shard

    def failing(codec: object, index: int, *args: object) -> None:
        if index == 4:
            raise KeyboardInterrupt  # as if interrupted while encoding shard 4
        encoded.append(index)
        original(codec, index, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(workers, "encode_shard", failing)
    task = WordTask(items)
    with pytest.raises(KeyboardInterrupt):
        prep.prepare(task, config(tmp_path, prepare_workers=1))
    assert encoded == [0, 1, 2, 3]
    partial = next((tmp_path / "cache").glob("*.partial"))
    assert (partial / "vocab" / "words.vocab").is_file() and len(list((partial / "shards").iterdir())) == 4
    monkeypatch.setattr(workers, "encode_shard", lambda codec, index, *args: (encoded.append(index),
                                                                          original(codec, index, *args)))
    resumed = prep.prepare(task, config(tmp_path, prepare_workers=1))
    assert encoded == [0, 1, 2, 3, 4, 5, 6, 7]  # the finished shards were not encoded again
    assert not partial.exists()
    fresh = prep.prepare(WordTask(items), config(tmp_path / "fresh", prepare_workers=1))
    for name in ("src.ids", "tgt.ids", "src.offsets.npy", "positions.npy"):
        assert (resumed.directory / name).read_bytes() == (fresh.directory / name).read_bytes()


def test_a_digest_finds_the_data_without_reading_it(tmp_path: Path) -> None:
    task = DigestTask(corpus(30), digest="abc")
    prep.prepare(task, config(tmp_path))
    assert task.reads == ["train", "train"]  # vocabulary, then encoding
    task.reads.clear()
    assert prep.prepare(task, config(tmp_path)).reused and task.reads == []
    # without a digest the data is read to be hashed, and a change in it is a new dataset
    plain = WordTask(corpus(30))
    first = prep.prepare(plain, config(tmp_path)).directory
    changed = WordTask(corpus(30)[:-1])
    assert prep.prepare(changed, config(tmp_path)).directory != first


def test_a_runs_own_vocabulary_reuses_the_dataset_built_with_it(tmp_path: Path) -> None:
    task = DigestTask(corpus(30), digest="abc")
    built = prep.prepare(task, config(tmp_path))
    given = prep.prepare(task, config(tmp_path), vocabulary=built.assets)
    assert given.reused and given.directory == built.directory
    other = dict(built.assets)
    other["words.vocab"] = b"".join(sorted(other["words.vocab"].splitlines(keepends=True)))
    moved = prep.prepare(task, config(tmp_path), vocabulary=other)
    assert moved.directory != built.directory and moved.assets == other


def test_no_pairs_left_is_an_error(tmp_path: Path) -> None:
    from seqtrans.errors import DataError

    with pytest.raises(DataError, match="no training pairs are left"):
        prep.prepare(WordTask([Example("a a a a a a", "a")]), config(tmp_path, max_length=3))
    # an empty training set, or one the task left out whole, says what was removed
    with pytest.raises(DataError, match=r"no training pairs are left after preparation \(removed: none\)"):
        prep.prepare(WordTask([]), config(tmp_path))
    with pytest.raises(DataError, match=r"\(removed: \{'empty pair': 2\}\)"):
        prep.prepare(WordTask([Skipped("t:1", "empty pair"), Skipped("t:2", "empty pair")]), config(tmp_path))
    assert not [p for p in (tmp_path / "cache").iterdir() if not p.suffix]  # no finished dataset


@dataclass(frozen=True)
class CachedData:
    """Data settings that name the run's cache (``data.cache_dir``)."""

    cache_dir: str = ""


def test_data_cache_dir_moves_the_prepared_data_and_train_data_cache_still_names_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    task = DigestTask(corpus(30), digest="abc")
    moved = prep.prepare(task, RunConfig(task="words", data=CachedData(str(tmp_path / "mine"))))
    assert moved.directory.parent == tmp_path / "mine" / "prepared"
    # where the data is kept is no part of its key (here the data is read and hashed)
    one, two = (prep.prepare(WordTask(corpus(30)), RunConfig(task="words", data=CachedData(str(place))))
                for place in (tmp_path / "one", tmp_path / "two"))
    assert one.directory.name == two.directory.name and one.directory.parent != two.directory.parent
    monkeypatch.setenv("SEQTRANS_CACHE_DIR", str(tmp_path / "env"))
    assert prep.prepare(task, RunConfig(task="words", data=CachedData())).directory.parent == (
        tmp_path / "env" / "prepared")
    with caplog.at_level(logging.WARNING):  # the deprecated key still names the directory itself
        kept = prep.prepare(task, config(tmp_path))
    assert kept.directory.parent == tmp_path / "cache"
    assert "train.data_cache is deprecated: set data.cache_dir" in caplog.text
