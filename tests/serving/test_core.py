"""The server's layering, by import inspection: the decoding core and the request and
answer declarations import no web framework (imported in a fresh process, none is
loaded), and the HTTP app reaches the engine only through the core."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from seqtrans.serving.errors import CODES, RequestError

ROOT = Path(__file__).resolve().parents[2]
SERVING = ROOT / "seqtrans" / "serving"
#: The modules of seqtrans.serving that speak HTTP: the app, its middleware, uvicorn's protocols
#: and the process that runs uvicorn (the WebSocket adapter is seqtrans.streaming.websocket).
WEB = {"app", "middleware", "connections", "server"}
FRAMEWORKS = ("starlette", "uvicorn", "websockets", "h11", "httpx")


def _framework_free() -> list[str]:
    return sorted(f"seqtrans.serving.{p.stem}" for p in SERVING.glob("*.py")
                  if p.stem not in WEB and p.stem != "__init__")


def test_the_core_and_the_declarations_load_no_web_framework() -> None:
    modules = _framework_free()
    assert {"seqtrans.serving.core", "seqtrans.serving.streams", "seqtrans.serving.requests",
            "seqtrans.serving.answers", "seqtrans.serving.openapi"} <= set(modules)
    code = (f"import importlib, json, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            f"print(json.dumps(sorted(n for n in sys.modules if n.split('.')[0] in {FRAMEWORKS!r})))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert json.loads(found.stdout) == []


def _seqtrans_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("seqtrans"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("seqtrans"))
    return found


@pytest.mark.parametrize("module", sorted(_framework_free()))
def test_no_framework_free_module_imports_a_web_module(module: str) -> None:
    path = SERVING / f"{module.rsplit('.', 1)[1]}.py"
    imported = {n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                if isinstance(n, (ast.Import, ast.ImportFrom))}
    names = {a.name for n in imported if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in imported if isinstance(n, ast.ImportFrom) and n.module}
    web = {n for n in names if n.split(".")[0] in FRAMEWORKS or n in {f"seqtrans.serving.{w}" for w in WEB}
           or n == "seqtrans.streaming.websocket"}
    assert not web, f"{module} imports {web}"


def test_the_app_reaches_the_engine_only_through_the_core() -> None:
    for name in ("app", "middleware"):
        outside = {m for m in _seqtrans_imports(SERVING / f"{name}.py")
                   if not m.startswith("seqtrans.serving") and m != "seqtrans.streaming.websocket"}
        assert not outside, f"seqtrans.serving.{name} imports {outside}"
    websocket = _seqtrans_imports(ROOT / "seqtrans" / "streaming" / "websocket.py")
    assert all(m.startswith("seqtrans.serving") for m in websocket), websocket


def test_every_error_has_one_status_and_unknown_codes_are_refused() -> None:
    assert all(400 <= c.status < 600 and c.when for c in CODES.values())
    assert RequestError("queue_full", "busy", retry_after=1).status == 503
    with pytest.raises(ValueError, match="no error code 'busy'"):
        RequestError("busy", "a code the catalogue lacks")
