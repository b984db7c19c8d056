"""Everything a lent GPU should measure, in one command, into one results JSON.

    python -m benchmarks gpu_suite                  # on a CUDA machine: meant for <= 40 minutes
    python -m benchmarks gpu_suite --smoke          # every part on the CPU, tiny sizes, seconds
    python -m benchmarks gpu_suite --parts decode_speed step_graphs
    python -m benchmarks gpu_suite --merge A.json B.json --out gpu_suite-h100.json --note "..."

Parts, each recorded with its device, dtype, torch version and processor or GPU name:

- ``gpu_tests``: ``pytest -m gpu``, with the counts of passed, failed and skipped tests;
- ``decode_speed``: seqtrans (fp32, bf16; int8 on a CPU) against Hugging Face ``generate``
  (fp32, fp16, bf16) and CTranslate2 (its compute types for the device), greedy and beam 4
  at batch 1 and 32, through ``decode_speed.run_case``;
- ``step_graphs``: the decoder step with static shapes over bucketed cache lengths, in
  CUDA graphs and under ``torch.compile(mode="reduce-overhead")``, against eager decoding,
  the tokens compared (``static_step.compare``);
- ``train_mfu``: training tokens/s and MFU against the measured bf16 matmul peak and the
  datasheet's, under bf16 autocast, a batch of about 25,000 tokens (``train_speed``'s step);
- ``train_compiled``: the same step with its forward pass and loss under ``torch.compile``;
- ``torchrun_resume``: ``seqtrans run copy`` under torchrun killed with SIGKILL at an update
  and resumed, against uninterrupted runs (``resume.py``);
- ``multi30k``: the translation task's ``base`` preset trained for 15 minutes on Multi30k
  through ``seqtrans.run``, with its test2016 BLEU (the data from ``$SEQTRANS_MIRROR`` when set).

A part that fails records its error and the others still run; the command then exits 1.
``--smoke`` runs the same code with tiny shapes on the CPU so that it cannot rot while no
GPU is lent: CUDA graphs are then recorded as skipped, and ``torch.compile`` uses the
``aot_eager`` backend (inductor's C++ build alone takes over a minute on a small CPU).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import json
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from benchmarks import decode_speed, train_speed
from benchmarks.common import (
    RESULTS,
    ROOT,
    arguments,
    device_name,
    gemm_peak,
    memory_bandwidth,
    pick_device,
    synchronize,
    write_results,
)
from benchmarks.gpu_suite import resume, static_step
from seqtrans.data.vocab import PAD
from seqtrans.training.step import resolve_precision

PARTS = ("gpu_tests", "decode_speed", "step_graphs", "train_mfu", "train_compiled", "torchrun_resume",
         "multi30k")
# dense bf16 matrix-multiply peaks from the makers' datasheets (without sparsity), FLOP/s
DATASHEET_BF16 = {"H100": 989.4e12, "H200": 989.4e12}

# The base preset on Multi30k: the WMT 2014 data settings give way to the dataset's own
# (its default vocabulary, no length or ratio cleaning).
MULTI30K = ["data.dataset=multi30k", "data.vocab_size=8000", "data.max_train_words=0",
            "data.max_train_ratio=0"]


@dataclass(frozen=True)
class Sizes:
    """How much each part does: the full run, or the smoke run's tiny version of it."""

    shape_name: str
    shape: dict[str, int]
    decode_cases: list[decode_speed.Case]
    out_len: int
    repeats: int
    step_batches: tuple[int, ...]
    step_out_len: int
    train_tokens: int
    resume_steps: int
    resume_kill_at: int
    multi30k: list[str] = field(default_factory=list)
    gemm_size: int | None = None  # None: as large as common.gemm_peak finds fit


