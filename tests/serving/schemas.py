"""JSON Schema (draft 2020-12, OpenAPI 3.1's) validation for the keywords the server's
OpenAPI description uses; a schema with any other keyword is an error, so that a schema
this cannot judge never passes. Used by ``test_schema.py``."""

from __future__ import annotations

from typing import Any

KEYWORDS = {"type", "enum", "properties", "required", "additionalProperties", "minProperties", "items",
            "minItems", "maxItems", "minimum", "maximum", "description", "default"}


def _is(value: Any, kind: str) -> bool:
    """Whether ``value`` (as Python's json reads JSON) is of the JSON Schema type ``kind``."""
    if kind in ("number", "integer"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return kind == "number" or isinstance(value, int) or value.is_integer()  # 2.0 is an integer
    kinds = {"null": type(None), "boolean": bool, "string": str, "array": list, "object": dict}
    return isinstance(value, kinds[kind])


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1, 1 is 1.0."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return type(a) is type(b) and a == b
    return bool(a == b)


def problems(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """What makes ``value`` invalid by ``schema`` (nothing: valid)."""
    unknown = set(schema) - KEYWORDS
    if unknown:
        raise ValueError(f"{where}: keywords this validator does not know: {sorted(unknown)}")
    if "enum" in schema and not any(_equal(value, e) for e in schema["enum"]):
        return [f"{where}: {value!r} is not one of {schema['enum']}"]
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is(value, k) for k in kinds):
            return [f"{where}: {value!r} is not of type {kinds}"]
    found: list[str] = []
    if isinstance(value, dict):
        found += _object(value, schema, where)
    elif isinstance(value, list):
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value)):
            found.append(f"{where}: {len(value)} items")
        for i, item in enumerate(value):
            found += problems(item, schema.get("items", {}), f"{where}[{i}]")
    elif _is(value, "number"):
        if value < schema.get("minimum", value) or value > schema.get("maximum", value):
            found.append(f"{where}: {value} is out of range")
    return found


def _object(value: dict[str, Any], schema: dict[str, Any], where: str) -> list[str]:
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    if not isinstance(extra, bool):
        raise ValueError(f"{where}: additionalProperties other than true or false")
    found = [f"{where}: no {name!r}" for name in schema.get("required", ()) if name not in value]
    if not extra:
        found += [f"{where}: unknown {name!r}" for name in value if name not in properties]
    if len(value) < schema.get("minProperties", 0):
        found.append(f"{where}: fewer than {schema['minProperties']} properties")
    for name, item in value.items():
        if name in properties:
            found += problems(item, properties[name], f"{where}.{name}")
    return found


def is_valid(value: Any, schema: dict[str, Any]) -> bool:
    return not problems(value, schema)


def validate(value: Any, schema: dict[str, Any]) -> None:
    """Raise ``AssertionError`` listing what makes ``value`` invalid by ``schema``."""
    found = problems(value, schema)
    assert not found, found
