"""Loading a run holds its weights in memory once: the model is built without writing
its parameters (pages never written are never resident), then takes the checkpoint's
tensors. Measured in a fresh process, so that the resident set is this build's alone."""

from __future__ import annotations

import json
import subprocess
import sys

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
