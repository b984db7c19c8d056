"""decode_speed times CTranslate2 at its best OpenMP wait policy, each in processes of its own."""

from __future__ import annotations

import pytest
import torch

from benchmarks import common, decode_speed
from seqtrans.errors import UsageError

TINY = {"tiny": {"layers": 1, "d_model": 16, "d_ff": 32, "heads": 2, "vocab": 40}}


def test_the_wait_policies_are_read_from_the_option() -> None:
    assert decode_speed.ct2_policies_of("default,active,passive") == ("default", "active", "passive")
    assert decode_speed.ct2_policies_of(" Active, 3000,active") == ("active", "3000")
    assert decode_speed.ct2_policies_of("here") == ()
    with pytest.raises(UsageError, match="'spinning'"):
        decode_speed.ct2_policies_of("active,spinning")
    with pytest.raises(UsageError, match="no policy given"):
        decode_speed.ct2_policies_of(" , ")


def test_a_function_that_times_itself_is_taken_at_its_word() -> None:
    fns = {"own": lambda: 5.0, "clock": lambda: None}
    seconds = common.timed_in_turn(fns, torch.device("cpu"), repeats=3)
    assert seconds["own"] == 5.0
    assert 0 <= seconds["clock"] < 1


def test_an_active_parent_or_an_unknown_policy_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as bad:
        decode_speed.main(["--ct2-policies", "default,spinning"])
    assert bad.value.code == 2 and "--ct2-policies:" in capsys.readouterr().err
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    with pytest.raises(SystemExit) as spinning:
        decode_speed.main(["--cases", "small-beam4-b1", "--device", "cpu"])
    assert spinning.value.code == 2 and "would spin beside" in capsys.readouterr().err


def test_ctranslate2_is_timed_under_each_policy_in_its_own_process(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ctranslate2")
    # this process's own settings, which no child may inherit
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("GOMP_SPINCOUNT", "7")
    case = decode_speed.Case("tiny", 2, 3)
    models = decode_speed.CTranslate2Models(TINY)
    src = decode_speed.sources(3, 40)
    policies = ("default", "active", "300")
    processes = {p: decode_speed.CTranslate2Process(case, src, 5, path=models.path("tiny"),
                                                    compute_type="int8", policy=p)
                 for p in policies}
    for policy, process in processes.items():
        assert 0 < process() < 60 and process.peak_mib > 0
        # each process sees its own policy, whatever this one's environment says
        assert (process.reported["omp_wait_policy"], process.reported["gomp_spincount"]) == {
            "default": (None, None), "active": ("ACTIVE", None), "300": (None, "300")}[policy]
    row = decode_speed.run_case(case, torch.device("cpu"), out_len=5, repeats=1, peer=False, bf16=False,
                                peak32=1e9, bandwidth=1e9, ct2=models, shapes=TINY, ct2_types=("int8",),
                                ct2_policies=policies)
    speeds = {p: row[f"ct2_int8_{p}_tok_s"] for p in policies}
    best = max(speeds, key=speeds.__getitem__)
    assert row["ct2_int8_best_policy"] == best and row["ct2_int8_tok_s"] == speeds[best]
    assert row["ratio_vs_ct2_int8"] == row["seqtrans_tok_s"] / speeds[best]
    assert row["ct2_int8_peak_mib"] > 0 and "ct2_int8_held_mib" in row
    decode_speed.print_row(row, (), ct2_types=("int8",), ct2_policies=policies)
    printed = capsys.readouterr().out
    assert f"int8 {row['ct2_int8_tok_s']:.1f} tok/s" in printed and f"with {best}" in printed
    assert all(f"int8 {p} {speeds[p]:.1f}" in printed for p in policies)
