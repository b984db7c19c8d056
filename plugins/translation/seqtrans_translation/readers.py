"""Reading parallel text: one file per language (plain or gzipped, one sentence a line),
tab-separated pairs, or the SGML test sets of WMT.

Lines are kept exactly as written, only their line end (``\\n`` or ``\\r\\n``) and a
byte-order mark at the start of the file removed: the references that metrics compare
against are the raw text. Every problem is a
:class:`~seqtrans.plugin.DataError` naming the file and, where there is one, the line.
"""

from __future__ import annotations

import gzip
import itertools
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from seqtrans.plugin import DataError, Example

_GZIP_MAGIC = b"\x1f\x8b"
_BOM = "\ufeff".encode()
_SEG = re.compile(r"<seg[^>]*>(.*)</seg>")
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class TextFile:
    """A file of sentences: plain text (gzipped or not), or WMT SGML (``<seg>`` lines)."""

    path: Path
    sgm: bool = False

    @classmethod
    def of(cls, path: str | Path) -> TextFile:
        path = Path(path)
        return cls(path, sgm=path.suffix == ".sgm")


def _open(path: Path) -> BinaryIO:
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise DataError(path, None, "no such file") from None
    except OSError as exc:
        raise DataError(path, None, f"cannot read: {exc.strerror}") from None
    if f.read(2) == _GZIP_MAGIC:  # gzipped, whatever the name says
        f.seek(0)
        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    f.seek(0)
    return f


def read_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of every line of a plain or gzipped UTF-8 file."""
    path = Path(path)
    with _open(path) as f:
        number = 0
        try:
            for number, raw in enumerate(f, 1):
                if number == 1 and raw.startswith(_BOM):  # an editor's mark, not part of the sentence
                    raw = raw[len(_BOM):]
                    if not raw:  # the mark alone is no line
                        break
                if raw.endswith(b"\n"):
                    raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise DataError(path, number, f"invalid UTF-8 at byte {exc.start + 1} of the line "
                                                  f"({raw[exc.start:exc.start + 4]!r})") from None
                yield number, text
        except (OSError, EOFError, zlib.error) as exc:  # a damaged or truncated gzip file
            raise DataError(path, number + 1, f"cannot read the compressed file: {exc}") from None


def read_sentences(file: TextFile) -> Iterator[tuple[int, str]]:
    """``(line number, sentence)``: every line of a text file, or every ``<seg>`` of an
    SGML file, its white space stripped and runs of it collapsed, as sacreBLEU reads them."""
    if not file.sgm:
        yield from read_lines(file.path)
        return
    for number, line in read_lines(file.path):
        if line.startswith("<seg "):
            match = _SEG.search(line)
            if match is None:
                raise DataError(file.path, number, "a <seg> line without its closing </seg>")
            yield number, _SPACES.sub(" ", match.group(1).strip())


def _count_rest(lines: Iterator[tuple[int, str]], counted: int) -> int:
    return counted + sum(1 for _ in lines)


def read_parallel(source: TextFile, target: TextFile) -> Iterator[Example[str, str]]:
    """Aligned examples of a source and a target file, line by line.

    Files of different lengths are an error naming both files and both counts.
    """
    src_lines, tgt_lines = read_sentences(source), read_sentences(target)
    n = 0
    for src, tgt in itertools.zip_longest(src_lines, tgt_lines):
        if src is None or tgt is None:
            n_src = n if src is None else _count_rest(src_lines, n + 1)
            n_tgt = n if tgt is None else _count_rest(tgt_lines, n + 1)
            what = "segments" if source.sgm or target.sgm else "lines"
            raise DataError(source.path, None, f"has {n_src} {what} but its target file {target.path} "
                                               f"has {n_tgt}; they must be aligned {what[:-1]} by "
                                               f"{what[:-1]}")
        n += 1
        yield Example(src[1], tgt[1], origin=f"{source.path}:{src[0]}")


def read_tsv(path: str | Path) -> Iterator[Example[str, str]]:
    """Examples from ``source<TAB>target`` lines."""
    path = Path(path)
    for number, line in read_lines(path):
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataError(path, number, f"expected 2 tab-separated fields (source, target), "
                                          f"found {len(fields)}")
        yield Example(fields[0], fields[1], origin=f"{path}:{number}")


def join_examples(examples: Iterable[Example[str, str]], lines: int) -> Iterator[Example[str, str]]:
    """Documents of ``lines`` consecutive examples, each side's texts joined by a space, in
    order; the last holds what remains (fewer lines). Its origin is its first line's."""
    if lines < 1:
        raise ValueError(f"lines must be at least 1, got {lines}")
    if lines == 1:
        yield from examples
        return
    stream = iter(examples)
    while chunk := list(itertools.islice(stream, lines)):
        yield Example(" ".join(e.source for e in chunk), " ".join(e.target for e in chunk),
                      origin=f"{chunk[0].origin} ({len(chunk)} lines)")
