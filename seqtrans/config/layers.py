"""Resolving a run's configuration in layers, and turning it into JSON and docs.

Each layer overrides the last:

1. the field defaults of :mod:`.schema` (the paper's settings),
2. the task's ``defaults`` (its decoding settings, say),
3. a preset: the task's own, or one of :data:`~.schema.PRESETS`,
4. a ``--config`` file (JSON or TOML),
5. ``--set key=value`` pairs, dotted (``model.d_model=256``).

Unknown keys and values of the wrong type raise :class:`~seqtrans.errors.ConfigError`
naming the key (with a "did you mean" for a near miss).
"""

from __future__ import annotations

import dataclasses
import difflib
import html
import json
import re
import sys
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from seqtrans.config.schema import PRESETS, RunConfig
from seqtrans.config.values import coerce, type_name
from seqtrans.errors import ConfigError, UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


def to_dict(config: Any) -> Any:
    """A JSON-ready nested dict of a config dataclass (tuples become lists)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, (tuple, list)):
        return [to_dict(v) for v in config]
    return config


def same_settings(saved: Any, current: Any) -> bool:
    """Whether a saved section (a mapping from ``config.json`` or a checkpoint) holds the
    settings of the dataclass ``current``, reading it as a config of today would: options
    added since it was written take their defaults. A saved section that no longer
    reads (an option removed or retyped since) differs."""
    try:
        return bool(to_dict(from_dict(type(current), saved)) == to_dict(current))
    except ConfigError:
        return False


def _field_types(cls: type, data_cls: type | None) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    types_ = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
    if cls is RunConfig:
        types_["data"] = data_cls
    return types_


def _unknown_key(key: str, known: Iterable[str]) -> ConfigError:
    leaf = key.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(leaf, list(known), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(sorted(known))}"
    return ConfigError(key, "unknown key" + hint)


def from_dict(cls: type, values: Mapping[str, Any], *, data_cls: type | None = None,
              prefix: str = "") -> Any:
    """Build ``cls`` from a nested mapping, checking every key and value type."""
    if not isinstance(values, Mapping):
        raise ConfigError(prefix.rstrip(".") or "<root>", f"expected a table of keys, got {values!r}")
    types_ = _field_types(cls, data_cls)
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        dotted = prefix + key
        if key not in types_:
            raise _unknown_key(dotted, types_)
        tp: Any = types_[key]
        if tp is None:
            raise ConfigError(dotted, "this task has no options")
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            kwargs[key] = from_dict(tp, value, data_cls=data_cls, prefix=dotted + ".")
        else:
            kwargs[key] = coerce(value, tp, dotted)
    if cls is RunConfig and "data" not in kwargs and data_cls is not None:
        kwargs["data"] = data_cls()
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field of a task's config is missing
        raise ConfigError(prefix.rstrip(".") or "<root>", str(exc)) from None


def merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Nested merge: tables merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def parse_overrides(pairs: Iterable[str], *, data_cls: type | None) -> dict[str, Any]:
    """Turn ``["model.d_model=256", ...]`` into a nested dict of typed values."""
    tree: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise UsageError(f"--set expects key=value, got {pair!r}")
        key, text = pair.split("=", 1)
        key = key.strip()
        parts = key.split(".")
        cls: Any = RunConfig
        node = tree
        for i, part in enumerate(parts):
            dotted = ".".join(parts[: i + 1])
            if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
                raise ConfigError(dotted, f"'{'.'.join(parts[:i])}' is not a section")
            types_ = _field_types(cls, data_cls)
            if part not in types_:
                raise _unknown_key(dotted, types_)
            cls = types_[part]
            if i < len(parts) - 1:
                node = node.setdefault(part, {})
        if dataclasses.is_dataclass(cls):
            raise ConfigError(key, "is a section; set one of its keys, e.g. " f"{key}.<key>=...")
        node[parts[-1]] = coerce(text.strip(), cls, key, text=True)
    return tree


def load_file(path: str | Path) -> dict[str, Any]:
    """Read a JSON or TOML config file into a nested dict."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read config file: {exc.strerror}") from None
    try:
        if path.suffix == ".toml":
            loaded = tomllib.loads(raw.decode("utf-8"))
        else:
            loaded = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not valid {'TOML' if path.suffix == '.toml' else 'JSON'}: {exc}") from None
    except RecursionError:  # both parsers recurse per level of nesting
        raise UsageError(f"{path}: not a config file: its arrays or tables nest too deeply") from None
    if not isinstance(loaded, dict):
        raise UsageError(f"{path}: expected a table of config sections")
    return loaded


