"""Loading a run holds its weights in memory once: the model is built without writing
its parameters (pages never written are never resident), then takes the checkpoint's
tensors, all of them or an error. Memory is measured in a fresh process, so that the
resident set is that build's alone."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_inference import copy_run

from seqtrans.data.vocab import BOS, EOS
from seqtrans.errors import CheckpointError, ConfigError
from seqtrans.inference.loading import load
from seqtrans.linear.quantize import int8_only, is_int8_only

SCRIPT = """
import json, sys
from pathlib import Path
import torch
from torch import nn
from seqtrans.inference.loading import _Unwritten

def rss():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

before = rss()
if sys.argv[1] == "unwritten":
    with _Unwritten():
        table = nn.Embedding(200_000, 128)  # 98 MiB
        pos = torch.arange(4.0).mul_(2)  # not a parameter: computed as usual
else:
    table = nn.Embedding(200_000, 128)
    pos = torch.arange(4.0).mul_(2)
print(json.dumps({"growth_mib": rss() - before, "pos": pos.tolist()}))
"""


def _growth(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], check=True, capture_output=True, text=True)
    return json.loads(done.stdout)


def test_parameters_are_not_written_while_a_model_to_be_loaded_is_built() -> None:
    written, unwritten = _growth("written"), _growth("unwritten")
    assert written["growth_mib"] > 90  # the measurement sees an initialised table
    assert unwritten["growth_mib"] < 10
    assert unwritten["pos"] == written["pos"] == [0.0, 2.0, 4.0, 6.0]


def test_a_checkpoint_missing_a_tensor_is_refused_rather_than_left_unwritten(tmp_path: Path) -> None:
    run = copy_run(tmp_path / "run", seed=0, change=lambda w: w.pop("encoder.0.ffn.inner.weight"))
    with pytest.raises(CheckpointError, match=r"(?s)weights do not fit the model of its config.*"
                                              r"encoder\.0\.ffn\.inner\.weight"):
        load(run, device="cpu")


def test_weights_stored_in_another_dtype_load_as_the_models(tmp_path: Path) -> None:
    expected: dict[str, torch.Tensor] = {}

    def halve(weights: dict[str, torch.Tensor]) -> None:
        expected.update(weights)
        for k, v in weights.items():
            if v.is_floating_point():
                weights[k] = v.to(torch.bfloat16)

    run = copy_run(tmp_path / "run", seed=0, change=halve)
    loaded = load(run, device="cpu").model
    src = torch.tensor([[4, 5, 6, EOS]])
    tgt = torch.tensor([[BOS, 4, 5]])
    for name, tensor in loaded.state_dict().items():
        assert tensor.dtype == expected[name].dtype
        assert torch.equal(tensor, expected[name].to(torch.bfloat16).to(tensor.dtype))
    with torch.no_grad():
        assert torch.isfinite(loaded(src, tgt)).all()


def test_a_run_loaded_in_int8_keeps_only_int8_weights_and_decodes_as_its_int8_copy(tmp_path: Path) -> None:
    def larger(weights: dict[str, torch.Tensor]) -> None:  # so that outputs depend on the input
        g = torch.Generator().manual_seed(1)
        for name, tensor in weights.items():
            if "norm" not in name:
                tensor.normal_(0.0, 0.5, generator=g)

    run = copy_run(tmp_path / "run", seed=0, change=larger)
    loaded = load(run, overrides=["decode.precision=int8", "decode.beam=2"], device="cpu")
    assert is_int8_only(loaded.model)
    reference = dataclasses.replace(loaded, model=int8_only(load(run, device="cpu").model))
    lines = ["4 5 6 7 1", "7 8", "9 9 2 3"]
    ours, theirs = (r.decode([r.task.parse_source(x) for x in lines])[1] for r in (loaded, reference))
    assert [[(h.tokens, h.score) for h in hyps] for hyps in ours] == [
        [(h.tokens, h.score) for h in hyps] for hyps in theirs]
    assert len({tuple(h[0].tokens) for h in ours}) > 1  # outputs that depend on the input
    with pytest.raises(ConfigError, match=r"decode\.precision.*fp32 needs the float weights"):
        loaded.decode([[4, 5]], decode=dataclasses.replace(loaded.config.decode, precision="fp32"))


def test_a_run_that_decodes_in_int8_still_exports_its_float_weights(tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2")
    from seqtrans.inference.export import export

    run = copy_run(tmp_path / "run", seed=0, model=("decode.precision=int8",))
    assert is_int8_only(load(run, device="cpu").model)
    out = export(run, to="ctranslate2", out=tmp_path / "ct2")
    floats = sum(p.numel() for p in load(run, overrides=["decode.precision=fp32"]).model.parameters())
    assert (out / "model.bin").stat().st_size > 2 * floats  # 4 bytes a weight, not 1


def test_a_missing_or_unreadable_checkpoint_names_the_runs_other_checkpoints(tmp_path: Path) -> None:
    run = copy_run(tmp_path / "run", seed=0)
    folder = run / "checkpoints"
    for name in ("best.pt", "checkpoint_00000002.pt", "checkpoint_00000004.pt"):
        (folder / name).write_bytes((folder / "average.pt").read_bytes())
    (folder / "checkpoint_00000006.pt").write_bytes(b"cut short")  # not in torch's format: not offered
    others = re.escape(f"the run's other checkpoints: {folder / 'average.pt'}, {folder / 'best.pt'}, "
                       f"{folder / 'checkpoint_00000004.pt'}, {folder / 'checkpoint_00000002.pt'}")
    with pytest.raises(CheckpointError, match=r"^.*checkpoint_00000009.pt: no such checkpoint file or run "
                                              rf"directory; {others}$"):
        load(folder / "checkpoint_00000009.pt", device="cpu")
    with pytest.raises(CheckpointError,
                       match=rf"(?s)^.*checkpoint_00000006.pt: not a readable checkpoint .*; {others}$"):
        load(folder / "checkpoint_00000006.pt", device="cpu")
    (folder / "average.pt").write_bytes(b"")  # the run's default, unreadable: the others are named
    with pytest.raises(CheckpointError, match=r"(?s)average.pt: not a readable checkpoint .*; the run's "
                                              rf"other checkpoints: {re.escape(str(folder / 'best.pt'))}, "):
        load(run, device="cpu")
    with pytest.raises(CheckpointError, match=r"^\S+nowhere: no such checkpoint file or run directory$"):
        load(tmp_path / "nowhere", device="cpu")
