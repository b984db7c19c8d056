"""``python -m benchmarks gpu_suite --smoke`` runs every part on the CPU and writes each
one's results; a part that fails is recorded and the others still run. The smoke run
leaves out ``torchrun_resume`` (four torchrun jobs, a minute of CPU): the kill and
resume of a run under torchrun are tested in tests/training/test_distributed_jobs.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import gpu_suite as suite
from benchmarks.common import running
from benchmarks.gpu_suite import static_step
from conftest import ROOT, SHARED_DATA, tiny_model
from seqtrans.data.vocab import EOS, PAD


@pytest.mark.slow
def test_the_smoke_run_measures_every_part(tmp_path: Path) -> None:
    out = tmp_path / "suite.json"
    env = {**os.environ, "SEQTRANS_MIRROR": str(SHARED_DATA / "multi30k"),
           "SEQTRANS_CACHE_DIR": str(tmp_path / "cache")}
    parts = [p for p in suite.PARTS if p != "torchrun_resume"]
    done = subprocess.run([sys.executable, "-m", "benchmarks", "gpu_suite", "--smoke", "--out", str(out),
                           "--work", str(tmp_path), "--parts", *parts], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(out.read_text())
    assert results["smoke"] and results["failed_parts"] == []
    parts = results["parts"]
    assert list(parts) == ["gpu_tests", "decode_speed", "step_graphs", "train_mfu", "train_compiled",
                           "multi30k"]
    for name, part in parts.items():
        assert part["status"] == "ok" and "error" not in part, name
        tested = "cuda" if name == "gpu_tests" and torch.cuda.is_available() else "cpu"
        assert part["device"] == tested and part["device_name"] and part["dtype"], name
        assert part["torch"] == torch.__version__ and part["seconds"] > 0, name

    tests = parts["gpu_tests"]
    assert tests["failed"] == tests["errors"] == 0 and tests["skipped"] > 0
    assert "tests/test_gpu.py" in tests["files"]
    if not torch.cuda.is_available():
        assert tests["passed"] == 0  # every GPU test skips without CUDA

    decode = parts["decode_speed"]
    assert [r["case"] for r in decode["rows"]] == ["tiny-greedy-b1", "tiny-beam2-b2"]
    for row in decode["rows"]:
        ct2 = [f"ct2_{t}_tok_s" for t in decode["ct2_compute_types"]]
        for key in ("seqtrans_tok_s", "seqtrans_bf16_tok_s", "seqtrans_int8_tok_s", "hf_tok_s",
                    "hf_fp16_tok_s", "hf_bf16_tok_s", *ct2):
            assert row[key] > 0, key
    if decode["ct2"].startswith("ctranslate2 "):
        assert decode["ct2_compute_types"] == ["float32", "int8"]

    graphs = parts["step_graphs"]
    assert graphs["skipped"] == [{"runner": "cuda_graph", "reason": "CUDA graphs need a CUDA device"}]
    assert [(r["runner"], r["rows"]) for r in graphs["rows"]] == [("compile", 1), ("compile", 2)]
    for row in graphs["rows"]:
        assert row["tokens_equal"] and row["static_eager_tokens_equal_reference"]
        assert row["buckets"] == [16, 32] and row["static_eager_max_abs_logit_diff"] < 1e-4
        assert row["compiled_graphs"] == 2 and row["backend"] == "aot_eager"  # one per bucket, none eager
        assert row["compile_step_ms"] > 0 and row["reference_step_ms"] > 0

    train = parts["train_mfu"]
    assert train["target_tokens"] > 100 and train["tokens_per_s"] > 0 and train["mfu_bf16"] > 0
    if train["device"] == "cuda":  # on a CPU the smoke run's GEMM peak, timed on a busy machine, can be
        assert train["mfu_bf16"] < 1  # below what the step got, so the ratio says nothing there
    assert train["dtype"].startswith("bf16")
    compiled = parts["train_compiled"]
    assert compiled["dtype"].endswith("torch.compile") and compiled["compile_and_first_step_seconds"] > 0
    assert compiled["target_tokens"] == train["target_tokens"] and compiled["tokens_per_s"] > 0
    assert compiled["mfu_bf16_datasheet"] is None  # no datasheet peak for a CPU

    multi30k = parts["multi30k"]
    assert 0 <= multi30k["bleu"] <= 100 and multi30k["train_steps"] == 4
    assert multi30k["test_sentences"] == 1000 and multi30k["preset"] == "base"
    assert (Path(multi30k["run_directory"]) / "metrics.json").is_file()


def test_a_failing_part_is_recorded_and_the_others_still_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    def fails(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise RuntimeError("out of memory")

    monkeypatch.setitem(suite.RUNNERS, "train_mfu", fails)
    monkeypatch.setitem(suite.RUNNERS, "multi30k", lambda *args, **kwargs: {
        **suite.machine(torch.device("cpu"), "fp32"), "bleu": 1.0})
    out = tmp_path / "suite.json"
    code = suite.main(["--smoke", "--parts", "train_mfu", "multi30k", "--out", str(out)])
    assert code == 1
    results = json.loads(out.read_text())
    assert results["failed_parts"] == ["train_mfu"]
    failed, ran = results["parts"]["train_mfu"], results["parts"]["multi30k"]
    assert failed["status"] == "failed" and failed["error"] == "RuntimeError: out of memory"
    assert "raise RuntimeError" in failed["traceback"] and failed["torch"] == torch.__version__
    assert ran["status"] == "ok" and ran["bleu"] == 1.0
    assert "train_mfu: failed in" in capsys.readouterr().out


def test_parts_of_several_runs_merge_into_one_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = {"first": {"train_mfu": 1.0, "multi30k": 2.0}, "rerun": {"train_mfu": 3.0}}
    for name, bleus in runs.items():
        for part, bleu in bleus.items():
            monkeypatch.setitem(suite.RUNNERS, part, lambda *args, bleu=bleu, **kwargs: {
                **suite.machine(torch.device("cpu"), "fp32"), "bleu": bleu})
        with running(["python", "-m", "benchmarks", "gpu_suite", "--parts", *bleus]):
            suite.main(["--smoke", "--parts", *bleus, "--out", str(tmp_path / f"{name}.json")])
    out = tmp_path / "merged.json"
    code = suite.main(["--merge", str(tmp_path / "first.json"), str(tmp_path / "rerun.json"),
                       "--out", str(out), "--note", "two GPU runs"])
    assert code == 0
    merged = json.loads(out.read_text())
    assert list(merged["parts"]) == ["train_mfu", "multi30k"]  # in the suite's order
    assert merged["parts"]["train_mfu"]["bleu"] == 3.0 and merged["parts"]["multi30k"]["bleu"] == 2.0
    assert merged["parts"]["multi30k"]["provenance"]["commit"] == merged["provenance"]["commit"]
    assert [s["file"] for s in merged["merged_from"]] == ["first.json", "rerun.json"]
    assert merged["merged_from"][1]["command"] == "python -m benchmarks gpu_suite --parts train_mfu"
    assert merged["note"] == "two GPU runs" and merged["failed_parts"] == []
    (tmp_path / "other.json").write_text(json.dumps({"benchmark": "decode_speed"}))
    with pytest.raises(SystemExit, match="other.json: not a gpu_suite results file"):
        suite.main(["--merge", str(tmp_path / "other.json"), "--out", str(out)])


@pytest.mark.parametrize("options", [
    {},
    {"norm": "pre", "positions": "learned", "embedding_norm": True, "output_bias": True, "tie_output": False},
])
def test_the_static_step_decodes_as_the_model_does(options: dict[str, Any]) -> None:
    model = tiny_model(vocab=23, seed=4, **options)
    if model.output_bias is not None:
        with torch.no_grad():
            model.output_bias.normal_()  # zeros at first: make it count
    src = torch.tensor([[5, 6, 7, 8, EOS], [9, 10, EOS, PAD, PAD], [11, EOS, PAD, PAD, PAD]])
    with torch.no_grad():
        ref_tokens, ref_logits, _ = static_step.reference(model, src, 20)
        step = static_step.StaticStep(model, src, capacity=32)
        tokens, logits, _ = static_step.greedy(step, 3, 20, torch.device("cpu"))
    assert torch.equal(tokens, ref_tokens)  # 20 steps: over the first bucket's 16 positions
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)


def test_the_static_step_refuses_attention_it_does_not_have() -> None:
    model = tiny_model(decoder_attention="additive")
    with pytest.raises(ValueError, match="plain scaled dot-product attention only"):
        static_step.StaticStep(model, torch.tensor([[5, EOS]]), capacity=16)
