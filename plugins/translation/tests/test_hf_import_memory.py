"""Memory of an imported model, each measured in a process of its own as the peak resident
set over what the process held before:

- ``seqtrans import hf`` holds the weights about once: it reads the weight file a tensor
  at a time and writes the run from what it converted (NLLB-200-distilled-600M's 2.4 GB
  import in about that much, not several times it);
- a run loaded for float32 decoding holds them once, in oneDNN's packed layout (the
  checkpoint is a map of its file, whose pages are given back once packed); loaded in
  int8, it never holds the float weights whole."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hf_models import hf_directory

from seqtrans.linear import onednn_available  # internal: whether fp32 decoding packs its weights
from seqtrans_translation.hf import FORMAT

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")

# the peak of this process's own memory (VmHWM: ru_maxrss would start from its parent's size),
# after the libraries both import and decoding load (the imports themselves are not measured)
_PEAK = """
import json, sys
from pathlib import Path
import tokenizers, torch
import seqtrans.inference.loading, seqtrans_translation.hf.importing
def peak():
    return next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmHWM:"))
"""

_CHILD = _PEAK + """
from seqtrans_translation.hf import FORMAT
before = peak()
FORMAT.import_model(Path(sys.argv[1]), out=Path(sys.argv[2]))
print(json.dumps({"before_kib": before, "peak_kib": peak()}))
"""


_DECODE = _PEAK + """
from seqtrans import load
before = peak()
settings = [f"decode.precision={sys.argv[2]}", "decode.beam=2", "decode.source_lang=eng_Latn",
            "decode.target_lang=deu_Latn"]
loaded = load(sys.argv[1], device="cpu", overrides=settings)
loaded.decode(["a b c d"])
print(json.dumps({"before_kib": before, "peak_kib": peak()}))
"""


def _grown(script: str, *args: str) -> int:
    """How far the peak resident set of ``script`` rose over what it held before the part measured, KiB."""
    done = subprocess.run([sys.executable, "-c", script, *args], check=True, capture_output=True, text=True)
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    return int(measured["peak_kib"] - measured["before_kib"])


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A model directory whose layers are wide enough that the weights (about 90 MiB), not the
    interpreter, set the peak, and its import's run directory."""
    base = tmp_path_factory.mktemp("wide")
    directory = hf_directory("nllb", base / "hf", d_model=768, train_steps=0)
    return directory, base / "run"


def test_import_holds_the_weights_about_once(wide: tuple[Path, Path]) -> None:
    directory, run = wide
    size_kib = (directory / "model.safetensors").stat().st_size / 1024
    grown = _grown(_CHILD, str(directory), str(run))
    # the converted weights once, and a tensor or two being read beside them (not a map of
    # the whole file beside the converted copy)
    assert grown < 1.5 * size_kib, f"the import grew by {grown / size_kib:.2f}x the weights' size"
    assert (run / "checkpoints" / "average.pt").is_file()


@pytest.mark.skipif(not onednn_available(), reason="float32 decoding packs its weights through oneDNN")
def test_a_run_decoding_holds_its_weights_once(wide: tuple[Path, Path]) -> None:
    directory, run = wide
    if not run.exists():
        FORMAT.import_model(directory, out=run)
    size_kib = (run / "checkpoints" / "average.pt").stat().st_size / 1024
    fp32, int8 = (_grown(_DECODE, str(run), precision) for precision in ("fp32", "int8"))
    # the weights once, packed (not the plain ones beside them), and what decoding itself
    # holds (the codec, the kernels' buffers)
    assert fp32 < 1.8 * size_kib, f"float32 decoding grew by {fp32 / size_kib:.2f}x the weights' size"
    # a quarter of them in int8 and the same (never the whole float checkpoint first)
    assert int8 < 1.15 * size_kib, f"int8 decoding grew by {int8 / size_kib:.2f}x the weights' size"
