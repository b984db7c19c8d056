"""A loaded model from Python: text (``predict``, ``parse``, ``score``) and parsed sources
(``decode``) each checked for what they are, so that one passed for the other is a
UsageError naming the argument instead of a silent wrong answer; each path gives what the
command line gives for the same run."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from test_inference import copy_run

import seqtrans
from seqtrans import cli
from seqtrans.data.vocab import Vocab, Vocabularies
from seqtrans.errors import DataError, UsageError
from seqtrans.inference.inputs import check_sources
from seqtrans.inference.scoring import score_files

LINES = ["3 1 4 1 5", "2 7 1 8", "6 6 9", "5 3", "12 0"]  # 12: a symbol the model has never seen


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_run(tmp_path_factory.mktemp("api") / "run", seed=3)


def cli_predict(run: Path, lines: list[str], *extra: str, monkeypatch: pytest.MonkeyPatch,
                capsys: pytest.CaptureFixture[str]) -> list[str]:
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(line + "\n" for line in lines)))
    assert cli.main(["-q", "predict", str(run), "--device", "cpu", *extra]) == 0
    return capsys.readouterr().out.splitlines()


def test_text_and_parsed_sources_give_what_predict_on_the_command_line_gives(
        run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    expected = cli_predict(run, LINES, monkeypatch=monkeypatch, capsys=capsys)
    loaded = seqtrans.load(run, device="cpu")
    assert loaded.predict(LINES) == expected
    predictions, hyps = loaded.decode(loaded.parse(LINES))
    assert [loaded.task.format(p) for p in predictions] == expected
    assert [nbest[0].text for nbest in hyps] == expected
    assert loaded.parse(LINES) == [loaded.task.parse_source(line) for line in LINES]


def test_each_hypothesis_of_an_nbest_list_has_the_text_the_command_line_writes(
        run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    written = cli_predict(run, LINES, "--set", "decode.nbest=3", monkeypatch=monkeypatch, capsys=capsys)
    loaded = seqtrans.load(run, device="cpu", overrides=["decode.nbest=3"])
    _, hyps = loaded.decode(loaded.parse(LINES))
    lines = []
    for nbest in hyps:
        lines += [f"{k + 1}\t{h.score:.4f}\t{h.text}" for k, h in enumerate(nbest)] + [""]
    assert lines == written
    assert loaded.predict(LINES) == [nbest[0].text for nbest in hyps]  # the best of each


@pytest.mark.parametrize(("sources", "message"), [
    ("3 1 4", r"^sources: expected a list of parsed sources .*got the str '3 1 4'; wrap one in a list"),
    (["3 1 4"], r"^sources\[0\]: got the text '3 1 4', but this task's sources are parsed objects: pass "
                r"loaded\.parse\(texts\)"),
    ([[3, 1], 4], r"^sources\[1\]: got an int \(4\), not a source"),
    ([None], r"^sources\[0\]: got None, not a source"),
    (None, r"^sources: expected a list of parsed sources .*got None$"),
    ((s for s in [[3]]), r"^sources: expected a list"),  # a generator could not be read twice
])
def test_decode_refuses_what_is_not_a_list_of_parsed_sources(run: Path, sources: Any, message: str) -> None:
    loaded = seqtrans.load(run, device="cpu")
    with pytest.raises(UsageError, match=message):
        loaded.decode(sources)


@pytest.mark.parametrize(("texts", "message"), [
    ("3 1 4", r"^texts: expected a list of lines of text \(str\), got the str '3 1 4'; wrap one in a list"),
    ([[3, 1, 4]], r"^texts\[0\]: expected a line of text \(str\), got a list \(\[3, 1, 4\]\); predict takes "
                  r"lines of text; give parsed sources to decode\(sources\)"),
    (["1", 2], r"^texts\[1\]: expected a line of text \(str\), got an int \(2\)"),
    ([None], r"^texts\[0\]: expected a line of text \(str\), got None"),
    (5, r"^texts: expected a list of lines of text \(str\), got an int \(5\)$"),
])
def test_predict_and_parse_refuse_what_is_not_a_list_of_text(run: Path, texts: Any, message: str) -> None:
    loaded = seqtrans.load(run, device="cpu")
    with pytest.raises(UsageError, match=message):
        loaded.predict(texts)
    with pytest.raises(UsageError, match=message.split(";")[0].replace("predict", "parse")):
        loaded.parse(texts)


def test_the_top_level_predict_refuses_one_line_given_bare(run: Path) -> None:
    loaded = seqtrans.load(run, device="cpu")
    with pytest.raises(UsageError, match=r"^lines: expected an iterable of lines of text, got the str '3 1'"):
        seqtrans.predict(loaded, "3 1")
    assert list(seqtrans.predict(loaded, ["3 1"])) == loaded.predict(["3 1"])


class _TextTask:
    """A task whose parsed sources are their text, as translation's are."""

    def parse_source(self, line: str) -> str:
        return line


