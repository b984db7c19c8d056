"""Where trees come from: tree files (``.mrg`` or one tree per line), the WSJ directory
layout by section, and NLTK's ``treebank`` corpus by file id.

Each reader yields ``(tree, origin)`` with ``origin`` = ``file:line``, trees as read
(before preprocessing).
"""

from __future__ import annotations

import glob
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from seqtrans.plugin import ConfigError, DataError
from seqtrans_parsing.trees import Tree, read_trees

log = logging.getLogger(__name__)

__all__ = ["read_files", "wsj_files", "nltk_fileids", "read_nltk", "parse_range"]


def parse_range(spec: str, *, key: str) -> list[int]:
    """``"02-21"`` -> [2, ..., 21]; ``"22"`` -> [22]; ``"1-139,150"`` -> [1..139, 150]."""
    out: list[int] = []
    for part in (p.strip() for p in spec.split(",")):
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not m:
            raise ConfigError(key, f"expected numbers and ranges such as '02-21' or '22', got {spec!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        if hi < lo:
            raise ConfigError(key, f"range {part!r} runs backwards")
        out.extend(range(lo, hi + 1))
    return out


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(path, None, f"cannot read: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:  # older treebanks are Latin-1; said, so that a wrong guess shows
        line = data.count(b"\n", 0, exc.start) + 1
        log.warning("%s:%d: not valid UTF-8 (%r); the whole file is read as Latin-1", path, line,
                    data[exc.start:exc.start + 4])
        return data.decode("latin-1")


def _trees_of(text: str, origin: str, *, skip: bool, skipped: list[str]) -> Iterator[tuple[Tree, str]]:
    for tree, line in read_trees(text, path=origin, skip_malformed=skip, skipped=skipped):
        yield tree, f"{origin}:{line}"


def expand(spec: str) -> list[Path]:
    """A file, a directory (its ``*.mrg`` files, recursively, else all its files) or a glob."""
    path = Path(spec).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(path.rglob("*.mrg")) or sorted(p for p in path.rglob("*") if p.is_file())
        if not files:
            raise DataError(path, None, "directory holds no tree files")
        return files
    found = sorted(Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True))
    files = [p for p in found if p.is_file()]
    if not files:
        raise DataError(spec, None, "no such file, directory or glob match")
    return files


def read_files(files: list[Path], *, skip: bool, skipped: list[str]) -> Iterator[tuple[Tree, str]]:
    for path in files:
        yield from _trees_of(_read_text(path), str(path), skip=skip, skipped=skipped)


def wsj_files(root: str, sections: list[int]) -> list[Path]:
    """The ``.mrg`` files of WSJ sections under ``root`` (``root/02/wsj_0200.mrg`` ...)."""
    base = Path(root).expanduser()
    if not base.is_dir():
        raise DataError(base, None, "WSJ root is not a directory (expected sections 00 .. 24 in it)")
    files: list[Path] = []
    for section in sections:
        directory = base / f"{section:02d}"
        found = sorted(directory.glob("*.mrg")) + sorted(directory.glob("*.MRG"))
        if not found:
            raise DataError(directory, None, f"no .mrg files for WSJ section {section:02d}")
        files.extend(found)
    return files


def _nltk_corpus(name: str, data_dir: str, download: bool) -> Any:
    import nltk

    if data_dir and data_dir not in nltk.data.path:
        nltk.data.path.insert(0, data_dir)
    corpus = getattr(nltk.corpus, name, None)
    if corpus is None:
        raise ConfigError("data.corpus", f"nltk.corpus has no corpus named {name!r}")
    where = f"corpora/{name}"
    try:
        corpus.fileids()
    except LookupError:
        searched = ", ".join(nltk.data.path)
        if not download:
            raise DataError(where, None, f"NLTK corpus {name!r} not found in NLTK's search path ({searched}; "
                            "set NLTK_DATA or data.nltk_data) and data.download is off") from None
        log.info("fetching the NLTK corpus %r with nltk.download", name)
        try:
            fetched = nltk.download(name, download_dir=data_dir or None, quiet=True, raise_on_error=True)
        except (OSError, ValueError) as exc:
            raise DataError(where, None, f"nltk.download({name!r}) failed: {exc}") from None
        if not fetched:
            raise DataError(where, None, f"nltk.download({name!r}) failed") from None
        try:
            corpus.fileids()
        except LookupError:
            raise DataError(where, None, f"NLTK corpus {name!r} still not found after nltk.download "
                            f"(searched {searched})") from None
    return corpus


def nltk_fileids(corpus: Any, numbers: list[int]) -> list[str]:
    """File ids ``wsj_NNNN.mrg`` of the corpus for the given numbers, in order."""
    wanted = set(numbers)
    ids = [f for f in corpus.fileids() if (m := re.search(r"(\d+)", f)) and int(m.group(1)) in wanted]
    if not ids:
        raise DataError(None, None,
                        f"no file of the NLTK corpus matches the numbers {numbers[0]}..{numbers[-1]}")
    return ids


def read_nltk(name: str, numbers: list[int], *, data_dir: str, download: bool, skip: bool,
              skipped: list[str]) -> Iterator[tuple[Tree, str]]:
    """Trees of NLTK's corpus ``name`` (such as ``treebank``) whose file numbers are given,
    read from the corpus's files through ``nltk.corpus`` with this module's reader."""
    corpus = _nltk_corpus(name, data_dir, download)
    for fileid in nltk_fileids(corpus, numbers):
        with corpus.open(fileid) as f:
            text = f.read()
        yield from _trees_of(text, f"{name}/{fileid}", skip=skip, skipped=skipped)
