"""The benchmarks are one suite, and their results say where they come from.

Every benchmark is a module of the ``benchmarks`` package with a ``main(argv)``, run by
``python -m benchmarks NAME``, parsing its arguments with the shared parser and writing
through ``benchmarks/common.py``'s ``write_results``, which records the command, its
settings, the commit, the CPU, torch, threads, load average and whether the machine was
quiet; a file assembled or completed by hand says so (``"source": "manual"``) and how.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import benchmarks
from benchmarks import __main__ as runner
from benchmarks import common, decode_speed
from conftest import ROOT

BENCHMARKS = ROOT / "benchmarks"

def _sources() -> dict[str, Path]:
    """Each benchmark's source file, by name."""
    def source(name: str) -> Path:
        package = BENCHMARKS / name / "__init__.py"
        return package if package.is_file() else BENCHMARKS / f"{name}.py"
    return {name: source(name) for name in benchmarks.benchmarks()}


# ------------------------------------------------------------------------------ the suite


def test_the_runner_lists_every_benchmark_and_names_one_it_lacks() -> None:
    # a module whose name starts with _ is a part of one (a child process it starts)
    modules = {p.stem for p in BENCHMARKS.glob("*.py") if not p.stem.startswith("_")}
    modules -= {"common", "http_client"}
    modules |= {p.parent.name for p in BENCHMARKS.glob("*/__init__.py")}
    assert set(benchmarks.benchmarks()) == modules
    listed = subprocess.run([sys.executable, "-m", "benchmarks"], cwd=ROOT, capture_output=True, text=True)
    assert listed.returncode == 0
    lines = {line.split()[0]: line for line in listed.stdout.splitlines() if line.startswith("  ")}
    assert set(lines) == modules
    for name, summary in benchmarks.benchmarks().items():
        assert summary and summary in lines[name], name  # one line each, its docstring's first
    wrong = subprocess.run([sys.executable, "-m", "benchmarks", "decode_sped"], cwd=ROOT, capture_output=True,
                           text=True)
    assert wrong.returncode == 2 and "did you mean decode_speed?" in wrong.stderr


@pytest.mark.parametrize("name", sorted(benchmarks.benchmarks()))
def test_every_benchmark_is_a_module_with_main_and_the_shared_code(name: str) -> None:
    source = _sources()[name]
    text = source.read_text(encoding="utf-8")
    tree = ast.parse(text)
    summary = (ast.get_docstring(tree) or "").split("\n\n")[0]
    assert summary and "\n" not in summary, f"{name}: its docstring opens with a one-line summary"
    mains = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "main"]
    assert mains and [a.arg for a in mains[0].args.args] == ["argv"], f"{name}: main(argv)"
    assert "sys.path" not in text, f"{name} changes the import path"
    assert "__main__" not in text, f"{name} runs through the runner only"
    assert "ArgumentParser(" not in text and "arguments(__doc__)" in text, f"{name}: the shared parser"
    assert "python benchmarks/" not in text, f"{name} shows a command without the runner"
    defined = {f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}
    shared = {"timed", "timed_once", "peak_memory", "budget", "write_results", "write_json", "arguments",
              "provenance", "background_load", "gemm_peak"}
    assert not defined & shared, f"{name} defines again what benchmarks/common.py has: {defined & shared}"


def test_every_script_that_writes_results_goes_through_write_results() -> None:
    for name, script in _sources().items():
        text = script.read_text(encoding="utf-8")
        assert "atomic.write_json(" not in text, f"{name} writes JSON without its provenance"
        assert not re.search(r"write_text\(json\.dumps\(result", text), f"{name} writes results itself"
        if re.search(r"write_text\(json\.dumps|json\.dump\(", text):
            wrote = r"from benchmarks\.common import [^\n]*\b(write_results|write_json)\b"
            assert re.search(wrote, text), name


def test_the_readme_says_what_every_benchmark_measures() -> None:
    readme = (BENCHMARKS / "README.md").read_text(encoding="utf-8")
    table = readme.split("## What each measures", 1)[1].split("\n#", 1)[0]
    listed = set(re.findall(r"^\| `(\w+)` \|", table, re.MULTILINE))
    assert listed == set(benchmarks.benchmarks()), "benchmarks/README.md: a row per benchmark"
    assert "python -m benchmarks NAME" in readme