FULL = Sizes(
    shape_name="base", shape=decode_speed.SHAPES["base"],
    decode_cases=[decode_speed.Case("base", beam, batch) for beam in (1, 4) for batch in (1, 32)],
    out_len=32, repeats=3, step_batches=(1, 32), step_out_len=64, train_tokens=25000,
    resume_steps=300, resume_kill_at=130, multi30k=[*MULTI30K, "train.max_minutes=15"],
)
SMOKE = Sizes(
    shape_name="tiny", shape={"layers": 1, "d_model": 32, "d_ff": 64, "heads": 2, "vocab": 300},
    decode_cases=[decode_speed.Case("tiny", beam, batch) for beam, batch in ((1, 1), (2, 2))],
    out_len=4, repeats=1, step_batches=(1, 2), step_out_len=20, train_tokens=256, gemm_size=256,
    resume_steps=30, resume_kill_at=20,
    multi30k=[*MULTI30K, "data.max_train_examples=1500", "data.vocab_size=800", "model.encoder_layers=1",
              "model.decoder_layers=1", "model.d_model=32", "model.d_ff=64", "model.heads=2",
              "train.max_steps=4", "train.max_tokens=1500", "train.warmup=2", "train.eval_every=4",
              "train.checkpoint_every=4", "train.keep_checkpoints=1", "train.average_last=1",
              "train.valid_max_examples=8", "train.max_length=30", "decode.beam=2", "decode.max_len_b=4"],
)


def machine(device: torch.device, dtype: str) -> dict[str, Any]:
    """What a part ran on: recorded with each part, since parts may be run apart."""
    return {"device": device.type, "device_name": device_name(device), "dtype": dtype,
            "torch": torch.__version__, "cuda": torch.version.cuda}


def gpu_tests(device: torch.device, sizes: Sizes, work: Path, *, smoke: bool) -> dict[str, Any]:
    """``pytest -m gpu`` in a fresh process over the files that mark GPU tests: collecting
    every test costs more than the rest of the smoke run, and imports extras (the server's,
    the peers') that a GPU machine may lack. The tests choose their device themselves: CUDA
    wherever there is one."""
    files = [*ROOT.glob("tests/**/test_*.py"), *ROOT.glob("plugins/*/tests/**/test_*.py")]
    paths = sorted(str(p.relative_to(ROOT)) for p in files if "mark.gpu" in p.read_text(encoding="utf-8"))
    report = work / "gpu_tests.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                           f"--junitxml={report}", *paths], cwd=ROOT, capture_output=True,
                          text=True)
    if not report.is_file():
        raise RuntimeError(f"pytest wrote no report (exit {done.returncode}): {done.stdout[-2000:]}"
                           f"{done.stderr[-2000:]}")
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed = []
    for suite in ET.parse(report).getroot().iter("testsuite"):
        for key in counts:
            counts[key] += int(suite.get(key, 0))
        failed += [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
                   if case.find("failure") is not None or case.find("error") is not None]
    tested = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result = {**machine(tested, "as each test sets"), "exit_code": done.returncode,
              "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
              "failed": counts["failures"], "errors": counts["errors"], "skipped": counts["skipped"],
              "failed_tests": failed, "files": paths}
    if failed or done.returncode not in (0, 5):  # 5: no test selected
        result["error"] = f"{len(failed)} GPU tests failed or errored (pytest exit {done.returncode})"
    return result


