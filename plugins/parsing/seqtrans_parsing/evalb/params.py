"""EVALB's parameter (``.prm``) files: :class:`Parameters`, :data:`COLLINS`, and the reader,
with the warnings the reference program prints on stderr."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from seqtrans.plugin import DataError

__all__ = ["COLLINS", "Parameters", "parse_parameters", "read_parameters"]


@dataclass(frozen=True)
class Parameters:
    """The settings of a ``.prm`` file; the defaults are the program's own (no file)."""

    debug: int = 0
    max_error: int = 10
    cutoff_len: int = 40
    labeled: bool = True
    delete_labels: tuple[str, ...] = ()
    delete_labels_for_length: tuple[str, ...] = ()
    quote_labels: tuple[str, ...] = ()
    eq_labels: tuple[tuple[str, str], ...] = ()
    eq_words: tuple[tuple[str, str], ...] = ()


#: ``COLLINS.prm``, the standard setting for Penn Treebank results.
COLLINS = Parameters(
    debug=0, max_error=10, cutoff_len=40, labeled=True,
    delete_labels=("TOP", "-NONE-", ",", ":", "``", "''", "."),
    delete_labels_for_length=("-NONE-",),
    eq_labels=(("ADVP", "PRT"),),
)

C_SPACE = " \t\n\v\f\r"  # isspace() in the C locale
SPACE = "[ \t\n\v\f\r]"


def _atoi(text: str) -> int:
    """C's atoi as glibc has it, ``(int) strtol(text, NULL, 10)``: leading white space, an
    optional sign, ASCII digits; 0 when there are none; a value past a 64-bit long is
    saturated, then cut to 32 bits (so any number of digits is read, none raises)."""
    m = re.match(r"[ \t\n\v\f\r]*([+-]?)([0-9]+)", text)
    if not m:
        return 0
    digits = m.group(2).lstrip("0")[:20] or "0"  # 20 digits already saturate
    value = -int(digits) if m.group(1) == "-" else int(digits)
    value = max(-(1 << 63), min(value, (1 << 63) - 1))
    return (value + (1 << 31)) % (1 << 32) - (1 << 31)


def _keyword(line: str, key: str) -> bool:
    return line.startswith(key) and (len(line) == len(key) or line[len(key)] in C_SPACE)


def parse_parameters(text: str, *, base: Parameters | None = None) -> tuple[Parameters, list[str]]:
    """Read the text of a ``.prm`` file on top of ``base``: the parameters and the
    warnings the reference program prints on stderr (unknown keywords, empty values)."""
    p = base or Parameters()
    warnings: list[str] = []
    lists: dict[str, list] = {
        "delete_labels": list(p.delete_labels), "delete_labels_for_length": list(p.delete_labels_for_length),
        "quote_labels": list(p.quote_labels), "eq_labels": list(p.eq_labels), "eq_words": list(p.eq_words),
    }
    scalars = {"debug": p.debug, "max_error": p.max_error, "cutoff_len": p.cutoff_len, "labeled": p.labeled}
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw[:1] + raw[1:].rstrip(C_SPACE)
        if line.startswith("#") or len(line) < 3:
            continue
        i = 0
        while i < len(line) and line[i] not in C_SPACE:
            i += 1
        while i < len(line) and line[i] in C_SPACE:
            i += 1
        value = line[i:]
        if not value:
            warnings.append(f"Empty value in parameter file ({number})\n")
        if _keyword(line, "DEBUG"):
            scalars["debug"] = _atoi(value)
        elif _keyword(line, "MAX_ERROR"):
            scalars["max_error"] = _atoi(value)
        elif _keyword(line, "CUTOFF_LEN"):
            scalars["cutoff_len"] = _atoi(value)
        elif _keyword(line, "LABELED"):
            scalars["labeled"] = _atoi(value) != 0
        elif _keyword(line, "DELETE_LABEL"):
            lists["delete_labels"].append(value)
        elif _keyword(line, "DELETE_LABEL_FOR_LENGTH"):
            lists["delete_labels_for_length"].append(value)
        elif _keyword(line, "QUOTE_LABEL"):
            lists["quote_labels"].append(value)
        elif _keyword(line, "EQ_LABEL") or _keyword(line, "EQ_WORD"):
            key = "eq_labels" if line.startswith("EQ_LABEL") else "eq_words"
            parts = [t for t in re.split(SPACE + "+", value) if t]
            if len(parts) != 2:
                warnings.append(f"{'EQ_LABEL' if key == 'eq_labels' else 'EQ_WORD'} requires two values\n")
                continue
            lists[key].append((parts[0], parts[1]))
        else:
            warnings.append(f"Unknown keyword ({line}) in parameter file\n")
    params = Parameters(
        debug=int(scalars["debug"]), max_error=int(scalars["max_error"]),
        cutoff_len=int(scalars["cutoff_len"]), labeled=bool(scalars["labeled"]),
        delete_labels=tuple(lists["delete_labels"]),
        delete_labels_for_length=tuple(lists["delete_labels_for_length"]),
        quote_labels=tuple(lists["quote_labels"]), eq_labels=tuple(lists["eq_labels"]),
        eq_words=tuple(lists["eq_words"]))
    return params, warnings


def read_parameters(path: str | Path, *, base: Parameters | None = None) -> tuple[Parameters, list[str]]:
    """:func:`parse_parameters` of a file; a missing file raises :class:`DataError`."""
    try:
        text = Path(path).read_bytes().decode("utf-8", "surrogateescape")
    except OSError as exc:
        raise DataError(path, None, f"cannot read the parameter file: {exc.strerror}") from None
    return parse_parameters(text, base=base)


