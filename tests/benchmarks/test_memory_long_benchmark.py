"""``python -m benchmarks memory_long --smoke`` trains, times and profiles scaled-dot and
memory attention on Multi30k documents, so that the benchmark cannot rot between its runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import memory_long
from conftest import ROOT

MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def test_the_models_differ_only_in_their_encoder_decoder_attention() -> None:
    settings = memory_long.models([16, 64])
    assert list(settings) == ["scaled-dot", "memory-K16", "memory-K16-local", "memory-K64",
                              "memory-K64-local"]
    assert settings["scaled-dot"] == (0, [])
    slots, local = settings["memory-K64-local"]
    assert slots == 64 and "model.memory_slots=64" in local and "model.memory_local_width=1" in local
    assert [s for s in local if s not in settings["memory-K64"][1]] == ["model.memory_local_width=1"]


def test_memory_rows_are_compared_with_scaled_dot() -> None:
    rows = [{"slots": 0, "bleu": 20.0, "b1_seconds": 10.0, "b32_seconds": 4.0, "median_source_tokens": 128},
            {"slots": 32, "bleu": 19.5, "b1_seconds": 8.0, "b32_seconds": 5.0, "median_source_tokens": 128},
            {"slots": 64, "bleu": 21.0, "b1_seconds": 5.0, "b32_seconds": 2.0, "median_source_tokens": 128}]
    memory_long.against_scaled_dot(rows)
    compared = ("b1_speedup", "b32_speedup", "bleu_difference", "target_met")
    assert {key: rows[1][key] for key in compared} == {"b1_speedup": 1.25, "b32_speedup": 0.8,
                                                       "bleu_difference": -0.5, "target_met": True}
    assert rows[2]["b1_speedup"] == 2.0 and rows[2]["target_met"] is False  # 64 slots: half the source
    assert "b1_speedup" not in rows[0]


@pytest.mark.skipif(not MULTI30K.is_dir(), reason="needs the shared Multi30k files")
def test_the_smoke_run_measures_every_field(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    smoke = ["--smoke", "--mirror", str(MULTI30K), "--work", str(tmp_path / "work"), "--out", str(out),
             "--slots", "16", "--models"]
    memory_long.main([*smoke, "scaled-dot", "--train-only"])  # trained beside the run below, timed by it
    trained = tmp_path / "work" / "scaled-dot" / "metrics.json"
    assert trained.is_file() and not out.exists()
    before = trained.stat().st_mtime_ns
    memory_long.main([*smoke, "scaled-dot", "memory-K16"])
    assert trained.stat().st_mtime_ns == before  # reused, not trained again
    data = json.loads(out.read_text())
    assert [r["model"] for r in data["rows"]] == ["scaled-dot", "memory-K16"]
    for r in data["rows"]:
        assert r["b1_seconds"] > 0 and r["b32_seconds"] > 0 and r["documents"] == 2
        assert r["output_length"] == 8 and r["updates"] == 2 and r["test_documents"] == 2
        assert 0 <= r["bleu"] <= 100 and 0 <= r["timed_bleu"] <= 100
        assert r["median_source_tokens"] > 8 * 5  # eight sentences a document
        assert r["b32_peak_mib"] >= 0 and r["process_peak_mib"] > 0
        assert len(r["rounds"][0]["b1"]["load_before"]) == 3
    assert data["rows"][1]["slots"] == 16 and "b1_speedup" in data["rows"][1]
    assert [p["model"] for p in data["profile"]] == ["scaled-dot", "memory-K16"]
    for p in data["profile"]:
        assert 0 < p["b1"]["attention_share"] < 1 and p["b32"]["operations"]
    assert "data.join_lines=8" in data["settings"] and data["provenance"]["command"] is None