def decode(device: torch.device, sizes: Sizes, work: Path, *, smoke: bool) -> dict[str, Any]:
    peak32 = gemm_peak(device, torch.float32, size=sizes.gemm_size)
    bandwidth = memory_bandwidth(device)
    ct2, ct2_types, ct2_unsupported = None, [], []
    errors = []
    try:
        import ctranslate2
    except ImportError:
        ct2_note = "ctranslate2 is not installed"
    else:
        wanted = ["float32", "float16", "bfloat16", "int8_float16"] if device.type == "cuda" \
            else list(decode_speed.CT2_COMPUTE_TYPES["cpu"])
        try:  # a build without CUDA, or a CUDA it cannot load, raises here
            supported = ctranslate2.get_supported_compute_types(device.type)
        except Exception as e:
            supported = set()
            ct2_note = f"ctranslate2 {ctranslate2.__version__} cannot run on {device.type}: {e}"
            errors.append(f"CTranslate2: {ct2_note}")
        else:
            ct2 = decode_speed.CTranslate2Models({sizes.shape_name: sizes.shape})
            ct2_note = f"ctranslate2 {ctranslate2.__version__}"
        ct2_types = [t for t in wanted if t in supported]
        ct2_unsupported = [t for t in wanted if t not in supported]
    precisions = ("int8",) if device.type == "cpu" else ()  # seqtrans's int8 decoding is for CPUs
    rows = []
    for case in sizes.decode_cases:
        try:
            with torch.no_grad():
                rows.append(decode_speed.run_case(
                    case, device, out_len=sizes.out_len, repeats=sizes.repeats, peer=True, bf16=True,
                    peak32=peak32, bandwidth=bandwidth, ct2=ct2, precisions=precisions,
                    shapes={sizes.shape_name: sizes.shape}, ct2_types=ct2_types,
                    peer_dtypes=("fp16", "bf16")))
        except Exception as e:  # one case failing leaves the others to measure
            errors.append(f"{case.name}: {type(e).__name__}: {e}")
            rows.append({"case": case.name, "error": errors[-1]})
    result = {**machine(device, ", ".join(["fp32", "bf16", *precisions])),
              "shape": {"name": sizes.shape_name, **sizes.shape},
              "gemm_peak_fp32_flops": peak32, "memory_bandwidth": bandwidth, "peer": "transformers "
              + importlib.metadata.version("transformers") + " (fp32, fp16, bf16)",
              "ct2": ct2_note, "ct2_compute_types": ct2_types, "ct2_unsupported": ct2_unsupported,
              "rows": rows}
    if errors:
        result["error"] = "; ".join(errors)
    return result


def graphs(device: torch.device, sizes: Sizes, work: Path, *, smoke: bool) -> dict[str, Any]:
    model = decode_speed.seqtrans_model(sizes.shape, device)
    backend = "aot_eager" if smoke else "inductor"  # torch.compile's
    rows, skipped, errors = [], [], []
    for runner in ("cuda_graph", "compile"):
        if runner == "cuda_graph" and device.type != "cuda":
            skipped.append({"runner": runner, "reason": "CUDA graphs need a CUDA device"})
            continue
        for batch in sizes.step_batches:
            src = decode_speed.sources(batch, sizes.shape["vocab"]).to(device)
            try:
                row = static_step.compare(model, src, out_len=sizes.step_out_len, runner=runner,
                                          backend=backend)
            except Exception as e:  # the other runner and batch still run
                errors.append(f"{runner} batch {batch}: {type(e).__name__}: {e}")
                row = {"runner": runner, "rows": batch, "error": errors[-1]}
            else:
                if not row["tokens_equal"]:
                    errors.append(f"{runner} batch {batch}: tokens differ from eager decoding")
                if runner == "compile" and row["compiled_graphs"] < len(row["buckets"]):
                    errors.append(f"compile batch {batch}: {row['compiled_graphs']} graphs for "
                                  f"{len(row['buckets'])} buckets (some steps ran eagerly)")
                if row.get("cudagraph_skips"):
                    errors.append(f"compile batch {batch}: inductor skipped CUDA graphs (see its log)")
            rows.append(row)
    result = {**machine(device, "fp32"), "shape": {"name": sizes.shape_name, **sizes.shape},
              "rows": rows, "skipped": skipped}
    if smoke:
        result["note"] = "torch.compile with aot_eager: inductor's C++ build takes minutes on a small CPU"
    if errors:
        result["error"] = "; ".join(errors)
    return result