class _TextCodec:
    vocabularies = Vocabularies(Vocab(["a", "b"]), Vocab(["a", "b"]))

    def source_tokens(self, source: str) -> list[str]:
        return source.split()


def test_text_is_a_parsed_source_where_the_task_reads_a_line_as_itself() -> None:
    task, codec = _TextTask(), _TextCodec()
    assert check_sources(task, codec, ["a b", "b"]) == ["a b", "b"]  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"^sources\[1\]: a list \(\['a'\]\) is not a source of this task"):
        check_sources(task, codec, ["a", ["a"]])  # type: ignore[arg-type]


def test_scoring_lists_of_lines_equals_scoring_the_same_lines_in_files(run: Path, tmp_path: Path) -> None:
    sources, targets = ["0 1 2", "3", "5 4 3 2 1 0", "1 1"], ["0 1 2", "3 3 4 5", "5", "1 1"]
    (tmp_path / "src.txt").write_text("".join(s + "\n" for s in sources))
    (tmp_path / "tgt.txt").write_text("".join(t + "\n" for t in targets))
    loaded = seqtrans.load(run, device="cpu")
    from_files = score_files(loaded, tmp_path / "src.txt", tmp_path / "tgt.txt")
    assert loaded.score(sources, targets) == from_files
    assert all(isinstance(s, seqtrans.PairScore) for s in from_files)
    _, hyps = loaded.decode(loaded.parse(sources))  # a hypothesis scores what the search reported
    best = [nbest[0] for nbest in hyps]
    got = loaded.score(sources, [str(h.text) for h in best])
    assert [s.log_prob for s in got] == pytest.approx([h.log_prob for h in best], abs=1e-4)


@pytest.mark.parametrize(("sources", "targets", "error", "message"), [
    ("0 1", ["0 1"], UsageError, r"^sources: expected a list of lines of text \(str\), got the str '0 1'"),
    (["0 1"], [[0, 1]], UsageError, r"^targets\[0\]: expected a line of text \(str\), got a list"),
    (["0 1", "2"], ["0 1"], UsageError, r"^sources and targets: 2 sources and 1 targets"),
    (["0 1", "2"], ["0 1", " "], DataError, r"^targets\[1\]: empty line"),
])
def test_scoring_lists_refuses_what_is_not_pairs_of_lines(run: Path, sources: Any, targets: Any,
                                                          error: type[Exception], message: str) -> None:
    loaded = seqtrans.load(run, device="cpu")
    with pytest.raises(error, match=message):
        loaded.score(sources, targets)


def test_target_ids_read_a_line_as_the_task_reads_a_target(run: Path) -> None:
    loaded = seqtrans.load(run, device="cpu")
    assert loaded.target_ids("9 9 0") == [13, 13, 4]  # copy symbol s is id s + 4
    _, hyps = loaded.decode(loaded.parse(["3 1 4"]), prefixes=[loaded.target_ids("7 7")])
    assert str(hyps[0][0].text).startswith("7 7")
    with pytest.raises(UsageError, match=r"^text '12': 1 token\(s\) not in the model's target vocabulary"):
        loaded.target_ids("12")
    with pytest.raises(UsageError, match=r"^text: expected a line of text \(str\), got a list"):
        loaded.target_ids([9, 9])  # type: ignore[arg-type]
