"""The public API can be seen from a Python prompt: ``dir(seqtrans)`` lists every public
name though they are imported on first use, and each of them resolves."""

from __future__ import annotations

import subprocess
import sys

import seqtrans


def test_dir_lists_the_public_names_and_each_resolves() -> None:
    names = dir(seqtrans)
    assert names == sorted(seqtrans.__all__)
    assert {"load", "predict", "run", "stream", "Transformer", "OutputOptions", "PairScore"} <= set(names)
    for name in names:
        assert getattr(seqtrans, name) is not None


def test_listing_the_names_imports_no_torch() -> None:
    code = "import sys, seqtrans; dir(seqtrans); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