def test_pytest_collects_no_benchmark(pytestconfig: pytest.Config) -> None:
    assert not any(path.split("/")[0] == "benchmarks" for path in pytestconfig.getini("testpaths"))
    assert not list(BENCHMARKS.rglob("test_*.py"))


def test_the_budget_stops_at_a_number_of_updates_with_warmup_and_averaging_scaled() -> None:
    assert common.budget(650, checkpoints=20) == [
        "train.max_steps=650", "train.max_minutes=0", "train.warmup=260", "train.checkpoint_every=32",
        "train.average_last=5", "train.keep_checkpoints=5"]
    assert common.budget(3000, average_last=None) == [
        "train.max_steps=3000", "train.max_minutes=0", "train.warmup=400", "train.checkpoint_every=300"]
    assert common.budget(2, warmup=7, average_last=None)[2:] == ["train.warmup=7", "train.checkpoint_every=1"]


# ---------------------------------------------------------------------------- provenance


def test_results_record_the_commit_cpu_torch_threads_and_load(tmp_path: Path) -> None:
    path = common.write_results(tmp_path / "out" / "bench.json", {"rows": [1, 2]})
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
    # written outside the runner: no command is claimed, nor a quiet machine
    assert record["command"] is None and record["arguments"] is None and record["quiet"] is None


def test_a_benchmark_run_through_the_runner_records_its_command_settings_and_quiet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "fake.json"

    def main(argv: list[str]) -> int:
        parser = common.arguments("A fake benchmark.")
        parser.add_argument("--steps", type=int, default=3)
        parser.add_argument("--data", type=Path)
        args = parser.parse_args(argv)
        assert parser.prog == "python -m benchmarks fake"
        common.write_results(out, {"steps": args.steps})
        return 0

    monkeypatch.setattr(runner, "benchmarks", lambda: {"fake": "A fake benchmark."})
    monkeypatch.setattr(runner.importlib, "import_module", lambda name: SimpleNamespace(main=main))
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("SEQTRANS_CACHE_DIR", str(tmp_path))  # a path: left out
    data = str(ROOT.parent / "shared" / "data" / "x")
    assert runner.main(["fake", "--steps", "5", "--data", data]) == 0
    record = json.loads(out.read_text())["provenance"]
    # paths beside the repository as seen from its root, not as this machine has them
    assert record["command"] == "python -m benchmarks fake --steps 5 --data ../shared/data/x"
    assert record["arguments"] == {"steps": 5, "data": "../shared/data/x"}
    assert record["environment"]["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "SEQTRANS_CACHE_DIR" not in record["environment"]
    if Path("/proc/stat").exists():
        assert record["other_cores"] >= 0 and record["quiet"] == (record["other_cores"] < common.QUIET_CORES)
    assert common._run is None  # the run ends with the benchmark


def test_quiet_counts_the_cores_busy_with_work_outside_the_benchmarks_processes() -> None:
    start = common.CpuClock(wall=100.0, machine=50.0, own=3.0)
    # 8 CPU-seconds on the machine in 4 s, 6 of them the benchmark's own: half a core of other work
    assert common.other_cores(start, common.CpuClock(wall=104.0, machine=58.0, own=9.0)) == 0.5
    assert common.other_cores(start, common.CpuClock(wall=104.0, machine=None, own=9.0)) is None


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc")
def test_a_benchmarks_burners_are_its_own_work() -> None:
    start = common.cpu_clock()
    with common.background_load(1):
        time.sleep(2.0)  # long enough for the burner to get CPU time on a loaded machine too
    end = common.cpu_clock()
    assert end.own - start.own > 0.1  # the burner's CPU time, reaped: counted as the benchmark's


@pytest.mark.parametrize(("status", "dirty"), [
    ("M benchmarks/results/x.json\n M docs/images/x.png", False),  # a run's own earlier writes
    ("M benchmarks/results/x.json\n M seqtrans/model/transformer.py", True),
    ("M seqtrans/model/transformer.py", True),  # the first line's leading space stripped with the output's
    ("MM docs/speed.md", True),
    ("", False),
])
def test_dirty_means_changed_code_not_a_benchmarks_own_outputs(status: str, dirty: bool,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "_git", lambda *args: status if args[0] == "status" else "abc")
    assert common.provenance()["dirty"] is dirty


def _results() -> list[tuple[str, dict[str, Any]]]:
    return [(path.name, json.loads(path.read_text(encoding="utf-8")))
            for path in sorted((BENCHMARKS / "results").glob("*.json"))]


def test_every_results_file_has_its_provenance_and_the_command_that_made_it() -> None:
    for name, data in _results():
        record = data.get("provenance") or {}
        assert record.get("commit"), f"{name} has no provenance"
        assert isinstance(record.get("command"), str) and record["command"], f"{name}: which command made it?"
        assert "quiet" in record, f"{name}: was the machine quiet (null: not known)?"
        if data.get("source") == "manual":
            assert data.get("made"), f"{name}: say how it was made"
        else:
            assert record["command"].startswith("python -m benchmarks "), name
            assert isinstance(record.get("arguments"), dict), f"{name}: its settings"


def test_results_completed_by_hand_name_commits_of_this_history() -> None:
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    for name, data in _results():
        if data.get("source") != "manual":
            continue
        commit = data["provenance"]["commit"]
        known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT,
                               capture_output=True)
        assert known.returncode == 0, f"{name}: {commit} is no commit of this repository"


