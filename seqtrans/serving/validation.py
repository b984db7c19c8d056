"""What any JSON a client sends may hold, checked before a route reads it: text that is
valid Unicode, numbers that are finite and in range, and nesting of bounded depth.

Python's ``json`` reads things no route can use and some it cannot even hold: a lone
surrogate escape (``"\\ud800"``) becomes a string that cannot be encoded again, ``NaN``
and ``Infinity`` become floats that compare false with everything, an integer of more
than 4,300 digits raises ``ValueError``, and deep nesting raises ``RecursionError``.
:func:`read` turns each of these into a :class:`~seqtrans.serving.errors.RequestError`
(400 for a body that is not JSON, 422 for a value no route takes) whose message and
``field`` name where it was found (``inputs[0]``, ``alpha``). The HTTP routes and the
WebSocket read their JSON through it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from seqtrans.serving.errors import RequestError, clip

#: Arrays and objects nested deeper than this are refused (the API's bodies nest three deep).
MAX_DEPTH = 32
#: Integers beyond this magnitude are refused (no count or setting comes near it).
MAX_INTEGER = 2**63 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")


class _Unreadable:
    """A JSON value ``json`` would hold badly, kept in place so that :func:`check` can
    name where it was."""

    def __init__(self, problem: str) -> None:
        self.problem = problem


def _integer(text: str) -> int | _Unreadable:
    if len(text.lstrip("-")) > len(str(MAX_INTEGER)):  # before int(), which refuses 4,300 digits
        return _Unreadable(f"an integer of {len(text.lstrip('-'))} digits, out of range")
    return int(text)


def _float(text: str) -> float | _Unreadable:
    value = float(text)
    return value if math.isfinite(value) else _Unreadable(f"{text[:20]} is out of range")


def _constant(name: str) -> _Unreadable:
    return _Unreadable(f"{name} is not a number this server takes")


def read(data: bytes | str) -> Any:
    """The JSON value of a body or message, every string, number and nesting checked
    (:func:`check`); a :class:`RequestError` when it is not JSON (400) or holds what no
    route takes (422)."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        value = json.loads(text, parse_int=_integer, parse_float=_float, parse_constant=_constant)
    except RecursionError:
        raise _too_deep("") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError("malformed_json", f"the body is not JSON: {exc}") from None
    check(value)
    return value


def check(value: Any, field: str = "") -> None:
    """Refuse (422, naming the field) a value holding a string with a lone surrogate, a
    number that is not finite or is out of range, or nesting deeper than ``MAX_DEPTH``.
    Walks without recursion, so any depth is safe."""
    stack: list[tuple[Any, str, int]] = [(value, field, 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, str):
            check_text(item, where)
        elif isinstance(item, _Unreadable):
            raise _refused(where, item.problem)
        elif isinstance(item, bool):
            continue
        elif isinstance(item, int):
            if abs(item) > MAX_INTEGER:
                raise _refused(where, f"an integer of {len(str(abs(item)))} digits, out of range")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise _refused(where, f"{item} is not a finite number")
        elif isinstance(item, (list, dict)):
            if depth >= MAX_DEPTH:
                raise _too_deep(where)
            if isinstance(item, list):
                inner = [(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(item)]
            else:
                inner = []
                for key, x in item.items():
                    name = f"{where}.{key}" if where else key
                    check_text(key, _ascii(name))
                    inner.append((x, name, depth + 1))
            stack.extend(reversed(inner))  # the first problem in reading order is the one named


def check_text(text: str, field: str) -> None:
    """Refuse (422, naming ``field``) text that is not valid Unicode: a lone surrogate,
    which JSON's ``\\u`` escapes can make but no encoding can write."""
    found = _SURROGATE.search(text)
    if found is not None:
        raise _refused(field, f"not valid Unicode: a lone surrogate {_ascii(found.group())} at character "
                       f"{found.start()}")


def _ascii(text: str) -> str:
    return text.encode("ascii", "backslashreplace").decode("ascii")


def _refused(field: str, problem: str) -> RequestError:
    return RequestError("invalid_request", f"{clip(field)}: {problem}" if field else problem,
                        field=field or None)


def _too_deep(field: str) -> RequestError:
    return _refused(field, f"arrays or objects nested more than {MAX_DEPTH} deep")
