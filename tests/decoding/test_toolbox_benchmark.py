"""``benchmarks/decode_toolbox.py --smoke`` decodes in every mode it times, so the
benchmark cannot rot between its runs."""

from __future__ import annotations

import runpy

import pytest

from conftest import ROOT


def test_the_smoke_run_times_every_mode(capsys: pytest.CaptureFixture[str]) -> None:
    script = runpy.run_path(str(ROOT / "benchmarks" / "decode_toolbox.py"))
    script["main"](["--smoke"])
    out = capsys.readouterr().out
    for mode in ("greedy", "sampling", "sampling, top-k 50", "sampling, top-p 0.9", "beam 8",
                 "beam 8, 3 required phrases", "sampling / greedy", "beam with phrases / without"):
        assert mode in out
