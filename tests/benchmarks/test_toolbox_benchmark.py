"""``python -m benchmarks decode_toolbox --smoke`` decodes in every mode it times, so the
benchmark cannot rot between its runs."""

from __future__ import annotations

import pytest

from benchmarks import decode_toolbox


def test_the_smoke_run_times_every_mode(capsys: pytest.CaptureFixture[str]) -> None:
    decode_toolbox.main(["--smoke"])
    out = capsys.readouterr().out
    for mode in ("greedy", "sampling", "sampling, top-k 50", "sampling, top-p 0.9", "beam 8",
                 "beam 8, 3 required phrases", "sampling / greedy", "beam with phrases / without"):
        assert mode in out
