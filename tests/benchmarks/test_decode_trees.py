"""``python -m benchmarks decode_trees``: case names, and a directory that is no checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import decode_trees


def test_case_names_read_as_decode_speed_writes_them() -> None:
    assert decode_trees.parse_case("base-beam4-b32") == ("base", 4, 32)
    assert decode_trees.parse_case("base-greedy-b1") == ("base", 1, 1)
    assert decode_trees.parse_case("parsing-beam21-b1") == ("parsing", 21, 1)


def test_a_directory_without_seqtrans_and_decode_speed_is_refused(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "seqtrans").mkdir()
    with pytest.raises(SystemExit):
        decode_trees.main([str(tmp_path), "--device", "cpu"])
    assert f"{tmp_path}: no seqtrans/ and benchmarks/decode_speed.py in it" in capsys.readouterr().err
