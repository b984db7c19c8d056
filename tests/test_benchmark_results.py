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
    "serve_fuzz.json", "simultaneous_multi30k-previous.json",
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


@pytest.mark.parametrize(("status", "dirty"), [
    ("M benchmarks/results/x.json\n M docs/images/x.png", False),  # a run's own earlier writes
    ("M benchmarks/results/x.json\n M seqtrans/model/transformer.py", True),
    ("M seqtrans/model/transformer.py", True),  # the first line's leading space stripped with the output's
    ("MM docs/speed.md", True),
    ("", False),
])
def test_dirty_means_changed_code_not_a_benchmarks_own_outputs(status: str, dirty: bool) -> None:
    module = runpy.run_path(str(BENCHMARKS / "common.py"))
    provenance = module["provenance"]
    provenance.__globals__["_git"] = lambda *args: status if args[0] == "status" else "abc"
    assert provenance()["dirty"] is dirty


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


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (not gone, not a zombie waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_background_load_burns_cpu_beside_the_block_and_is_gone_after_however_it_ends(
        common: dict[str, Any]) -> None:
    import time

    with common["background_load"](2) as pids:
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        ticks = [int(Path(f"/proc/{p}/stat").read_text().split(")")[-1].split()[11]) for p in pids]
        time.sleep(0.3)
        later = [int(Path(f"/proc/{p}/stat").read_text().split(")")[-1].split()[11]) for p in pids]
        assert all(b > a for a, b in zip(ticks, later))  # user time grows: they burn the CPU
    assert not any(_alive(p) for p in pids)
    with pytest.raises(KeyError), common["background_load"](1) as pids:
        raise KeyError("the block fails")
    assert not any(_alive(p) for p in pids)


def test_a_burner_stops_when_its_parent_is_killed(common: dict[str, Any]) -> None:
    import sys
    import time

    start = (f"import os, subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
             f"{common['BURNER']!r}, str(os.getpid())]); print(p.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", start], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    burner = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{burner}").exists() and _alive(burner) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(burner)


def test_batch_one_weight_bandwidth_is_bytes_per_step_times_steps_per_second() -> None:
    speed = runpy.run_path(str(BENCHMARKS / "decode_speed.py"))
    shape = {"layers": 1, "d_model": 2, "d_ff": 4, "heads": 1, "vocab": 10}
    # one layer: 6 d x d matrices and two d x f ones (40 weights), the projection 20: 60
    assert speed["step_weight_bytes"](shape) == 240
    # int8: a byte a weight, and 8 bytes per output row (6 d + f + d = 18 rows, 10 vocabulary rows)
    assert speed["step_weight_bytes"](shape, precision="int8") == 60 + 8 * 28
    row = {"batch": 1, "seqtrans_tok_s": 100.0, "seqtrans_int8_tok_s": 200.0, "ct2_int8_tok_s": 50.0}
    speed["weight_bandwidth"](row, shape, bandwidth=1e5)
    assert row["seqtrans_weight_gb_s"] == pytest.approx(240 * 100 / 1e9)
    assert row["seqtrans_int8_of_bandwidth"] == pytest.approx(284 * 200 / 1e5)
    assert row["ct2_int8_of_bandwidth"] == pytest.approx(284 * 50 / 1e5)
    bound = row["bandwidth_bound_tok_s"]
    assert bound == {"fp32": pytest.approx(1e5 / 240), "int8": pytest.approx(1e5 / 284)}
    batched = {"batch": 32, "seqtrans_tok_s": 100.0}
    speed["weight_bandwidth"](batched, shape, bandwidth=1e5)
    assert batched == {"batch": 32, "seqtrans_tok_s": 100.0}  # weights serve many rows a step there
