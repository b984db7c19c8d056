"""What requests and answers are declared in: a JSON :class:`Type`, a :class:`Field` of an
object (its type, limits, default and description) and a :class:`Message` (an object of
fields). One declaration both reads what a client sent (:meth:`Message.read`) and writes
the JSON schema that the OpenAPI description serves (:meth:`Message.schema`), so the two
cannot disagree.

:meth:`Message.read` takes a value :func:`seqtrans.serving.validation.read` has checked
(valid text, finite numbers, bounded nesting) and refuses, in this order: a value that is
not an object, unknown fields, a field of the wrong type (every field, in declaration
order), then a value past its limits (again in order). A field's limits are its own
(``minimum``, ``maximum``, ``choices``) or a server setting's (``bound``). A null counts
as absent in a ``nullable`` field; elsewhere it is a value of the wrong type.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from typing import Any

from seqtrans.serving.errors import RequestError
from seqtrans.serving.settings import ServeSettings

#: A field's default when it has none (the model's setting decides, or the field is required).
NO_DEFAULT: Any = object()


@dataclass(frozen=True)
class Type:
    """A JSON type: ``json`` its schema name, ``noun`` what a value must be (in errors);
    an array's ``items`` and its least and most items (checked with the type, as the noun
    says: "a non-empty list of strings"); an object's ``fields``, which only answers have
    (no request nests an object, so reading checks no object's fields)."""

    json: str
    noun: str
    items: Type | None = None
    min_items: int | None = None
    max_items: int | None = None
    fields: Message | None = None

    def holds(self, value: Any) -> bool:
        """Whether ``value`` is of this type (an array: of its length), whatever its items."""
        if self.json == "boolean":
            return isinstance(value, bool)
        if self.json in ("integer", "number"):
            kinds = (int,) if self.json == "integer" else (int, float)
            return isinstance(value, kinds) and not isinstance(value, bool)
        if self.json == "array":
            most = float("inf") if self.max_items is None else self.max_items
            return isinstance(value, list) and (self.min_items or 0) <= len(value) <= most
        return isinstance(value, {"string": str, "object": dict}[self.json])

    def whole(self, value: Any) -> bool:
        """Whether ``value`` is of this type, items included."""
        return self.holds(value) and (self.items is None or all(self.items.whole(x) for x in value))

    def schema(self) -> dict[str, Any]:
        if self.fields is not None:
            return self.fields.schema()
        out: dict[str, Any] = {"type": self.json}
        if self.items is not None:
            out["items"] = self.items.schema()
        if self.min_items is not None:
            out["minItems"] = self.min_items
        if self.max_items is not None:
            out["maxItems"] = self.max_items
        return out


STRING = Type("string", "a string")
INTEGER = Type("integer", "an integer")
NUMBER = Type("number", "a number")
BOOLEAN = Type("boolean", "true or false")


def array(items: Type, noun: str, *, min_items: int | None = None, max_items: int | None = None) -> Type:
    return Type("array", noun, items=items, min_items=min_items, max_items=max_items)


def obj(message: Message) -> Type:
    return Type("object", "an object", fields=message)


@dataclass(frozen=True)
class Bound:
    """A limit a server setting (``setting``) puts on a field, a number's value or an
    array's length: past it, a ``code`` error whose ``message`` is formatted with the
    ``value`` and the ``limit``."""

    setting: str
    code: str
    message: str


@dataclass(frozen=True)
class Field:
    """One field of a message. ``code``: its errors' code where not its message's."""

    name: str
    type: Type
    description: str
    required: bool = False
    nullable: bool = False
    default: Any = NO_DEFAULT
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    bound: Bound | None = None
    code: str | None = None

    def schema(self) -> dict[str, Any]:
        out = self.type.schema()
        if self.choices:
            out = {"enum": [*self.choices, *([None] if self.nullable else [])]}
        elif self.nullable:
            out["type"] = [out["type"], "null"]
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        if self.default is not NO_DEFAULT:
            out["default"] = self.default
        return {**out, "description": self.description}

    def wrong_type(self, value: Any, code: str) -> RequestError:
        """The error of a value that is not of the field's type: its first wrong item, if
        the array holds any; else the whole value (quoted if it is no array)."""
        if self.type.items is not None and self.type.holds(value):
            i, item = next((i, x) for i, x in enumerate(value) if not self.type.items.whole(x))
            where = f"{self.name}[{i}]"
            noun = self.type.items.noun
            return RequestError(code, f"{where}: must be {noun}, got {short(item)}", field=where)
        got = "" if self.type.json == "array" else f", got {short(value)}"
        return RequestError(code, f"'{self.name}' must be {self.type.noun}{got}", field=self.name)

    def past_limits(self, value: Any, settings: ServeSettings, code: str) -> RequestError | None:
        """The error of a value of the right type past the field's limits, if it is."""
        if self.choices and value not in self.choices:
            return self._must(f"one of {', '.join(self.choices)}", value, code)
        low = -float("inf") if self.minimum is None else self.minimum
        high = float("inf") if self.maximum is None else self.maximum
        if (self.minimum is not None or self.maximum is not None) and not low <= value <= high:
            return self._must(self._range(), value, code)
        if self.bound is not None:
            size = len(value) if isinstance(value, list) else value
            limit = getattr(settings, self.bound.setting)
            if size > limit:
                return RequestError(self.bound.code, self.bound.message.format(value=size, limit=limit),
                                    limit=self.bound.setting, field=self.name)
        return None

    def _range(self) -> str:
        if self.maximum is None:
            return f"{self.type.noun} of at least {self.minimum:g}"
        if self.minimum is None:
            return f"{self.type.noun} of at most {self.maximum:g}"
        return f"{self.type.noun} from {self.minimum:g} to {self.maximum:g}"

    def _must(self, what: str, value: Any, code: str) -> RequestError:
        return RequestError(code, f"'{self.name}' must be {what}, got {short(value)}", field=self.name)


@dataclass(frozen=True)
class Message:
    """A JSON object of ``fields``, and nothing else: ``shape`` says what it must be (the
    error of anything that is not an object, or, with ``at_least_one``, of an empty
    one); ``code`` is its errors' code; ``name`` is how errors call it."""

    name: str
    fields: tuple[Field, ...]
    shape: str = ""
    code: str = "invalid_request"
    at_least_one: bool = False

    def read(self, body: Any, settings: ServeSettings) -> dict[str, Any]:
        """The values of a checked body by field name: those given, then the defaults of
        those absent that have one; a :class:`RequestError` for the first problem."""
        if not isinstance(body, dict) or (self.at_least_one and not body):
            raise RequestError(self.code, self.shape)
        unknown = sorted(set(body) - {f.name for f in self.fields})
        if unknown:
            names = ", ".join(short(u) for u in unknown)
            raise RequestError(self.code, f"unknown field(s) {names}; {self.name} takes {self.takes()}",
                               field=unknown[0])
        given = {f.name: body[f.name] for f in self.fields
                 if f.name in body and not (f.nullable and body[f.name] is None)}
        for f in self.fields:
            if (f.name in given or f.required) and not f.type.whole(given.get(f.name)):
                raise f.wrong_type(given.get(f.name), f.code or self.code)
        for f in self.fields:
            if f.name in given:
                problem = f.past_limits(given[f.name], settings, f.code or self.code)
                if problem is not None:
                    raise problem
        absent = [f for f in self.fields if f.name not in given and f.default is not NO_DEFAULT]
        return {**given, **{f.name: f.default for f in absent}}

    def takes(self) -> str:
        """The fields, in words: "inputs and the options beam, nbest", or "words and end"."""
        required = [f.name for f in self.fields if f.required]
        options = [f.name for f in self.fields if not f.required]
        if not required:
            return " and ".join(filter(None, [", ".join(options[:-1]), options[-1]]))
        return " and ".join([*required, *(["the options " + ", ".join(options)] if options else [])])

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object", "properties": {f.name: f.schema() for f in self.fields}}
        required = [f.name for f in self.fields if f.required]
        if required:
            out["required"] = required
        out["additionalProperties"] = False
        if self.at_least_one:
            out["minProperties"] = 1
        return out


def short(value: Any) -> str:
    """``repr(value)``, shortened: messages do not echo large bodies."""
    return reprlib.repr(value)