def train(device: torch.device, sizes: Sizes, work: Path, *, smoke: bool,
          compiled: bool = False) -> dict[str, Any]:
    peak16 = gemm_peak(device, torch.bfloat16, size=sizes.gemm_size)
    b = {k: v.to(device) for k, v in train_speed.batch(sizes.train_tokens, sizes.shape["vocab"]).items()}
    target_tokens = int(b["tgt_out"].ne(PAD).sum())
    flops = train_speed.train_flops(sizes.shape, b)
    started = time.perf_counter()
    step = train_speed.seqtrans_step(sizes.shape, device, b, target_tokens, autocast=True,
                                     compiled="aot_eager" if compiled and smoke else compiled)
    if compiled:  # the first steps compile: timed apart
        step()
        synchronize(device)
    first = time.perf_counter() - started
    seconds, memory = train_speed.measure(step, device, sizes.repeats)
    name = device_name(device)
    datasheet = next((peak for chip, peak in DATASHEET_BF16.items() if chip in name), None)
    return {**machine(device, "bf16 autocast (fp32 weights)" + (", torch.compile" if compiled else "")),
            **({"compile_and_first_step_seconds": first} if compiled else {}),
            "datasheet_bf16_flops": datasheet,
            "mfu_bf16_datasheet": flops / seconds / datasheet if datasheet else None,
            "shape": {"name": sizes.shape_name, **sizes.shape},
            "sentences": b["src"].size(0), "source_tokens": int(b["src"].ne(PAD).sum()),
            "target_tokens": target_tokens, "model_gflop": round(flops / 1e9, 3),
            "step_seconds": seconds, "tokens_per_s": target_tokens / seconds,
            "gemm_peak_bf16_flops": peak16, "mfu_bf16": flops / seconds / peak16, "peak_bytes": memory}


def multi30k(device: torch.device, sizes: Sizes, work: Path, *, smoke: bool) -> dict[str, Any]:
    import seqtrans

    config = seqtrans.resolve_config("translation", preset="base", overrides=sizes.multi30k)
    out = work / f"multi30k-base-{time.strftime('%Y%m%d-%H%M%S')}"  # a new run, never one to continue
    started = time.perf_counter()
    metrics = seqtrans.run(config, out, device=device)
    precision = resolve_precision(config.train.precision, device)
    return {**machine(device, f"training {precision}, decoding {config.decode.precision}"),
            "preset": "base", "overrides": sizes.multi30k, "run_directory": str(out),
            "bleu": float(metrics["bleu"]), "chrf": float(metrics["chrf"]),
            "bleu_signature": metrics["bleu_signature"], "train_minutes": metrics["train_minutes"],
            "train_steps": metrics["train_steps"], "train_tokens_per_s": metrics["train_tokens_per_s"],
            "test_sentences": metrics["test_sentences"], "wall_minutes": (time.perf_counter() - started) / 60}


def train_compiled(device: torch.device, sizes: Sizes, work: Path, *, smoke: bool) -> dict[str, Any]:
    return train(device, sizes, work, smoke=smoke, compiled=True)


def torchrun_resume(device: torch.device, sizes: Sizes, work: Path, *, smoke: bool) -> dict[str, Any]:
    part = work / "torchrun_resume"
    part.mkdir(parents=True, exist_ok=True)
    return {**machine(device, "fp32"),
            **resume.torchrun_resume(device, part, steps=sizes.resume_steps, kill_at=sizes.resume_kill_at)}


RUNNERS: dict[str, Callable[..., dict[str, Any]]] = {
    "gpu_tests": gpu_tests, "decode_speed": decode, "step_graphs": graphs, "train_mfu": train,
    "train_compiled": train_compiled, "torchrun_resume": torchrun_resume, "multi30k": multi30k}


def run_part(name: str, device: torch.device, sizes: Sizes, work: Path, *, smoke: bool) -> dict[str, Any]:
    """One part's result with its status and seconds; an exception becomes its error."""
    started = time.perf_counter()
    try:
        result = RUNNERS[name](device, sizes, work, smoke=smoke)
    except Exception as e:
        result = {**machine(device, "unknown: the part failed"), "error": f"{type(e).__name__}: {e}",
                  "traceback": traceback.format_exc()}
    finally:  # what one part leaves cached must not shrink the next one's memory
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    result["status"] = "failed" if "error" in result else "ok"
    result["seconds"] = round(time.perf_counter() - started, 2)
    return result


