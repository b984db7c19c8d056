"""The public API can be seen from a Python prompt: ``dir(seqtrans)`` lists every public
name though they are imported on first use, and each of them resolves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


def test_a_run_starts_from_a_model_or_takes_its_vocabulary_not_both(tmp_path: Path) -> None:
    """``seqtrans.run``'s ``init`` and ``vocabulary`` are ``run --init`` and ``--vocab``: the
    same refusal from Python as from the command line, before anything is written."""
    start = seqtrans.Initial(tmp_path / "model.pt", "copy", model={}, assets={}, weights={})
    with pytest.raises(seqtrans.UsageError, match="brings its model's vocabulary.*not both"):
        seqtrans.run(seqtrans.resolve_config("copy"), tmp_path / "run", init=start, vocabulary=start)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["initial", "with_initial_model", "vocabulary_of"])
def test_the_old_paths_of_run_init_warn_and_name_the_public_one(name: str) -> None:
    import seqtrans.pipeline

    warning = f"seqtrans.pipeline.{name} is deprecated: use seqtrans.{name}"
    with pytest.warns(DeprecationWarning, match=warning):
        assert getattr(seqtrans.pipeline, name) is getattr(seqtrans, name)
