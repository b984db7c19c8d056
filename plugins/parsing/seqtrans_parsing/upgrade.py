"""Runs saved before the parsing task's model-side parts moved into the plugin.

seqtrans 0.1.0 kept the cursors and the word-vector input in the engine: their settings
were ``model.source_cursor``, ``model.span_cursor`` and ``model.source_vectors``, and their
weights ``cursor.*``, ``span_cursor.*`` and ``vectors.*``. They are now the task's own
(``data.source_cursor``, ``data.span_cursor``; the vectors are fed whenever
``data.word_vectors`` names some) and the weights of its model extensions
(``extensions.NAME.*``).
"""

from __future__ import annotations

from typing import Any

# earlier weight prefixes -> the extensions' names
_WEIGHTS = {"cursor.": "extensions.source_cursor.", "span_cursor.": "extensions.span_cursor.",
            "vectors.": "extensions.source_vectors."}


def upgrade(config: dict[str, Any], weights: dict[str, Any]) -> list[str]:
    """Convert a saved run config and checkpoint weights in place; a line per change."""
    changes: list[str] = []
    model = config.get("model")
    data = config.setdefault("data", {})
    if isinstance(model, dict):
        for key in ("source_cursor", "span_cursor"):
            if key in model:
                on = bool(model.pop(key))
                data[key] = on
                changes.append(f"model.{key}={str(on).lower()} is now data.{key}")
        if "source_vectors" in model:
            on = bool(model.pop("source_vectors"))
            if not on and data.get("word_vectors"):
                # the vectors were read but never fed to the model: now naming them feeds them
                changes.append(f"data.word_vectors={data['word_vectors']} dropped: model.source_vectors was "
                               "off, and naming word vectors now feeds them to the encoder")
                data["word_vectors"] = ""
            else:
                changes.append(f"model.source_vectors={str(on).lower()} dropped: data.word_vectors alone "
                               "decides")
    for name in list(weights):
        for old, new in _WEIGHTS.items():
            if name.startswith(old):
                weights[new + name[len(old):]] = weights.pop(name)
                changes.append(f"weight {name} is now {new}{name[len(old):]}")
                break
    return changes
