"""Small decoding steps on a CPU: the int8 products of a step, and the team a step runs with.

1. **Products.** The int8 weights of one decoding step of the base shape of
   ``decode_speed.py`` (each decoder layer's self-attention, cross-attention query and
   output, and feed-forward matrices, then the output projection), multiplied in turn by
   ``rows`` activation rows, as decoding does, so that each weight comes through the
   caches after the step's other weights have been there: PyTorch's ``torch._int_mm``
   against the native product (:func:`seqtrans.native.int8_product`), for each of
   ``--rows``, in turn, ``--repeats`` steps each (medians). Reports microseconds a step and
   the weight bandwidth each achieves.
2. **A step's share.** Beam 4, batch 1 int8 decoding of the same case with one thread
   and with the process's threads: the time a step spends inside its int8 layers (each
   :class:`seqtrans.linear.int8.Int8Linear` call: quantize, product and dequantize, with
   their glue) against the whole step, and the weight bandwidth of each, against the
   fastest read of memory measured in the same run (as ``decode_speed.py`` measures it):
   what bounds batch-1 bandwidth, the products or the rest of the step.
3. **Teams.** Beam 4, batch 1 decoding of ``decode_speed.py``'s case in fp32 and int8,
   with the step teams of :mod:`seqtrans.decoding.teams` (one thread or all, timed), with
   every thread (``SEQTRANS_STEP_TEAMS=0``), and with one thread, each variant in turn,
   ``--repeats`` rounds (medians), beside ``--background-load`` CPU-burning processes.

4. **Shapes** (``--parts shapes``, not run by default). One product at a time, the same
   operands again and again, for each of ``--shape-rows`` rows, each K x O of
   ``--shapes`` and one thread and the process's threads: the native int8 product,
   PyTorch's ``torch._int_mm`` and the float32 ``F.linear`` of the same shape, and the float32
   product as fp32 decoding makes it (:class:`seqtrans.linear.onednn.OneDNNLinear`, its weight
   packed) and oneDNN's operator alone on that packed weight (what the layer adds to it is
   its own cost per call), in microseconds a call and giga operations (a multiply and an
   add each) per second. Each is the best of repeated calls
   (at least three, and for at least ``--shape-seconds``): with one thread in the process's
   CPU time, which another process's work on the machine does not add to, with more in
   wall time. The default shapes are NLLB's output layer (256 x 256,206) and its other
   layers (256 x 1,024 and 1,024 x 256), T5-small's output layer (512 x 32,128) and a
   base-size feed-forward layer (1,024 x 4,096).

Writes benchmarks/results/small_steps-LABEL-cpu.json.

    OMP_WAIT_POLICY=PASSIVE python -m benchmarks small_steps --label amd
    OMP_WAIT_POLICY=PASSIVE python -m benchmarks small_steps --background-load 2 --label amd-load2
    python -m benchmarks small_steps --parts shapes --label amd-shapes
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks import common
from benchmarks.common import arguments, background_load, timed_in_turn, write_json
from benchmarks.decode_speed import SHAPES, Case, seqtrans_decoder, sources, step_weight_bytes
from seqtrans import native
from seqtrans.decoding import teams
from seqtrans.linear.int8 import Int8Linear, _torch_product
from seqtrans.linear.onednn import OneDNNLinear, row_bucket
from seqtrans.runtime import environment

CPU = torch.device("cpu")
PARTS = ("products", "share", "teams", "shapes")
#: K x O of the shapes part's products (see the module's notes)
SHAPES_K_O = ["256x256206", "256x1024", "1024x256", "512x32128", "1024x4096"]


def step_weights(shape: dict[str, int]) -> list[torch.Tensor]:
    """The int8 weights [O, K] a decoding step multiplies by, in the order it does."""
    d, f, v = shape["d_model"], shape["d_ff"], shape["vocab"]
    layer = [(3 * d, d), (d, d), (d, d), (d, d), (f, d), (d, f)]  # self qkv and out, cross q and out, FFN
    g = torch.Generator().manual_seed(0)
    return [torch.randint(-127, 128, size, dtype=torch.int8, generator=g)
            for size in layer * shape["layers"] + [(v, d)]]


def _step(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
          pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Callable[[], None]:
    """A step's products by ``fn``: each (activations, weight) of ``pairs`` in turn."""
    def run() -> None:
        for a, w in pairs:
            fn(a, w)
    return run