def merge(paths: list[Path], out: Path, note: str | None) -> int:
    """One results file from the parts of several runs (a GPU's time too short for one command,
    or a failed part rerun): each part keeps the provenance of the file it came from, and a
    part in a later file replaces the same part in an earlier one."""
    parts: dict[str, Any] = {}
    sources = []
    for path in paths:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("benchmark") != "gpu_suite":
            raise SystemExit(f"{path}: not a gpu_suite results file")
        # the command: in the provenance, or (files from before it recorded one) beside it
        command = (data.get("provenance") or {}).get("command") or data.get("command")
        sources.append({"file": path.name, "command": command, "time": data["time"],
                        "minutes": data.get("minutes")})
        for name, part in data["parts"].items():
            parts[name] = {**part, "provenance": data.get("provenance")}
    first = json.loads(paths[0].read_text(encoding="utf-8"))
    results = {"benchmark": "gpu_suite", "smoke": first["smoke"], "merged_from": sources,
               "time": max(s["time"] for s in sources), "platform": first["platform"],
               "device": first["device"], "device_name": first["device_name"], "torch": first["torch"],
               "cuda": first["cuda"], "parts": dict(sorted(parts.items(), key=lambda p: PARTS.index(p[0]))),
               "failed_parts": [n for n, p in parts.items() if p["status"] != "ok"]}
    if note:
        results["note"] = note
    write_results(out, results, sort_keys=False)
    print(f"wrote {out}")
    return 1 if results["failed_parts"] else 0


def main(argv: list[str]) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--smoke", action="store_true",
                        help="Every part on the CPU with tiny shapes and sizes, in seconds.")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                        help="Where the parts run (--smoke: cpu).")
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS, help="Which parts to run.")
    parser.add_argument("--out", type=Path, help="Results file (default: benchmarks/results/gpu_suite.json, "
                        "or gpu_suite-smoke.json with --smoke).")
    parser.add_argument("--decode-cases", nargs="+", metavar="CASE",
                        help="Only these of decode_speed's cases, e.g. base-beam4-b1 base-beam4-b32.")
    parser.add_argument("--multi30k-set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="Settings for the Multi30k run after the suite's own, e.g. "
                        "train.max_minutes=5 to fit less time on the GPU.")
    parser.add_argument("--work", type=Path,
                        help="Where the Multi30k run and the test report go (default: a temporary "
                        "directory).")
    parser.add_argument("--merge", nargs="+", type=Path, metavar="RESULTS",
                        help="Run nothing: write --out from these results files' parts.")
    parser.add_argument("--note", help="With --merge: what a reader of the merged file should know.")
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.out or RESULTS / "gpu_suite.json", args.note)
    device = torch.device("cpu") if args.smoke else pick_device(args.device)
    sizes = SMOKE if args.smoke else FULL
    if args.multi30k_set:
        sizes = replace(sizes, multi30k=[*sizes.multi30k, *args.multi30k_set])
    if args.decode_cases:
        known = {c.name: c for c in sizes.decode_cases}
        unknown = [c for c in args.decode_cases if c not in known]
        if unknown:
            parser.error(f"--decode-cases: no case {', '.join(unknown)}; known: {', '.join(known)}")
        sizes = replace(sizes, decode_cases=[known[c] for c in args.decode_cases])
    out = args.out or RESULTS / ("gpu_suite-smoke.json" if args.smoke else "gpu_suite.json")
    started = time.perf_counter()
    results: dict[str, Any] = {
        "benchmark": "gpu_suite", "smoke": args.smoke,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"), "platform": platform.platform(),
        **machine(device, "per part"), "threads": torch.get_num_threads(), "parts": {}}
    with contextlib.ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-suite-")))
        work.mkdir(parents=True, exist_ok=True)
        for name in args.parts:
            print(f"{name} ...", flush=True)
            part = results["parts"][name] = run_part(name, device, sizes, work, smoke=args.smoke)
            print(f"{name}: {part['status']} in {part['seconds']:.1f} s" + (
                f": {part['error']}" if "error" in part else ""), flush=True)
            results["failed_parts"] = [n for n, p in results["parts"].items() if p["status"] != "ok"]
            results["minutes"] = round((time.perf_counter() - started) / 60, 2)
            out.parent.mkdir(parents=True, exist_ok=True)
            # after each part, so that a crash keeps the earlier ones
            write_results(out, results, sort_keys=False)
    print(f"wrote {out}")
    return 1 if results["failed_parts"] else 0
