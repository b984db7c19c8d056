"""The output projection's matrix-multiply forms on this CPU, against ``F.linear`` and the fastest.

What the fixed rule of ``seqtrans.linear.fp32`` picks, against ``F.linear`` and against
the fastest form.

``x @ W.T`` can be computed as ``F.linear(x, W)``, as ``(W @ x.T).T`` (the weight as the
left operand) or as ``x @ W_T`` (a contiguous transposed copy); they round differently,
so seqtrans fixes the form by the number of rows (docs/design.md, "Reproducible
decoding"). Part one times every form for the output projections of the benchmark
shapes at several row counts; part two decodes with the base shape, once with the
fixed forms and once with ``F.linear`` (``SEQTRANS_TUNE_MATMUL=0``), in the same
process. Writes ``benchmarks/results/matmul_forms-cpu.json``.

    python -m benchmarks matmul_forms [--repeats 5]
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch

from benchmarks.common import arguments, device_name, write_json
from benchmarks.decode_speed import SHAPES, seqtrans_model, sources
from seqtrans.decoding import beam_search, greedy_search
from seqtrans.linear import fp32
from seqtrans.model.transformer import Transformer
from seqtrans.runtime import environment

ROWS = [1, 2, 4, 8, 16, 21, 32, 42, 64, 84, 128, 256]
FORMS = {"f_linear": fp32._plain, "weight_first": fp32._weight_first,
         "transposed_copy": fp32._transposed}
CASES = [("greedy, batch 1", 1, 1), ("greedy, batch 32", 1, 32), ("beam 4, batch 1", 4, 1),
         ("beam 4, batch 32", 4, 32)]


def best_time(fn: Any, repeats: int, inner: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - start) / inner)
    return min(times)


def forms_table(repeats: int) -> list[dict[str, Any]]:
    rows = []
    torch.manual_seed(0)
    for name, shape in SHAPES.items():
        w = torch.randn(shape["vocab"], shape["d_model"])
        inner = max(2, int(3e8 / (w.numel() * 8)))
        for m in ROWS:
            x = torch.randn(m, shape["d_model"])
            for form in FORMS.values():
                form(x, w, None)  # warm-up; makes the transposed copy once
            seconds = {key: best_time(functools.partial(form, x, w, None), repeats, inner)
                       for key, form in FORMS.items()}
            chosen = next(key for key, form in FORMS.items() if form is fp32.form_for(m))
            fastest = min(seconds, key=seconds.__getitem__)
            row = {"shape": name, "k": shape["d_model"], "o": shape["vocab"], "rows": m, "chosen": chosen,
                   "fastest": fastest, "speedup_vs_f_linear": seconds["f_linear"] / seconds[chosen],
                   "of_fastest": seconds[fastest] / seconds[chosen],
                   **{f"{key}_us": s * 1e6 for key, s in seconds.items()}}
            rows.append(row)
            print(f"{name:<8} rows {m:>4}: chosen {chosen:<16} {row['speedup_vs_f_linear']:5.2f}x F.linear, "
                  f"{row['of_fastest']:5.2f} of the fastest ({fastest})", flush=True)
    return rows


def search(model: Transformer, src: torch.Tensor, beam: int, out_len: int) -> None:
    """Decode ``src`` to exactly ``out_len`` tokens per output."""
    max_len = torch.full((src.size(0),), out_len)
    if beam == 1:
        greedy_search(model, src, max_len=max_len, min_len=out_len)
    else:
        beam_search(model, src, beam=beam, alpha=0.6, max_len=max_len, min_len=out_len)


def decoding(repeats: int, out_len: int) -> list[dict[str, Any]]:
    shape = SHAPES["base"]
    model = seqtrans_model(shape, torch.device("cpu"))
    rows = []
    for label, beam, batch in CASES:
        decode = functools.partial(search, model, sources(batch, shape["vocab"]), beam, out_len)

        seconds: dict[str, list[float]] = {"fixed": [], "f_linear": []}
        decode()
        for _ in range(repeats):  # alternate, so that a slow spell of the machine hits both
            for key, setting in (("fixed", "1"), ("f_linear", "0")):
                with environment.setting(environment.TUNE_MATMUL, setting):
                    start = time.perf_counter()
                    decode()
                    seconds[key].append(time.perf_counter() - start)
        tokens = batch * out_len
        row = {"case": label, "fixed_tok_s": tokens / min(seconds["fixed"]),
               "f_linear_tok_s": tokens / min(seconds["f_linear"])}
        row["ratio"] = row["fixed_tok_s"] / row["f_linear_tok_s"]
        rows.append(row)
        print(f"base, {label:<17} fixed forms {row['fixed_tok_s']:8.1f} tok/s, F.linear "
              f"{row['f_linear_tok_s']:8.1f} tok/s: {row['ratio']:.2f}x", flush=True)
    return rows


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out-len", type=int, default=32)
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    device = torch.device("cpu")
    print(f"device: {device_name(device)}")
    forms = forms_table(args.repeats)
    decode = decoding(args.repeats, args.out_len)
    path = write_json("matmul_forms", {"forms": forms, "decoding": decode}, device)
    print(f"wrote {path}")
