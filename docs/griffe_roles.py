"""A Griffe extension for the API reference: the docstrings' reST roles (:func:`name`,
:class:`~a.b.Name`, :mod:`.protocol`, ...) become cross-references.

mkdocstrings renders docstrings as Markdown, where a role would print as literal text.
Each role becomes an optional autoref to the full path of its target, resolved in the
docstring's scope as Python would: a link where the reference documents the target (under
its public name or its own path), else the name in code, without a warning, since most of
the engine is deliberately left out of the reference.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj|const):`([^`]+)`")


def shown(target: str) -> str:
    """What a role shows, as Sphinx shows it: ``~a.b.c`` shows ``c``; a leading dot is dropped."""
    if target.startswith("~"):
        return target.lstrip("~.").rsplit(".", 1)[-1]
    return target.lstrip(".")


class Roles(griffe.Extension):
    """Rewrites the roles of every docstring of a package once it is loaded, when its scopes
    (imports, members) are complete."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        self.collection = loader.modules_collection
        self.by_suffix: dict[str, set[str]] | None = None
        for obj in walk(pkg):
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = ROLE.sub(self.references_from(obj), obj.docstring.value)

    def references_from(self, obj: griffe.Object) -> Callable[[re.Match[str]], str]:
        def reference(role: re.Match[str]) -> str:
            target = role[1]
            path = self.resolve(obj, target.lstrip("~").removesuffix("()"))
            return f'<autoref identifier="{path}" optional><code>{shown(target)}</code></autoref>'
        return reference

    def resolve(self, obj: griffe.Object, target: str) -> str:
        """The full path of ``target`` as seen from ``obj``: the canonical one where the
        target is an import, so that a re-exported name finds the page documenting it."""
        name = target.lstrip(".")
        first, _, rest = name.partition(".")
        try:
            return self.canonical(obj.resolve(first) + (f".{rest}" if rest else ""))
        except griffe.NameResolutionError:
            pass
        if rest and (first in self.collection or first.startswith("seqtrans")):
            return self.canonical(name)  # a full path, maybe into a package not loaded yet
        return self.canonical(self.unique_suffix(name) or name)

    def canonical(self, path: str) -> str:
        try:
            found = self.collection.get_member(path)
            return found.final_target.path if found.is_alias else found.path
        except Exception:  # an object of a package not loaded yet, or not there: keep the path
            return path

    def unique_suffix(self, name: str) -> str | None:
        """The one object loaded whose path ends with ``.name`` (Sphinx's search for ``.name``)."""
        if self.by_suffix is None:
            self.by_suffix = {}
            for module in self.collection.members.values():
                for found in walk(module):
                    parts = found.path.split(".")
                    for i in range(1, len(parts)):
                        self.by_suffix.setdefault(".".join(parts[i:]), set()).add(found.path)
        paths = self.by_suffix.get(name, set())
        return next(iter(paths)) if len(paths) == 1 else None


def walk(obj: griffe.Object) -> list[griffe.Object]:
    """``obj`` and every object defined under it (not the names it imports)."""
    out = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            out += walk(member)  # type: ignore[arg-type]
    return out
