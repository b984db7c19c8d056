"""pretrained_families times each system under each OpenMP wait policy in a child of its own
and compares seqtrans with CTranslate2 at CTranslate2's best (the children replaced here by
what they would report: building and decoding the models is the benchmark's own run)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from benchmarks import pretrained_families as families

SPEEDS = {("seqtrans", "default"): 50.0, ("seqtrans", "active"): 60.0, ("seqtrans", "passive"): 40.0,
          ("ct2", "default"): 80.0, ("ct2", "active"): 30.0, ("ct2", "passive"): 70.0}


def test_each_system_runs_under_each_policy_and_meets_ctranslate2_at_its_best(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the parent's own, which no child may inherit
    seen: list[tuple[str, str, dict[str, str]]] = []

    def child(args: list[str], *, env: dict[str, str] | None = None) -> dict[str, Any]:
        assert env is not None
        system = args[args.index("--phase") + 1]
        policy = env["SEQTRANS_WAIT_POLICY"]
        seen.append((system, policy, env))
        return {"tokens": 100, "seconds": 100 / SPEEDS[system, policy], "peak_mib": 10.0}

    monkeypatch.setattr(families, "_child", child)
    args = argparse.Namespace(repeats=2)
    row = families._case(args, tmp_path, [], "2", "int8", 4)

    assert sorted({(s, p) for s, p, _ in seen}) == sorted(SPEEDS) and len(seen) == 2 * len(SPEEDS)
    for _, policy, env in seen:
        expected = {"default": None, "active": "ACTIVE", "passive": "PASSIVE"}[policy]
        assert env.get("OMP_WAIT_POLICY") == expected, policy
        assert env["THREADS"] == env["SEQTRANS_THREADS"] == env["OMP_NUM_THREADS"] == "2"
    assert row["ct2_best_policy"] == "default" and row["seqtrans_best_policy"] == "active"
    assert row["seqtrans_tok_s"] == SPEEDS["seqtrans", "passive"]  # the policy the command sets
    assert row["ratio_vs_ct2_best"] == pytest.approx(40 / 80)
    assert row["best_ratio_vs_ct2_best"] == pytest.approx(60 / 80)
    assert row["ratios"] == [pytest.approx(60 / 80)] * 2
