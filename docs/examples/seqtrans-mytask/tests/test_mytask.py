from pathlib import Path

import pytest

from seqtrans.errors import DataError
from seqtrans.tasks import Example, Skipped
from seqtrans.tasks.contract import check_task
from seqtrans_mytask import MyConfig, MyTask

PAIRS = [("a b c", "c b a"), ("b c", "c b"), ("c a a", "a a c")]


def _task(tmp_path: Path, text: str) -> MyTask:
    files = {}
    for split in ("train", "dev", "test"):
        files[split] = tmp_path / f"{split}.tsv"
        files[split].write_text(text, encoding="utf-8")
    return MyTask(MyConfig(**{split: str(path) for split, path in files.items()}))


def test_mytask_keeps_the_contract(tmp_path: Path) -> None:
    task = _task(tmp_path, "".join(f"{s}\t{t}\n" for s, t in PAIRS))
    scores = check_task(task, tmp_path / "vocab")
    assert scores["exact_match"] == 1.0  # references scored against themselves


def test_the_reader_skips_empty_pairs_and_names_bad_lines(tmp_path: Path) -> None:
    task = _task(tmp_path, "a b\tb a\n\tb\nc\n")
    read = task.read("test")
    first, second = next(read), next(read)
    assert first == Example("a b", "b a", origin=f"{tmp_path / 'test.tsv'}:1")
    assert second == Skipped(f"{tmp_path / 'test.tsv'}:2", "empty source or target")
    with pytest.raises(DataError, match=r"test\.tsv:3: expected source<TAB>target, found 1 field"):
        next(read)


def test_exact_match_counts_whole_outputs(tmp_path: Path) -> None:
    task = _task(tmp_path, "".join(f"{s}\t{t}\n" for s, t in PAIRS))
    examples = [e for e in task.read("test") if isinstance(e, Example)]
    assert task.score(["c b a", "c b", "a c a"], examples) == {"exact_match": 2 / 3}
