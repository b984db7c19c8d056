"""Bad input to the parallel-text readers, much of it drawn by hypothesis: whatever the
bytes, reading ends in lines or in a DataError naming the file and line; lines come back
exactly as written; parallel files pair up line by line or name both counts."""

from __future__ import annotations

import gzip
import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqtrans.plugin import DataError
from seqtrans_translation import TranslationConfig, TranslationTask
from seqtrans_translation.readers import TextFile, read_lines, read_parallel, read_sentences, read_tsv

# The properties write files; the temporary directory is shared by the examples.
PROPERTY = settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])

# A line as it can be written: any text without a line feed and not ending in a carriage
# return (which a CRLF file would take for its line end).
LINE = st.text(st.characters(exclude_characters="\n", exclude_categories=("Cs",)), max_size=12).filter(
    lambda t: not t.endswith("\r"))
PIECES = st.sampled_from([b"a", b" ", b"\t", b"\n", b"\r\n", b"\xef\xbb\xbf", b"\xff", b"\xc3", b"\xc3\xa4",
                          b"\x1f\x8b", b"<seg id=1>", b"</seg>"])
BYTES = st.lists(PIECES | st.binary(max_size=4), max_size=30).map(b"".join)


def _write(path: Path, data: bytes, *, gz: bool = False) -> Path:
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


@PROPERTY
@given(lines=st.lists(LINE, max_size=6), end=st.sampled_from(["\n", "\r\n"]), final=st.booleans(),
       bom=st.booleans(), gz=st.booleans())
def test_written_lines_read_back_exactly(tmp_path: Path, lines: list[str], end: str, final: bool, bom: bool,
                                         gz: bool) -> None:
    text = end.join(lines) + (end if final and lines else "")
    path = _write(tmp_path / "lines", (b"\xef\xbb\xbf" if bom else b"") + text.encode(), gz=gz)
    expected = lines[:-1] if lines and not final and lines[-1] == "" else lines
    assert list(read_lines(path)) == list(enumerate(expected, 1))


@PROPERTY
@given(data=BYTES, how=st.sampled_from(["plain", "gzip", "cut gzip"]), sgm=st.booleans())
def test_any_bytes_give_lines_or_an_error_naming_file_and_line(tmp_path: Path, data: bytes, how: str,
                                                               sgm: bool) -> None:
    packed = gzip.compress(data, mtime=0)
    raw = {"plain": data, "gzip": packed, "cut gzip": packed[: len(packed) // 2]}[how]
    path = _write(tmp_path / ("any.sgm" if sgm else "any.txt"), raw)
    lines = data.count(b"\n") + 1
    try:
        read = list(read_sentences(TextFile.of(path)))
    except DataError as err:
        assert err.path == path and err.line is not None and 1 <= err.line <= lines
        assert str(err) == f"{path}:{err.line}: {err.problem}"
    else:
        assert all(1 <= n <= lines and "\n" not in text for n, text in read)
        body = data.removeprefix(b"\xef\xbb\xbf")
        if how == "plain" and not sgm and not data.startswith(b"\x1f\x8b"):  # every line, none made up
            assert len(read) == body.count(b"\n") + (bool(body) and not body.endswith(b"\n"))


@PROPERTY
@given(source=st.lists(LINE, max_size=5), target=st.lists(LINE, max_size=5), gz=st.booleans())
def test_parallel_files_pair_line_by_line_or_name_both_counts(tmp_path: Path, source: list[str],
                                                              target: list[str], gz: bool) -> None:
    src = _write(tmp_path / "train.en", "".join(s + "\n" for s in source).encode())
    tgt = _write(tmp_path / "train.de", "".join(t + "\n" for t in target).encode(), gz=gz)
    try:
        pairs = list(read_parallel(TextFile.of(src), TextFile.of(tgt)))
    except DataError as err:
        assert len(source) != len(target)
        assert str(err) == (f"{src}: has {len(source)} lines but its target file {tgt} has {len(target)}; "
                            "they must be aligned line by line")
    else:
        assert [(e.source, e.target) for e in pairs] == list(zip(source, target))
        assert [e.origin for e in pairs] == [f"{src}:{n}" for n in range(1, len(source) + 1)]


@PROPERTY
@given(lines=st.lists(st.lists(LINE.filter(lambda t: "\t" not in t), min_size=1, max_size=3), max_size=5))
def test_tsv_lines_are_pairs_or_an_error_naming_the_line(tmp_path: Path, lines: list[list[str]]) -> None:
    path = _write(tmp_path / "pairs.tsv", "".join("\t".join(fields) + "\n" for fields in lines).encode())
    good = list(itertools.takewhile(lambda fields: len(fields) == 2, lines))
    try:
        pairs = list(read_tsv(path))
    except DataError as err:
        assert err.line == len(good) + 1
        assert str(err) == (f"{path}:{err.line}: expected 2 tab-separated fields (source, target), "
                            f"found {len(lines[len(good)])}")
    else:
        assert [[e.source, e.target] for e in pairs] == lines


# ---------------------------------------------------------------- named cases


def test_a_byte_order_mark_is_not_part_of_the_first_sentence(tmp_path: Path) -> None:
    src = _write(tmp_path / "s.en", "\ufeffHello .\r\nAgain .\r\n".encode())
    tgt = _write(tmp_path / "t.de", "\ufeffHallo .\nNochmal .\n".encode(), gz=True)
    pairs = [(e.source, e.target) for e in read_parallel(TextFile.of(src), TextFile.of(tgt))]
    assert pairs == [("Hello .", "Hallo ."), ("Again .", "Nochmal .")]
    # only at the start of the file: elsewhere it is text
    assert list(read_lines(_write(tmp_path / "m", "a\n\ufeffb\n".encode()))) == [(1, "a"), (2, "\ufeffb")]


def test_an_empty_training_set_names_its_files(tmp_path: Path) -> None:
    (tmp_path / "s").write_text("")
    (tmp_path / "t").write_text("\n\n")
    (tmp_path / "t1").write_text("")
    empty = TranslationTask(TranslationConfig(dataset="none", train_src=str(tmp_path / "s"),
                                              train_tgt=str(tmp_path / "t1")))
    with pytest.raises(DataError, match=rf"^{tmp_path / 's'} \(with {tmp_path / 't1'}\): holds no training "
                                        "text to learn subwords from$"):
        empty.build_vocabulary(tmp_path / "vocab", [])
    blank = TranslationTask(TranslationConfig(dataset="none", train_tsv=str(tmp_path / "t")))
    with pytest.raises(DataError, match=rf"^{tmp_path / 't'}: holds no training text"):
        blank.build_vocabulary(tmp_path / "vocab", [])
