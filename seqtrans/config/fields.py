"""What every section of the configuration is made of: a field with its default and
help text (:func:`option`), and the precisions training and decoding take."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from seqtrans.errors import ConfigError


def option(default: Any, help: str) -> Any:
    """A dataclass field with its default and the help text the CLI and docs show."""
    return field(default=default, metadata={"help": help})



#: Precisions that both training and decoding take.
PRECISIONS = ("fp32", "bf16")


def check_precision(key: str, value: str, allowed: tuple[str, ...] = PRECISIONS) -> None:
    """A :class:`ConfigError` naming ``key`` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ConfigError(key, f"must be one of {', '.join(allowed)}, got {value!r}")