def products(rows: list[int], repeats: int) -> list[dict[str, Any]]:
    """Each of ``rows``: a step's products by PyTorch and natively, in turn, medians."""
    weights = step_weights(SHAPES["base"])
    step_bytes = sum(w.numel() for w in weights)
    out = []
    for m in rows:
        g = torch.Generator().manual_seed(m)
        widths = {w.size(1) for w in weights}
        x = {k: torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=g) for k in widths}
        pairs = [(x[w.size(1)], w) for w in weights]
        for a, w in pairs:  # the same integers, or the timing would mean nothing
            if not torch.equal(native.int8_product(a, w), _torch_product(a, w)):
                raise AssertionError(f"the products differ at {m} rows, {tuple(w.shape)}")
        runs = {"torch": _step(_torch_product, pairs), "native": _step(native.int8_product, pairs)}
        for run in runs.values():
            run()
        seconds = timed_in_turn(runs, CPU, repeats=repeats)
        row: dict[str, Any] = {"rows": m, "step_weight_bytes": step_bytes}
        for key, value in seconds.items():
            row[f"{key}_us"] = value * 1e6
            row[f"{key}_gb_s"] = step_bytes / value / 1e9
        row["native_speedup"] = seconds["torch"] / seconds["native"]
        out.append(row)
        print(f"{m:>3} rows: PyTorch {row['torch_us']:8.0f} us ({row['torch_gb_s']:.1f} GB/s), native "
              f"{row['native_us']:8.0f} us ({row['native_gb_s']:.1f} GB/s): {row['native_speedup']:.2f}x",
              flush=True)
    return out


def best_seconds(fn: Callable[[], Any], *, wall: bool, seconds: float, least: int = 3) -> float:
    """The least time of a call of ``fn`` over at least ``least`` calls and ``seconds`` in all:
    wall time where ``wall``, else the process's CPU time."""
    clock = time.perf_counter if wall else time.process_time
    best, spent, calls = float("inf"), 0.0, 0
    while calls < least or spent < seconds:
        start = clock()
        fn()
        took = clock() - start
        best, spent, calls = min(best, took), spent + took, calls + 1
    return best


def shape_products(rows: list[int], shapes: list[tuple[int, int]], seconds: float) -> list[dict[str, Any]]:
    """Each thread count, shape (K, O) and row count: the native int8 product, PyTorch's and
    the float32 F.linear, in giga operations per second (the best call; see the module's notes)."""
    threads = torch.get_num_threads()
    out = []
    for team in sorted({1, threads}):  # one thread first: a team's threads may still spin after it
        torch.set_num_threads(team)
        try:
            for k, o in shapes:
                out.extend(_shape_rows(rows, k, o, team, seconds))
        finally:
            torch.set_num_threads(threads)
    return out


