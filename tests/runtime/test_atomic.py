"""Files written whole or not at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqtrans.runtime import atomic


def test_a_file_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "out.json"
    atomic.write_json(path, {"b": 1, "a": [1, 2]})
    assert path.read_text(encoding="utf-8") == json.dumps({"a": [1, 2], "b": 1}, indent=2) + "\n"
    atomic.write_text(path, "äbc\n")
    assert path.read_bytes() == "äbc\n".encode()
    assert sorted(p.name for p in path.parent.iterdir()) == ["out.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "out.bin"
    atomic.write_bytes(path, b"old", durable=True)
    with pytest.raises(RuntimeError), atomic.replacing(path) as f:
        f.write(b"half of the new")
        raise RuntimeError("the writer failed")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_temporary_names_are_recognised(tmp_path: Path) -> None:
    seen: list[str] = []
    with atomic.replacing(tmp_path / "x.pt") as f:
        seen = [p.name for p in tmp_path.iterdir()]
        f.write(b"x")
    assert len(seen) == 1 and atomic.is_temporary(seen[0]) and seen[0].startswith(".x.pt.")
    assert not atomic.is_temporary("x.pt")