def preset_names(task_presets: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return sorted(set(task_presets) | set(PRESETS))


def resolve(
    task_name: str,
    *,
    data_cls: type | None,
    task_defaults: Mapping[str, Any] = {},
    task_presets: Mapping[str, Mapping[str, Any]] = {},
    preset: str | None = None,
    config_file: str | Path | None = None,
    overrides: Iterable[str] = (),
) -> RunConfig:
    """Resolve a run's configuration through the layers described in the module docstring.

    With no ``preset``, the task's preset named ``default`` applies where it has one.
    """
    tree: dict[str, Any] = merge({}, task_defaults)
    if preset is None and "default" in task_presets:
        preset = "default"
    if preset is not None:
        if preset in task_presets:
            tree = merge(tree, task_presets[preset])
        elif preset in PRESETS:
            tree = merge(tree, PRESETS[preset])
        else:
            raise UsageError(
                f"unknown preset '{preset}' for task '{task_name}'; "
                f"available: {', '.join(preset_names(task_presets))}"
            )
    if config_file is not None:
        loaded = load_file(config_file)
        if loaded.get("task", task_name) != task_name:
            raise UsageError(f"{config_file}: is a config for task '{loaded['task']}', not '{task_name}'")
        tree = merge(tree, loaded)
    tree = merge(tree, parse_overrides(overrides, data_cls=data_cls))
    if tree.get("task", task_name) != task_name:  # the command names the task; a config cannot switch it
        raise ConfigError("task", f"is {tree['task']!r}, but the command runs the task '{task_name}'")
    tree["task"] = task_name
    if data_cls is None:
        tree.pop("data", None)
    return from_dict(RunConfig, tree, data_cls=data_cls)


def describe(config: Any, *, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """``(key, type, value, help)`` for every leaf option of a resolved config.

    ``seqtrans config`` and the generated docs print this, so the help text lives once.
    """
    rows = []
    data_cls = type(config.data) if isinstance(config, RunConfig) and config.data is not None else None
    types_ = _field_types(type(config), data_cls)
    for f in dataclasses.fields(config):
        tp = types_[f.name]
        value = getattr(config, f.name)
        if tp is None:
            continue
        if dataclasses.is_dataclass(tp):
            rows += describe(value, prefix=prefix + f.name + ".")
        else:
            rows.append((prefix + f.name, type_name(tp), value, f.metadata.get("help", "")))
    return rows


def markdown_text(text: str) -> str:
    """Plain ``text`` (a help string) for Markdown, shown as written: ``<``, ``>`` and ``&``
    escaped outside code spans, since Markdown passes ``<TAB>`` or ``</s>`` on as an HTML tag,
    which a browser hides."""
    parts = re.split(r"(`[^`]*`)", text)  # odd parts are code spans, shown as they are
    return "".join(part if i % 2 else html.escape(part, quote=False) for i, part in enumerate(parts))


def markdown_table(config: Any, *, prefix: str = "") -> str:
    """A Markdown table of every option of ``config``: key, type, value, help."""
    lines = ["| key | type | default | help |", "|---|---|---|---|"]
    for key, kind, value, help_text in describe(config, prefix=prefix):
        shown = json.dumps(to_dict(value))
        cell = markdown_text(help_text).replace("|", "\\|")  # a bare | would end the cell
        lines.append(f"| `{key}` | {kind.replace('|', '/')} | `{shown}` | {cell} |")
    return "\n".join(lines) + "\n"

