"""CTranslate2 decoding one batch in a process of its own, for ``decode_speed``'s timing of it
under each OpenMP wait policy.

CTranslate2 bundles an OpenMP runtime of its own, which reads ``OMP_WAIT_POLICY`` once, when
it loads: each policy needs a fresh process, and one without torch, whose runtime would
otherwise be loaded beside it. The parent sets the policy in this process's environment.

    python -m benchmarks._ct2_child < SPEC.json

SPEC (JSON, on its standard input): ``model`` (a CTranslate2 model directory),
``compute_type``, ``threads``, ``beam``, ``length_penalty``, ``out_len`` (every output
exactly that long), ``batch`` (the source sentences, each a list of tokens). Builds the
translator and decodes once (its warm-up), then once more, timed; prints one JSON line:
``seconds`` (the timed decode), ``peak_mib`` (the most resident memory over building and
the warm-up, over the process's before building), ``held_mib`` (what is resident after it,
over the same start), and the OpenMP variables it ran under.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


# benchmarks.common reads these too, but importing it would load torch into this process
def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"/proc/self/status has no {field}")


def decode(spec: dict[str, Any]) -> dict[str, Any]:
    import ctranslate2

    Path("/proc/self/clear_refs").write_text("5")  # the peak from here on: not the imports'
    start = _status_mib("VmRSS")
    translator = ctranslate2.Translator(spec["model"], device="cpu", compute_type=spec["compute_type"],
                                        inter_threads=1, intra_threads=int(spec["threads"]))
    out_len = int(spec["out_len"])

    def run() -> None:
        out = translator.translate_batch(spec["batch"], beam_size=int(spec["beam"]),
                                         length_penalty=float(spec["length_penalty"]),
                                         max_decoding_length=out_len, min_decoding_length=out_len)
        if any(len(r.hypotheses[0]) != out_len for r in out):
            raise RuntimeError(f"CTranslate2 wrote outputs of other lengths than {out_len}")

    run()
    peak, held = _status_mib("VmHWM") - start, _status_mib("VmRSS") - start
    began = time.perf_counter()
    run()
    return {"seconds": time.perf_counter() - began, "peak_mib": peak, "held_mib": held,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "gomp_spincount": os.environ.get("GOMP_SPINCOUNT")}


if __name__ == "__main__":
    print(json.dumps(decode(json.load(sys.stdin))))
