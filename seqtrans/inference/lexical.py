"""Lexical constraints given as text: the phrases of ``predict --constraints`` (one JSON
line per input line), read as the task reads a target (:mod:`.phrases`) and encoded with
the loaded model's target vocabulary (:mod:`seqtrans.decoding.lexical` searches them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from seqtrans.decoding.ensemble import position_limit
from seqtrans.decoding.generate import max_output_length
from seqtrans.decoding.lexical import required_problem, total_tokens
from seqtrans.errors import DataError
from seqtrans.inference.loaded import Loaded
from seqtrans.inference.phrases import Unreadable, target_ids

KEYS = ("required", "banned")


def loaded_target_ids(loaded: Loaded, text: str, *, what: str, name: str, number: int) -> list[int]:
    """:func:`target_ids` with the loaded run's task and codec; a :class:`DataError`
    naming ``name:number`` and ``what`` the text is."""
    try:
        return target_ids(loaded.task, loaded.codec, text)
    except Unreadable as exc:
        raise DataError(name, number, f"{what}: {exc}") from None



@dataclass
class LineConstraints:
    """The required and banned phrases of one input line (target ids)."""

    required: list[list[int]]
    banned: list[list[int]]


class ConstraintLines:
    """The lines of a constraints file, taken one per input line: each a JSON object
    ``{"required": [phrase, ...], "banned": [phrase, ...]}`` (either key may be left out;
    an empty line has no constraints), each phrase a target text."""

    def __init__(self, lines: Iterable[str], name: str) -> None:
        self.lines = iter(lines)
        self.name = name
        self.number = 0

    def take(self, loaded: Loaded, source_ids: Sequence[int], prefix: Sequence[int]) -> LineConstraints:
        """The constraints of the next input line, whose source ids (with the end symbol)
        and forced prefix are given; a :class:`DataError` naming this file and line when
        they cannot be read or searched."""
        self.number += 1
        line = next(self.lines, None)
        if line is None:
            raise DataError(self.name, self.number, "no line for this input (the file has fewer lines than "
                            "the input)")
        fields = self._fields(line.strip())
        required, banned = ([self._ids(loaded, key, text) for text in fields.get(key, [])] for key in KEYS)
        out = LineConstraints(required, banned)
        if any(not phrase for phrase in out.required + out.banned):
            raise DataError(self.name, self.number, "a phrase has no tokens")
        decode = loaded.config.decode
        if out.required and decode.sample:
            raise DataError(self.name, self.number, "required phrases need a search, not sampling "
                            "(decode.sample)")
        if out.required:
            limit = position_limit(loaded.searcher)
            length = max(max_output_length(len(source_ids) - 1, decode, limit=limit), len(prefix))
            problem = required_problem(out.required, beam=decode.beam, max_len=length)
            if problem is not None:
                keys = "decode.beam" if total_tokens(out.required) > decode.beam else "decode.max_len_a/b"
                raise DataError(self.name, self.number, f"{problem} ({keys})")
        return out

    def finish(self) -> None:
        """A :class:`DataError` if the file has lines left after the last input line."""
        if next(self.lines, None) is not None:
            raise DataError(self.name, self.number + 1, "more lines than the input")

    def _ids(self, loaded: Loaded, key: str, text: str) -> list[int]:
        return loaded_target_ids(loaded, text, what=f"{key} phrase {text!r}", name=self.name,
                                 number=self.number)

    def _fields(self, line: str) -> dict[str, list[str]]:
        if not line:
            return {}
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(self.name, self.number, f"not JSON: {exc.msg} at column {exc.colno}") from None
        if not isinstance(record, dict):
            raise DataError(self.name, self.number, "expected a JSON object with 'required' and/or 'banned'")
        unknown = sorted(set(record) - set(KEYS))
        if unknown:
            raise DataError(self.name, self.number, f"unknown key(s) {unknown}; expected 'required' and/or "
                            "'banned'")
        for key, value in record.items():
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise DataError(self.name, self.number, f"'{key}' must be a list of strings")
        return record
