"""The same checkpoint and input give byte-identical results in separate processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import seqtrans
from seqtrans import pipeline

# decodes the copy task's test split with the run in argv[1] and prints every n-best
# hypothesis with its score as the float's exact hex form
DECODE = """
import json, sys
import seqtrans
from seqtrans.tasks import Example
loaded = seqtrans.load(sys.argv[1], overrides=["decode.beam=" + sys.argv[2], "decode.nbest=" + sys.argv[2]],
                       device="cpu")
sources = [e.source for e in loaded.task.read("test") if isinstance(e, Example)]
preds, hyps = loaded.decode(sources)
print(json.dumps([[h.tokens, float(h.score).hex()] for n in hyps for h in n]))
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reproducible") / "run"
    config = seqtrans.resolve_config("copy", overrides=[
        "data.vocab_size=300", "data.train_size=400", "data.dev_size=10", "data.test_size=60",
        "model.d_model=64", "model.d_ff=128", "model.heads=4", "train.max_steps=30",
        "train.checkpoint_every=30", "train.eval_every=30", "train.max_minutes=0"])
    pipeline.run(config, out, device="cpu")
    return out


@pytest.mark.parametrize("beam", [1, 4])
def test_two_processes_decode_the_same_bits(trained: Path, beam: int) -> None:
    runs = [subprocess.run([sys.executable, "-c", DECODE, str(trained), str(beam)], capture_output=True,
                           text=True, check=True).stdout for _ in range(2)]
    assert runs[0] == runs[1]
    decoded = json.loads(runs[0])
    assert len(decoded) == 60 * beam and len({score for _, score in decoded}) > 30