def _shape_rows(rows: list[int], k: int, o: int, team: int, seconds: float) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(k + o)
    w = torch.randint(-127, 128, (o, k), dtype=torch.int8, generator=g)
    w_float = w.to(torch.float32)
    layer = OneDNNLinear(w_float)
    out = []
    for m in rows:
        x = torch.randint(1, 256, (m, k), dtype=torch.uint8, generator=g)
        x_float = x.to(torch.float32)
        # the rows the layer gives the operator
        padded = torch.cat([x_float, x_float.new_zeros(row_bucket(m) - m, k)])
        if not torch.equal(native.int8_product(x, w), _torch_product(x, w)):
            raise AssertionError(f"the products differ at {m} rows, {k} x {o}, {team} thread(s)")
        ways: dict[str, Callable[[], Any]] = {
            "native": functools.partial(native.int8_product, x, w),
            "torch": functools.partial(_torch_product, x, w),
            "fp32": functools.partial(F.linear, x_float, w_float),
            "onednn": functools.partial(layer, x_float),
            "onednn_op": functools.partial(_operator_calls, padded, layer.packed_weights)}
        row: dict[str, Any] = {"k": k, "o": o, "rows": m, "threads": team}
        for key, fn in ways.items():
            best = best_seconds(fn, wall=team > 1, seconds=seconds)
            row[f"{key}_us"] = best * 1e6
            row[f"{key}_gops"] = 2 * m * k * o / best / 1e9
        out.append(row)
        print(f"{k:>5} x {o:<6} {m:>3} rows, {team} thread(s): native {row['native_gops']:6.1f}, "
              f"_int_mm {row['torch_gops']:6.1f}, fp32 {row['fp32_gops']:6.1f} GOPS; fp32 us a call: "
              f"F.linear {row['fp32_us']:.1f}, oneDNN layer {row['onednn_us']:.1f}, "
              f"its operator {row['onednn_op_us']:.1f}", flush=True)
    return out


def _operator_calls(x: Any, blocks: tuple[Any, ...]) -> None:
    """oneDNN's operator over each block of a packed weight, as the layer calls it."""
    for block in blocks:
        torch.ops.mkldnn._linear_pointwise(x, block, None, "none", [], "")


def step_share(repeats: int, out_len: int, bound: float) -> list[dict[str, Any]]:
    """Beam 4, batch 1 int8 decoding with one thread and with every thread: the seconds a
    step spends in its int8 layers against the whole step (medians of ``repeats`` decodes)."""
    case = Case("base", 4, 1)
    shape = SHAPES["base"]
    src = sources(case.batch, shape["vocab"])
    decode = seqtrans_decoder(case, CPU, src, out_len, precision="int8")
    step_bytes = step_weight_bytes(shape, precision="int8")
    inside = [0.0]
    forward = Int8Linear.forward

    def timed_forward(self: Int8Linear, x: torch.Tensor, *, relu: bool = False) -> torch.Tensor:
        start = time.perf_counter()
        try:
            return forward(self, x, relu=relu)
        finally:
            inside[0] += time.perf_counter() - start

    threads = torch.get_num_threads()
    out = []
    Int8Linear.forward = timed_forward  # type: ignore[method-assign]
    try:
        for team in sorted({1, threads}):
            torch.set_num_threads(team)
            try:
                decode()
                totals, layers = [], []
                for _ in range(repeats):
                    inside[0] = 0.0
                    start = time.perf_counter()
                    decode()
                    totals.append(time.perf_counter() - start)
                    layers.append(inside[0])
            finally:
                torch.set_num_threads(threads)
            steps = out_len + 1  # the end symbol's step too
            step_s, layers_s = statistics.median(totals) / steps, statistics.median(layers) / steps
            row = {"threads": team, "step_us": step_s * 1e6, "int8_layers_us": layers_s * 1e6,
                   "int8_layers_share": layers_s / step_s, "step_weight_bytes": step_bytes,
                   "step_gb_s": step_bytes / step_s / 1e9, "int8_layers_gb_s": step_bytes / layers_s / 1e9,
                   "read_bound_gb_s": bound / 1e9, "step_of_bound": step_bytes / step_s / bound,
                   "int8_layers_of_bound": step_bytes / layers_s / bound}
            out.append(row)
            print(f"{team} thread(s): step {row['step_us']:.0f} us ({row['step_gb_s']:.1f} GB/s, "
                  f"{row['step_of_bound']:.0%} of {bound / 1e9:.1f}), "
                  f"int8 layers {row['int8_layers_us']:.0f} us "
                  f"({row['int8_layers_share']:.0%} of the step; {row['int8_layers_gb_s']:.1f} GB/s, "
                  f"{row['int8_layers_of_bound']:.0%})", flush=True)
    finally:
        Int8Linear.forward = forward  # type: ignore[method-assign]
    return out


