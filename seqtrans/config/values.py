"""Config values checked against their field's type, through one dispatcher: values
parsed from JSON or TOML are checked (an integer widened to a float where a float is
expected); the text of ``--set key=value`` is cast first."""

from __future__ import annotations

import math
import types
import typing
from typing import Any, Literal

from seqtrans.errors import ConfigError

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def type_name(tp: Any) -> str:
    """How a field's type reads in messages and docs."""
    if typing.get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def coerce(value: Any, tp: Any, key: str, *, text: bool = False) -> Any:
    """``value`` as a value of type ``tp`` for the key ``key``; with ``text``, ``value`` is
    the text of ``--set key=value``. A wrong value raises :class:`ConfigError`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and (value is None or text and value.lower() in ("none", "null")):
            return None
        for arg in args:
            if arg is not type(None):
                try:
                    return coerce(value, arg, key, text=text)
                except ConfigError:
                    pass
        raise ConfigError(key, f"expected {type_name(tp)}, got {value!r}")
    if origin is tuple:
        return _tuple(value, args, key, text=text)
    if origin is Literal:
        if value not in args:
            raise ConfigError(key, f"must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if text:
        value = _cast(value, tp, key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, f"expected a number, got {value!r}")
        number = float(value) if isinstance(value, float) or abs(value) < 2**1023 else math.inf
        if not math.isfinite(number):  # NaN passes every range check; no option means infinity
            raise ConfigError(key, f"expected a finite number, got {value!r}")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a string, got {value!r}")
        return value
    raise ConfigError(key, f"unsupported option type {tp!r}")  # pragma: no cover


def _tuple(value: Any, args: tuple[Any, ...], key: str, *, text: bool) -> tuple[Any, ...]:
    if text:  # "0.9,0.98", "(0.9, 0.98)" or "[0.9, 0.98]"
        value = [p.strip() for p in value.strip("()[] ").split(",") if p.strip()]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(key, f"expected a list of {len(args)} values, got {value!r}")
    item_types = [args[0]] * len(value) if args and args[-1] is Ellipsis else list(args)
    if len(item_types) != len(value):
        raise ConfigError(key, f"expected {len(item_types)} values, got {len(value)}")
    return tuple(coerce(v, t, key, text=text) for v, t in zip(value, item_types))


def _cast(text: str, tp: Any, key: str) -> Any:
    """The value the text of ``--set`` stands for, by the field's scalar type."""
    if tp is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ConfigError(key, f"expected true or false, got {text!r}")
    if tp is int:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(key, f"expected an integer, got {text!r}") from None
    if tp is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(key, f"expected a number, got {text!r}") from None
    return text
