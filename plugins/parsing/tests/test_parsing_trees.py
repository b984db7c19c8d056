"""Reading Penn Treebank trees, the standard preprocessing, and the data sources."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nltk
import pytest
from nltk.corpus.reader import BracketParseCorpusReader
from nltk.corpus.util import LazyCorpusLoader

from parsing_data import NLTK_DATA, SAMPLE, use_shared_nltk_data
from seqtrans.inference import evaluation  # internal: the engine's count of what the reader skipped
from seqtrans.plugin import ConfigError, DataError, Example, Skipped
from seqtrans_parsing import Parse, ParsingConfig, ParsingTask
from seqtrans_parsing.treebank import parse_range
from seqtrans_parsing.trees import MalformedTree, Tree, preprocess, read_trees, strip_function_tags


@pytest.fixture(autouse=True)
def _nltk_data(monkeypatch: pytest.MonkeyPatch) -> None:
    use_shared_nltk_data(monkeypatch)


def test_multi_line_trees_and_one_tree_per_line_read_alike() -> None:
    text = ("\n( (S \n    (NP-SBJ (NNP Vinken) )\n    (VP (VBZ is) )\n    (. .) ))\n\n"
            "( (S (NP (PRP It)) (VP (VBD was))))\n")
    trees = list(read_trees(text))
    assert [line for _, line in trees] == [2, 7]
    assert str(trees[0][0]) == "( (S (NP-SBJ (NNP Vinken)) (VP (VBZ is)) (. .)))"
    assert [str(t) for t, _ in read_trees(" ".join(text.split()))] == [str(t) for t, _ in trees]


@pytest.mark.parametrize(("text", "line", "problem"), [
    ("(S (NP (DT a)\n(VP (VB b)))\n)\n)", 4, "no open bracket"),
    ("(S (NP (DT a))\n(VP (VB b))", 1, "not closed"),
    ("(S (NP (DT a) b))", 1, "a word after subtrees"),
    ("(S (DT a b))", 1, "a second word"),
    ("(S (DT a))\nword", 2, "outside any tree"),
    ("(S ())", 1, "empty bracket"),
])
def test_malformed_trees_name_the_file_and_line(text: str, line: int, problem: str) -> None:
    with pytest.raises(MalformedTree) as err:
        list(read_trees(text, path="x.mrg"))
    assert err.value.line == line and problem in str(err.value)
    assert str(err.value).startswith(f"x.mrg:{line}:")


def test_malformed_trees_can_be_skipped_and_counted() -> None:
    text = "(S (DT a) (NN b))\n(S (DT a b))\n(S (NN c))\n(S (NN d)\n(S (NN e))\n"
    skipped: list[str] = []
    trees = [str(t) for t, _ in read_trees(text, path="f", skip_malformed=True, skipped=skipped)]
    assert trees == ["(S (DT a) (NN b))", "(S (NN c))", "(S (NN e))"]
    assert [s.split(":")[1] for s in skipped] == ["2", "4"]


def test_preprocessing() -> None:
    (raw, _), = read_trees("( (S (NP-SBJ-1 (-NONE- *)) (VP=2 (VBD said) (SBAR (-NONE- 0) (S (-NONE- *T*-1))))"
                           " (NP-TMP (-LRB- -LRB-) (NN today)) (. .)))")
    assert str(preprocess(raw)) == "(S (VP (VBD said)) (NP (-LRB- -LRB-) (NN today)) (. .))"
    assert strip_function_tags("-NONE-") == "-NONE-" and strip_function_tags("PP-LOC-CLR") == "PP"
    (top, _), = read_trees("(TOP (S (NN x)))")
    assert str(preprocess(top)) == "(S (NN x))"
    (flat, _), = read_trees("( (NN x) (NN y))")
    assert str(preprocess(flat)) == "(TOP (NN x) (NN y))"
    assert preprocess(Tree("", [Tree("-NONE-", ["*"])])) is None


def test_ranges() -> None:
    assert parse_range("02-04,23", key="k") == [2, 3, 4, 23]
    with pytest.raises(ConfigError, match="backwards"):
        parse_range("4-2", key="k")


def _sample_trees(split: str) -> list[str]:
    text = (SAMPLE / f"{split}.trees").read_text()
    return [str(preprocess(t)) for t, _ in read_trees(text)]


def test_the_nltk_treebank_split_by_file_id_matches_the_sample_files() -> None:
    task = ParsingTask(ParsingConfig())
    counts = {"train": 3068, "dev": 433, "test": 413}
    tokens = {"train": 73842, "dev": 10627, "test": 9615}
    for split in ("train", "dev", "test"):
        examples = list(task.read(split))
        assert len(examples) == counts[split]
        assert sum(len(e.source.words) for e in examples) == tokens[split]
        assert [str(e.target) for e in examples] == _sample_trees(split)
    assert examples[0].origin == "treebank/wsj_0170.mrg:2"


def test_tree_files_and_the_wsj_layout(tmp_path: Path) -> None:
    lines = (SAMPLE / "test.trees").read_text().splitlines()
    for section, chunk in (("22", lines[:5]), ("23", lines[5:9])):
        (tmp_path / "wsj" / section).mkdir(parents=True)
        (tmp_path / "wsj" / section / f"wsj_{section}00.mrg").write_text("\n\n".join(chunk) + "\n")
    task = ParsingTask(ParsingConfig(wsj_root=str(tmp_path / "wsj"), train_sections="22", test_sections="23",
                                     dev=str(SAMPLE / "dev.trees")))
    assert len(list(task.read("train"))) == 5 and len(list(task.read("test"))) == 4
    assert len(list(task.read("dev"))) == 433
    with pytest.raises(DataError, match="section 02"):
        list(ParsingTask(ParsingConfig(wsj_root=str(tmp_path / "wsj"))).read("train"))


def test_a_malformed_file_is_an_error_or_skipped_by_the_setting(tmp_path: Path) -> None:
    bad = tmp_path / "bad.trees"
    bad.write_text("(S (NN a))\n(S (NN b)\n(S (NN c))\n")
    with pytest.raises(DataError, match=r"bad.trees:2: tree not closed"):
        list(ParsingTask(ParsingConfig(train=str(bad))).read("train"))
    task = ParsingTask(ParsingConfig(train=str(bad), malformed="skip"))
    read = list(task.read("train"))
    assert [type(r).__name__ for r in read] == ["Example", "Skipped", "Example"]
    skipped = read[1]
    assert isinstance(skipped, Skipped) and skipped.origin.startswith(f"{bad}:2: tree not closed")
    assert skipped.reason == "malformed tree (data.malformed=skip)"
    examples = [r for r in read if isinstance(r, Example)]
    assert [str(e.target) for e in examples] == ["(S (NN a))", "(S (NN c))"]
    assert task.score([Parse(e.target, 0) for e in examples], examples)["f1"] == 100.0
    # each reading counts afresh: the same split read twice reports the same
    assert evaluation.read_split(task, "train").skipped == evaluation.read_split(task, "train").skipped == {
        "malformed tree (data.malformed=skip)": 1}


def test_the_nltk_corpus_is_fetched_when_missing_or_refused(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # a corpus loader not yet loaded (as NLTK defines it), and no shared data on the path
    monkeypatch.setattr(nltk.corpus, "treebank", LazyCorpusLoader(
        "treebank/combined", BracketParseCorpusReader, r"wsj_.*\.mrg", tagset="wsj", encoding="ascii"))
    monkeypatch.setattr(nltk.data, "path", [p for p in nltk.data.path if p != str(NLTK_DATA)])
    empty = tmp_path / "nltk"
    with pytest.raises(DataError, match="not found in NLTK's search path.*data.download is off"):
        list(ParsingTask(ParsingConfig(nltk_data=str(empty), download=False)).read("test"))
    fetched: list[tuple[str, str | None]] = []

    def download(name: str, download_dir: str | None = None, **_: object) -> bool:
        """NLTK's downloader, served from the shared copy of its package."""
        fetched.append((name, download_dir))
        assert download_dir is not None
        (Path(download_dir) / "corpora").mkdir(parents=True, exist_ok=True)
        shutil.copy(NLTK_DATA / "corpora" / "treebank.zip", Path(download_dir) / "corpora")
        return True

    monkeypatch.setattr(nltk, "download", download)
    task = ParsingTask(ParsingConfig(nltk_data=str(empty), test_files="199"))
    assert len(list(task.read("test"))) > 0 and fetched == [("treebank", str(empty))]


def test_nltk_data_is_honoured(tmp_path: Path) -> None:
    code = ("from seqtrans_parsing.treebank import read_nltk\n"
            "print(sum(1 for _ in read_nltk('treebank', [1], data_dir='', download=False, skip=False,"
            " skipped=[])))\n")
    env = {**os.environ, "NLTK_DATA": str(NLTK_DATA), "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "2"
    env["NLTK_DATA"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode != 0 and "not found in NLTK's search path" in done.stderr
