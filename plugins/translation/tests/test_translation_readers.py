"""Parallel text readers: plain, gzipped, TSV and SGML files, and their errors."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from seqtrans.plugin import DataError
from seqtrans_translation.readers import TextFile, read_lines, read_parallel, read_sentences, read_tsv
from translation_data import MULTI30K


def _write(path: Path, data: bytes, *, gz: bool = False) -> Path:
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_plain_and_gzipped_files_read_the_same_lines_kept_as_written(tmp_path: Path) -> None:
    data = "Ein Mann fährt Rad. \r\n\n  zwei  Leerzeichen\nohne Zeilenende".encode()
    plain = _write(tmp_path / "a.txt", data)
    packed = _write(tmp_path / "a.de", data, gz=True)  # gzip is recognised by content, not name
    expected = [(1, "Ein Mann fährt Rad. "), (2, ""), (3, "  zwei  Leerzeichen"), (4, "ohne Zeilenende")]
    assert list(read_lines(plain)) == expected
    assert list(read_lines(packed)) == expected


def test_the_multi30k_german_trailing_spaces_survive_reading() -> None:
    # the shared data's README counts 40 German training lines with a trailing space
    lines = [text for _, text in read_lines(MULTI30K / "train.de.gz")]
    assert len(lines) == 29000
    assert sum(text.endswith(" ") for text in lines) == 40
    with gzip.open(MULTI30K / "train.de.gz", "rt", encoding="utf-8") as f:
        assert lines == f.read().split("\n")[:-1]


def test_parallel_files_become_aligned_examples_with_their_origin(tmp_path: Path) -> None:
    src = _write(tmp_path / "s.en", b"a b\nc\n\n")
    tgt = _write(tmp_path / "t.de", b"A B\nC\nleer\n", gz=True)
    examples = list(read_parallel(TextFile.of(src), TextFile.of(tgt)))
    assert [(e.source, e.target) for e in examples] == [("a b", "A B"), ("c", "C"), ("", "leer")]
    assert examples[2].origin == f"{src}:3"


@pytest.mark.parametrize(("n_src", "n_tgt"), [(5, 3), (3, 5), (0, 2)])
def test_different_line_counts_name_both_files_and_both_counts(tmp_path: Path, n_src: int,
                                                                n_tgt: int) -> None:
    src = _write(tmp_path / "train.en", b"x\n" * n_src)
    tgt = _write(tmp_path / "train.de", b"y\n" * n_tgt, gz=True)
    with pytest.raises(DataError) as caught:
        list(read_parallel(TextFile.of(src), TextFile.of(tgt)))
    message = str(caught.value)
    assert str(src) in message and str(tgt) in message
    assert f"has {n_src} lines" in message and f"has {n_tgt};" in message


@pytest.mark.parametrize("gz", [False, True])
def test_invalid_utf8_names_the_file_and_line(tmp_path: Path, gz: bool) -> None:
    path = _write(tmp_path / "bad.en", b"fine\nalso fine\nbroken \xff\xfe here\n", gz=gz)
    with pytest.raises(DataError) as caught:
        list(read_lines(path))
    assert caught.value.path == path and caught.value.line == 3
    assert "UTF-8" in str(caught.value) and f"{path}:3:" in str(caught.value)


def test_a_damaged_gzip_file_is_a_data_error(tmp_path: Path) -> None:
    packed = gzip.compress(b"line\n" * 10000)
    path = _write(tmp_path / "cut.gz", packed[: len(packed) // 2])
    with pytest.raises(DataError, match="compressed"):
        list(read_lines(path))
    with pytest.raises(DataError, match="no such file"):
        list(read_lines(tmp_path / "missing.gz"))


def test_tsv_pairs_and_their_errors(tmp_path: Path) -> None:
    path = _write(tmp_path / "pairs.tsv", b"a b\tA B\n\t\nc\tC\n")
    assert [(e.source, e.target) for e in read_tsv(path)] == [("a b", "A B"), ("", ""), ("c", "C")]
    bad = _write(tmp_path / "bad.tsv", b"a\tA\nno tab here\n")
    with pytest.raises(DataError, match=r"bad.tsv:2: expected 2 tab-separated fields .* found 1"):
        list(read_tsv(bad))


def test_sgml_segments_are_read_as_sacrebleu_reads_them(tmp_path: Path) -> None:
    sgm = _write(tmp_path / "newstest.de.sgm", (
        '<srcset setid="newstest2014" srclang="any">\n<doc sysid="ref" docid="1" genre="news">\n'
        '<p>\n<seg id="1"> Gutach: Mehr  Sicherheit\tfür Fußgänger </seg>\n</p>\n'
        '<seg id="2">&quot;Zwei&quot; &amp; drei</seg>\n<seg id="3"></seg>\n</doc>\n</srcset>\n').encode())
    assert list(read_sentences(TextFile.of(sgm))) == [
        (4, "Gutach: Mehr Sicherheit für Fußgänger"), (6, "&quot;Zwei&quot; &amp; drei"), (7, "")]
    broken = _write(tmp_path / "broken.sgm", b'<seg id="1">no end\n')
    with pytest.raises(DataError, match="broken.sgm:1"):
        list(read_sentences(TextFile.of(broken)))
