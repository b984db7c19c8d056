"""Benchmark results say where they come from: every script writes its results through
``benchmarks/common.py``'s ``write_results``, which records the commit, the CPU, torch,
threads and load average; a file assembled by hand says so (``"source": "manual"``)."""

from __future__ import annotations

import json
import re
import runpy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import ROOT

BENCHMARKS = ROOT / "benchmarks"

#: Written before results recorded their provenance; a file written since carries it.
WITHOUT_PROVENANCE = {
    "attention_copy-L100-15min.json", "attention_copy.json", "backtranslation_multi30k-t0.1.json",
    "backtranslation_multi30k.json", "data_scale-cpu.json", "decode_precision-cpu.json",
    "decode_speed-cpu.json", "decode_speed-ct2-cpu.json", "decode_speed-ct2-repeat-cpu.json",
    "decode_speed-cuda.json", "decode_speed-seam-after1-cpu.json", "decode_speed-seam-after2-cpu.json",
    "decode_speed-seam-before1-cpu.json", "decode_speed-seam-before2-cpu.json", "decode_toolbox-cpu.json",
    "decode_toolbox-forward-real-cpu.json", "distributed_cpu-cpu.json", "finetune_multi30k-control.json",
    "finetune_multi30k.json", "kill_recovery-cpu.json", "matmul_forms-cpu.json", "parsing_decode-cpu.json",
    "parsing_decode-int8-cpu.json", "parsing_decode-native-cpu.json", "parsing_decode-native-int8-cpu.json",
    "parsing_decode-seam-cpu.json", "parsing_evalb.json", "parsing_sample-cpu-5965pieces-seed2.json",
    "parsing_sample-cpu-5965pieces.json", "parsing_sample-cpu-943-seed1.json",
    "parsing_sample-cpu-943-vectors-seed1.json", "parsing_sample-cpu-943-vectors-seed2.json",
    "parsing_sample-cpu-dropout01.json", "parsing_sample-cpu-epyc-seed1.json",
    "parsing_sample-cpu-prenorm.json", "parsing_sample-cpu-seed2.json", "parsing_sample-cpu-subword.json",
    "parsing_sample-cpu-unsampled.json", "parsing_sample-cpu-vectors-seed1.json",
    "parsing_sample-cpu-vectors-seed2.json", "parsing_sample-cpu.json", "parsing_sweep-gpu-3850-a.json",
    "parsing_sweep-gpu-3850-b.json", "parsing_sweep-gpu-3850-c.json", "parsing_sweep-gpu-3850-d.json",
    "pretrained_marian-cpu.json", "serve_load-one-thread.json", "serve_load.json",
    # measured by runs that started before the record existed
    "serve_fuzz.json", "simultaneous_multi30k.json", "simultaneous_multi30k-previous.json",
    "streaming_copy.json", "train_speed-base-25000tok-cuda.json",
    "train_speed-base-cpu.json", "train_speed-base-cuda.json", "train_speed-base-dropout0.1-cpu.json",
    "translation_multi30k.json",
}


@pytest.fixture(scope="module")
def common() -> dict[str, Any]:
    return runpy.run_path(str(BENCHMARKS / "common.py"))


def test_results_record_the_commit_cpu_torch_threads_and_load(common: dict[str, Any], tmp_path: Path) -> None:
    path = common["write_results"](tmp_path / "out" / "bench.json", {"rows": [1, 2]})
    data = json.loads(path.read_text())
    assert data["rows"] == [1, 2]
    record = data["provenance"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:
        assert record["commit"] == head.stdout.strip() and isinstance(record["dirty"], bool)
    assert record["torch"] == torch.__version__ and record["threads"] == torch.get_num_threads()
    assert record["cpu"]["model"] and record["cpu"]["cores"]
    if Path("/proc/cpuinfo").exists():
        assert record["cpu"]["flags"] and all(isinstance(f, str) for f in record["cpu"]["flags"])
        assert len(record["load_average"]) == 3


def test_every_script_that_writes_results_goes_through_write_results() -> None:
    for script in sorted(BENCHMARKS.glob("*.py")):
        if script.name == "common.py":
            continue
        text = script.read_text(encoding="utf-8")
        if "results" not in text and "RESULTS" not in text:
            continue
        assert "atomic.write_json(" not in text, f"{script.name} writes JSON without its provenance"
        assert not re.search(r"write_text\(json\.dumps\(result", text), f"{script.name} writes results itself"
        if re.search(r"write_text\(json\.dumps|json\.dump\(", text):
            assert re.search(r"from common import [^\n]*\b(write_results|write_json)\b", text), script.name


def test_every_results_file_has_its_provenance_or_says_it_was_made_by_hand() -> None:
    for path in sorted((BENCHMARKS / "results").glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("source") == "manual":
            assert data.get("made"), f"{path.name}: say how it was made"
        elif path.name not in WITHOUT_PROVENANCE:
            assert "commit" in data.get("provenance", {}), f"{path.name} has no provenance"
