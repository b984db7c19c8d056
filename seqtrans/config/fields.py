"""What every section of the configuration is made of: a field with its default and
help text (:func:`option`), the lower bound its checks share (:func:`check_at_least`), and
the precisions training and decoding take."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import field
from typing import Any

from seqtrans.errors import ConfigError


def option(default: Any, help: str) -> Any:
    """A dataclass field with its default and the help text the CLI and docs show."""
    return field(default=default, metadata={"help": help})


def check_at_least(config: Any, section: str, keys: Iterable[str], lowest: int) -> None:
    """A :class:`ConfigError` naming the first of ``keys`` whose value in ``config`` (of the
    section ``section``) is below ``lowest``: "must not be negative" for 0, else "must be at
    least ``lowest``"."""
    rule = "must not be negative" if lowest == 0 else f"must be at least {lowest}"
    for key in keys:
        value = getattr(config, key)
        if value < lowest:
            raise ConfigError(f"{section}.{key}", f"{rule}, got {value}")


#: Precisions that both training and decoding take.
PRECISIONS = ("fp32", "bf16")


def check_precision(key: str, value: str, allowed: tuple[str, ...] = PRECISIONS) -> None:
    """A :class:`ConfigError` naming ``key`` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ConfigError(key, f"must be one of {', '.join(allowed)}, got {value!r}")