def team_variants(repeats: int, out_len: int) -> list[dict[str, Any]]:
    """Beam 4, batch 1 decoding in fp32 and int8 under each team policy, in turn."""
    case = Case("base", 4, 1)
    src = sources(case.batch, SHAPES["base"]["vocab"])
    threads = torch.get_num_threads()
    decoders = {p: seqtrans_decoder(case, CPU, src, out_len, precision=p) for p in ("fp32", "int8")}

    def variant(precision: str, policy: str) -> Callable[[], None]:
        def run() -> None:
            os.environ[environment.STEP_TEAMS] = "0" if policy != "teams" else "1"
            torch.set_num_threads(1 if policy == "one thread" else threads)
            try:
                decoders[precision]()
            finally:
                torch.set_num_threads(threads)
                os.environ.pop(environment.STEP_TEAMS, None)
        return run

    policies = ("teams", "every thread", "one thread")
    runs = {(p, policy): variant(p, policy) for p in decoders for policy in policies}
    for run in runs.values():
        run()
    times: dict[tuple[str, str], list[float]] = {key: [] for key in runs}
    for _ in range(repeats):
        for key, run in runs.items():
            start = time.perf_counter()
            run()
            times[key].append(time.perf_counter() - start)
    out = []
    for (precision, policy), values in times.items():
        tok_s = out_len / statistics.median(values)
        out.append({"precision": precision, "policy": policy,
                    "threads": 1 if policy == "one thread" else threads, "tok_s": tok_s,
                    "runs_tok_s": [out_len / v for v in values]})
        print(f"{precision} {policy:<13} {tok_s:8.1f} tok/s", flush=True)
    return out


def _shape(text: str) -> tuple[int, int]:
    k, _, o = text.partition("x")
    return int(k), int(o)


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS[:3]),
                        help="What to measure (default: products share teams).")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16],
                        help="Activation rows of the products (a step's hypotheses).")
    parser.add_argument("--repeats", type=int, default=9, help="Timed steps or decodes of each (median).")
    parser.add_argument("--out-len", type=int, default=32, help="Target tokens per output (teams).")
    parser.add_argument("--shapes", type=_shape, nargs="+", default=[_shape(s) for s in SHAPES_K_O],
                        metavar="KxO", help="Inputs x outputs of the shapes part's products.")
    parser.add_argument("--shape-rows", type=int, nargs="+", default=[4, 16, 64, 128],
                        help="Activation rows of the shapes part's products.")
    parser.add_argument("--shape-seconds", type=float, default=0.5,
                        help="Least time spent on each of the shapes part's measurements.")
    parser.add_argument("--background-load", type=int, default=0, metavar="N",
                        help="CPU-burning processes beside everything (default 0).")
    parser.add_argument("--label", default="", help="Write small_steps-LABEL-cpu.json.")
    args = parser.parse_args(argv)
    if args.background_load < 0:
        parser.error(f"--background-load: 0 or more processes, got {args.background_load}")
    if not native.int8_product_available():
        reason = native.unavailable_reason() or "no AVX-512 VNNI or AVX2"
        parser.error(f"the native int8 product is not built here ({reason})")
    torch.set_grad_enabled(False)
    print(f"{torch.get_num_threads()} threads, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '')}")
    results: dict[str, Any] = {"background_load": args.background_load,
                               "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
    # the fastest read of memory, measured before any burner starts, as decode_speed.py does
    bound = max(common.memory_bandwidth(CPU), common.read_bandwidth(CPU)) if "share" in args.parts else 0.0
    with background_load(args.background_load):
        if "products" in args.parts:
            results["products"] = products(args.rows, args.repeats)
        if "share" in args.parts:
            results["step_share"] = step_share(args.repeats, args.out_len, bound)
        if "teams" in args.parts:
            results["teams"] = team_variants(args.repeats, args.out_len)
            results["team_settings"] = {"small_step_rows": teams.SMALL_STEP_ROWS, "trials": teams.TRIALS}
        if "shapes" in args.parts:
            results["shapes"] = shape_products(args.shape_rows, args.shapes, args.shape_seconds)
    name = "small_steps" + (f"-{args.label}" if args.label else "")
    path = write_json(name, results, CPU)
    print(f"wrote {path}")