# --------------------------------------------------------------------------- shared code


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (not gone, not a zombie waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_background_load_burns_cpu_beside_the_block_and_is_gone_after_however_it_ends() -> None:
    with common.background_load(2) as pids:
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        ticks = [int(Path(f"/proc/{p}/stat").read_text().split(")")[-1].split()[11]) for p in pids]
        time.sleep(0.3)
        later = [int(Path(f"/proc/{p}/stat").read_text().split(")")[-1].split()[11]) for p in pids]
        assert all(b > a for a, b in zip(ticks, later))  # user time grows: they burn the CPU
    assert not any(_alive(p) for p in pids)
    with pytest.raises(KeyError), common.background_load(1) as pids:
        raise KeyError("the block fails")
    assert not any(_alive(p) for p in pids)


def test_a_burner_stops_when_its_parent_is_killed() -> None:
    start = (f"import os, subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
             f"{common.BURNER!r}, str(os.getpid())]); print(p.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", start], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    burner = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{burner}").exists() and _alive(burner) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(burner)


def test_the_cross_attention_clock_times_the_attention_and_gives_the_methods_back() -> None:
    from conftest import tiny_model
    from seqtrans.decoding import greedy_search

    model = tiny_model()
    src = torch.tensor([[5, 6, 7, 2]])
    attns = [layer.cross_attn for layer in model.decoder_layers]
    clock = common.CrossAttentionClock(model)
    assert all("forward" in vars(a) and "prepare" in vars(a) for a in attns)
    with torch.no_grad():
        timed = greedy_search(model, src, max_len=torch.tensor([6]))
    assert clock.seconds > 0.0
    clock.close()
    assert not any("forward" in vars(a) or "prepare" in vars(a) for a in attns)
    with torch.no_grad():
        again = greedy_search(model, src, max_len=torch.tensor([6]))
    assert [h.tokens for h in again[0]] == [h.tokens for h in timed[0]]  # the clock changed nothing


def test_batch_one_weight_bandwidth_is_bytes_per_step_times_steps_per_second() -> None:
    shape = {"layers": 1, "d_model": 2, "d_ff": 4, "heads": 1, "vocab": 10}
    # one layer: 6 d x d matrices and two d x f ones (40 weights), the projection 20: 60
    assert decode_speed.step_weight_bytes(shape) == 240
    # int8: a byte a weight, and 8 bytes per output row (6 d + f + d = 18 rows, 10 vocabulary rows)
    assert decode_speed.step_weight_bytes(shape, precision="int8") == 60 + 8 * 28
    row = {"batch": 1, "seqtrans_tok_s": 100.0, "seqtrans_int8_tok_s": 200.0, "ct2_int8_tok_s": 50.0}
    decode_speed.weight_bandwidth(row, shape, bandwidth=1e5)
    assert row["seqtrans_weight_gb_s"] == pytest.approx(240 * 100 / 1e9)
    assert row["seqtrans_int8_of_bandwidth"] == pytest.approx(284 * 200 / 1e5)
    assert row["ct2_int8_of_bandwidth"] == pytest.approx(284 * 50 / 1e5)
    bound = row["bandwidth_bound_tok_s"]
    assert bound == {"fp32": pytest.approx(1e5 / 240), "int8": pytest.approx(1e5 / 284)}
    batched = {"batch": 32, "seqtrans_tok_s": 100.0}
    decode_speed.weight_bandwidth(batched, shape, bandwidth=1e5)
    assert batched == {"batch": 32, "seqtrans_tok_s": 100.0}  # weights serve many rows a step there
