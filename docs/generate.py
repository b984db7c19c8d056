"""Rewrite the generated tables of the docs from the code: ``python docs/generate.py``.

Generated text, kept in step by ``tests/docs/test_docs.py``:

- a table that follows a ``<!-- generated: EXPRESSION ... -->`` comment and runs to the
  end of the file (configuration and command-line references, from the code);
- a block between ``<!-- begin generated: NAME -->`` and ``<!-- end generated: NAME -->``
  (tables of measurements, from the JSON the benchmarks write under
  ``benchmarks/results/``), which may sit anywhere in a page;
- the results pages under ``docs/results/``, one per benchmark, and their list in
  ``mkdocs.yml`` (``docs/results_pages.py``).

It also writes the plugin contract's table of abilities (from the code) and the plugin
guide's example package, ``docs/examples/seqtrans-mytask/``, as ``seqtrans new-task
mytask`` writes it (``tests/docs/test_plugin_guide.py`` checks both).
"""

from __future__ import annotations

import json
import re
import runpy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seqtrans.config import RunConfig, markdown_table
from seqtrans.config.layers import markdown_text

DOCS = Path(__file__).resolve().parent
RESULTS = DOCS.parent / "benchmarks" / "results"
EXAMPLE = DOCS / "examples" / "seqtrans-mytask"


def cli_reference() -> str:
    """Every engine command with its arguments, from the argument parser itself."""
    import argparse

    from seqtrans.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in commands._choices_actions}
    out = []
    for name, sub in commands.choices.items():
        out.append(f"## `seqtrans {name}`\n\n{markdown_text(helps.get(name) or '')}\n\n"
                   f"{markdown_text(sub.description or '')}\n")
        rows = []
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.metavar or action.dest}`"
            if action.option_strings and action.nargs != 0:
                names += f" {action.metavar or action.dest.upper()}"
            choices = f" One of: {', '.join(map(str, action.choices))}." if action.choices else ""
            default = "" if action.default in (None, False, [], argparse.SUPPRESS) else f"`{action.default}`"
            help_text = markdown_text(action.help or "").replace("|", "\\|")
            rows.append(f"| {names} | {default} | {help_text}{choices} |")
        if rows:
            out.append("| argument | default | what it does |\n|---|---|---|\n" + "\n".join(rows) + "\n")
    return "\n" + "\n".join(out)


def tables() -> dict[Path, str]:
    from seqtrans.serving.settings import ServeSettings
    from seqtrans_copy import CopyConfig
    from seqtrans_parsing import ParsingConfig
    from seqtrans_translation import TranslationConfig

    out = {DOCS / "configuration.md": markdown_table(RunConfig()),
           DOCS / "tasks" / "copy.md": markdown_table(CopyConfig(), prefix="data."),
           DOCS / "tasks" / "parsing.md": markdown_table(ParsingConfig(), prefix="data."),
           DOCS / "tasks" / "translation.md": markdown_table(TranslationConfig(), prefix="data."),
           DOCS / "cli.md": cli_reference(),
           DOCS / "serving.md": markdown_table(ServeSettings())}
    return out


# --- tables of measurements, from benchmarks/results/*.json ---------------------------------


def _result(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RESULTS / name).read_text(encoding="utf-8"))
    return data


def _num(value: float, digits: int = 1) -> str:
    return f"{value:,.{digits}f}"


def _ratio(value: float, *, bold_from: float = 1.5) -> str:
    text = f"{value:.2f}"
    return f"**{text}**" if value >= bold_from else text


def _pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def _case(case: str) -> str:
    """``base-beam4-b32`` -> ``base, beam 4, batch 32``."""
    shape, search, batch = case.split("-")
    search = "greedy" if search == "greedy" else f"beam {search.removeprefix('beam')}"
    return f"{shape}, {search}, batch {batch.removeprefix('b')}"


def _source(*names: str, machine: str = "") -> str:
    files = ", ".join(f"`benchmarks/results/{n}`" for n in names)
    return f"\nFrom {files}" + (f" ({machine})" if machine else "") + ".\n"


def _machine(data: dict[str, Any]) -> str:
    return f"{data['device']}, PyTorch {data['torch']}, {data['time'][:10]}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def decode_ct2_cpu() -> str:
    data = _result("decode_speed-ct2-cpu.json")
    rows = []
    for r in data["rows"]:
        int8 = r["seqtrans_int8_tok_s"] / r["ct2_int8_tok_s"]
        rows.append([_case(r["case"]), _num(r["seqtrans_tok_s"]), _num(r["ct2_float32_tok_s"]),
                     _ratio(r["ratio_vs_ct2_float32"]), _num(r["seqtrans_int8_tok_s"]),
                     _num(r["ct2_int8_tok_s"]), _ratio(int8), _num(r["seqtrans_bf16_tok_s"]),
                     _num(r["hf_tok_s"]), _ratio(r["ratio"])])
    header = ["case", "seqtrans fp32", "CT2 fp32", "ratio", "seqtrans int8", "CT2 int8", "ratio",
              "seqtrans bf16", "HF fp32", "seqtrans fp32 / HF"]
    return (_table(header, rows) + "\nTarget tokens per second; ratios are seqtrans over the peer in the "
            "same precision.\n" + _source("decode_speed-ct2-cpu.json", machine=_machine(data)))


def parsing_decode_cpu() -> str:
    rows = []
    names = []
    for tag in ("native", "native-int8"):
        name = f"parsing_decode-{tag}-cpu.json"
        data = _result(name)
        names.append(name)
        for r in data["rows"]:
            same = ("outputs and scores" if r["identical"] else "outputs" if r["tokens_identical"]
                    else "some outputs differ")
            batch = r["batch"]
            if batch == "tokens":
                batch = f"decode.batch_tokens ({r['batches']} batch{'es' if r['batches'] > 1 else ''})"
            rows.append([data["precision"], batch, _num(r["baseline_sent_s"]),
                         _num(r["current_sent_s"]), _ratio(r["speedup"]), same])
    header = ["precision", "batch (sentences)", "before, sent/s", "native kernels, sent/s", "speed-up",
              "identical"]
    return (_table(header, rows) + f"\n{data['sentences']} test sentences, beam {data['beam']}, alpha "
            f"{data['alpha']}, the bracket constraint; before: the engine of commit {data['baseline']}, "
            "the two alternating in fresh processes, median sentences per second.\n"
            + _source(*names, machine=_machine(data)))


def decode_cuda() -> str:
    data = _result("decode_speed-cuda.json")
    rows = [[_case(r["case"]), _num(r["seqtrans_tok_s"]), _num(r["hf_tok_s"]), _ratio(r["ratio"]),
             _num(r["seqtrans_bf16_tok_s"])] for r in data["rows"]]
    return (_table(["case", "seqtrans tok/s", "HF tok/s", "ratio", "seqtrans bf16 tok/s"], rows)
            + _source("decode_speed-cuda.json", machine=_machine(data)))


def gpu_h200() -> str:
    """One lent H200: each measurement of the GPU suite beside its target."""
    suite = _result("gpu_suite-h200.json")
    parts = suite["parts"]
    serve = _result("serve_load-cuda.json")
    rows = []
    for r in parts["decode_speed"]["rows"]:
        rows.append([f"decoding, {_case(r['case'])}, fp32 (bf16)",
                     f"{_num(r['seqtrans_tok_s'])} ({_num(r['seqtrans_bf16_tok_s'])}) tok/s: "
                     f"{r['ratio']:.2f}x `generate` fp32",
                     "1.6x `generate`" if r["batch"] > 1 else ""])
    for name, label in (("train_mfu", "training, bf16 autocast"),
                        ("train_compiled", "training, bf16 autocast, `torch.compile`")):
        t = parts[name]
        rows.append([f"{label}, {t['target_tokens']:,} target tokens a batch",
                     f"{_num(t['tokens_per_s'], 0)} tok/s: {100 * t['mfu_bf16_datasheet']:.1f} % of the "
                     f"datasheet's dense bf16 peak ({100 * t['mfu_bf16']:.1f} % of the measured "
                     f"{t['gemm_peak_bf16_flops'] / 1e12:.0f} TFLOP/s)", "25 % of the datasheet peak"])
    m = parts["multi30k"]
    rows.append([f"Multi30k, `base` preset, bf16, {m['train_minutes']:.0f} minutes",
                 f"test2016 BLEU {m['bleu']:.2f} after {m['train_steps']:,} updates", "40 BLEU"])
    r = parts["torchrun_resume"]
    same = r["resumed_vs_reference"]["metrics_equal"] and r["resumed_vs_reference"]["predictions_equal"]
    rows.append([f"`torchrun`, SIGKILL at update {r['kill_at_update']}, resumed",
                 ("the same metrics and test predictions as uninterrupted runs" if same
                  else "metrics or predictions differ from uninterrupted runs")
                 + "; NCCL's collectives not exercised (a world of one process)", "the same metrics"])
    g = parts["gpu_tests"]
    rows.append(["GPU tests (`pytest -m gpu`)", f"{g['passed']} passed, {g['failed']} failed, "
                 f"{g['skipped']} skipped", "all pass"])
    for level in serve["batched"]:
        rows.append([f"`seqtrans serve`, Multi30k run, beam {serve['beam']}, {level['users']} users",
                     f"{_num(level['sentences_per_s'])} sentences/s, p50 {_num(level['p50_ms'], 0)} ms, "
                     f"p99 {_num(level['p99_ms'], 0)} ms; the same decoding in-process from a file "
                     f"{_num(serve['batch_ceiling_sentences_per_s'])} sentences/s", ""])
    trees = _result("decode_trees-cuda.json")
    tree_rows = []
    for r in trees["rows"]:
        syncs = next((sum(x["syncs_per_decode"].values()) for x in r["rounds"] if "syncs_per_decode" in x), 0)
        tree_rows.append([r["tree"], _num(r["fp32_tok_s"], 0), _num(r["bf16_tok_s"], 0), str(syncs)])
    return (_table(["what", "measured", "target"], rows)
            + _table(["checkout", "beam 4, batch 32, fp32 tok/s", "bf16 tok/s",
                      "waits for the GPU per decode"], tree_rows)
            + _source("gpu_suite-h200.json", "serve_load-cuda.json", "decode_trees-cuda.json",
                      machine=f"{suite['device_name']}, PyTorch {suite['torch']}, {suite['time'][:10]}"))


def streaming_copy() -> str:
    data = _result("streaming_copy.json")
    rows = []
    for variant in ("copy", "reverse"):
        r = data[variant]
        rows.append([variant, f"{r['exact_match']:.3f}", f"{r['average_proportion']:.3f}",
                     f"{r['average_lagging']:.2f}", f"{r['mean_source_length']:.1f}",
                     f"{r['same_as_offline_greedy']:.3f}", _num(1000 * r["stream_seconds_per_sentence"]),
                     _num(1000 * r["offline_seconds_per_sentence"]), str(r["train_steps"])])
    header = ["variant", "exact match", "AP", "AL", "mean source length", "same as offline greedy",
              "stream ms/sentence", "offline ms/sentence", "train steps"]
    return _table(header, rows) + _source("streaming_copy.json")


_POLICY = {"full": "full sentence (reads the whole source first)", "multi-k": "multi-k wait-k",
           "multi-k-init": "multi-k wait-k, fine-tuned from the full-sentence model",
           "wait-3": "wait-3 (trained at k = 3)", "monotonic": "hard monotonic (Raffel et al.)",
           "mma-il": "MMA-IL, λ_avg = 0.1", "mma-h": "MMA-H, λ_var = 0.1",
           "mma-il-init": "MMA-IL, λ_avg = 0.1, fine-tuned from the full-sentence model",
           "monotonic-init": "hard monotonic, fine-tuned from the full-sentence model",
           "monotonic-init-t0.2": "hard monotonic, T = 0.2, fine-tuned from the full-sentence model",
           "monotonic-init-latency": ("hard monotonic, T = 0.2, λ = 0.1, fine-tuned from the "
                                      "full-sentence model")}
#: The noise variants of the sharpened monotonic head: monotonic-init-latency[WEIGHT]-noiseN
#: (the weight 0.1 where none is named).
_NOISE_VARIANT = re.compile(r"monotonic-init-latency(?P<weight>[\d.]*)-noise(?P<noise>[\d.]+)")
#: MoChA fine-tuned with the noise variants' recipe: mocha-init-wW
_MOCHA_INIT = re.compile(r"mocha-init-w(?P<chunk>\d+)")


def _model_label(name: str) -> str:
    if name.endswith("-long"):  # the benchmark's LONGER: twice the updates
        return _model_label(name.removesuffix("-long")) + " for twice the updates"
    if name.startswith("milk-"):
        return f"MILk, λ = {name.removeprefix('milk-')}"
    variant = _NOISE_VARIANT.fullmatch(name)
    if variant:
        return (f"hard monotonic, T = 0.2, λ = {variant['weight'] or '0.1'}, noise {variant['noise']}, "
                "fine-tuned from the full-sentence model")
    mocha = _MOCHA_INIT.fullmatch(name)
    if mocha:
        return (f"MoChA, w = {mocha['chunk']}, T = 0.2, λ = 0.1, noise 3.5, fine-tuned from the "
                "full-sentence model")
    return _POLICY.get(name, name)


def _policy(row: dict[str, Any]) -> str:
    """The row's model, with its lag or its learned policy's stopping threshold."""
    name = row["model"]
    label = _model_label(name)
    if row.get("wait_k") and name.startswith("multi-k"):
        label += f", k = {row['wait_k']}"
    if row.get("threshold") is not None:
        label += f", τ = {row['threshold']:g}"
    return label


def _updates(training: dict[str, Any], name: str) -> str:
    """A model's training updates, those of the model it was fine-tuned from included."""
    entry = training[name]
    start = entry.get("init")
    if start is None:
        return f"{entry['train_steps']:,}"
    return f"{training[start]['train_steps'] + entry['train_steps']:,} ({start} + {entry['train_steps']:,})"


def simultaneous_multi30k(source: str = "simultaneous_multi30k.json") -> str:
    data = _result(source)
    training = data["training"]
    rows = [[_policy(r), f"{r['bleu']:.2f}", f"{r['chrf']:.2f}", f"{r['stream_ap']:.3f}",
             f"{r['stream_al']:.2f}",
             f"{r['stream_laal']:.2f}", f"{r['stream_dal']:.2f}", f"{r['same_as_offline']:.3f}",
             _updates(training, r["model"]), _num(training[r["model"]]["train_minutes"])]
            for r in data["simultaneous"]]
    header = ["policy", "BLEU", "chrF", "AP", "AL", "LAAL", "DAL", "same as offline", "updates",
              "training minutes"]
    machines = sorted({_cpu(t["machine"]) for t in training.values()})
    gap = ""
    if data.get("policy_gap"):
        gap = ("\nThe learned policies decoded offline (greedy) with their hard test-time decisions, "
               "as the streams, and with the expected alignment they were trained with (no noise; no "
               "stream can follow it):\n"
               + _table(["model", "hard decisions: BLEU", "length ratio", "expected alignment: BLEU",
                         "length ratio", "selection probabilities in [0.1, 0.9], by layer"],
                        [[r["model"], f"{r['hard_bleu']:.2f}", f"{r['hard_bleu_length_ratio']:.3f}",
                          f"{r['expected_bleu']:.2f}", f"{r['expected_bleu_length_ratio']:.3f}",
                          " / ".join(_pct(u) for u in r["undecided"])]
                         for r in data["policy_gap"]]))
    return (_table(header, rows) + gap + _against_wait_k(data)
            + _source(source, machine="; ".join(machines)))


def simultaneous_multi30k_small() -> str:
    if not (RESULTS / "simultaneous_multi30k-small.json").is_file():
        return "\nNot measured yet.\n"
    return simultaneous_multi30k("simultaneous_multi30k-small.json")


def _wait_k_at(curve: list[tuple[float, float]], al: float) -> float | None:
    """The BLEU of a wait-k curve ((AL, BLEU) points) interpolated linearly at ``al``;
    None outside the ALs it covers."""
    points = sorted(curve)
    for (a0, b0), (a1, b1) in zip(points, points[1:]):
        if a0 <= al <= a1:
            return b0 + (b1 - b0) * (al - a0) / (a1 - a0) if a1 > a0 else max(b0, b1)
    return None


def _against_wait_k(data: dict[str, Any]) -> str:
    """Each learned policy's BLEU against the wait-k curve of the same training (multi-k
    from scratch, or fine-tuned from the same model as the policy for as many updates), at
    the policy's AL."""
    rows = data["simultaneous"]
    training = data["training"]
    curves = {name: [(r["stream_al"], r["bleu"]) for r in rows if r["model"] == name]
              for name in ("multi-k", "multi-k-init", "multi-k-init-long")}
    out = []
    for r in rows:
        if r.get("threshold") is None:
            continue
        control = "multi-k-init" if training[r["model"]].get("init") else "multi-k"
        if r["model"].endswith("-long") and curves.get(f"{control}-long"):
            control += "-long"  # the same number of updates
        wait_k = _wait_k_at(curves[control], r["stream_al"]) if curves[control] else None
        if wait_k is not None:
            out.append([_policy(r), f"{r['stream_al']:.2f}", f"{r['bleu']:.2f}", control, f"{wait_k:.2f}",
                        f"{r['bleu'] - wait_k:+.2f}"])
    if not out:
        return ""
    return ("\nEach learned policy against the wait-k curve of the same training, interpolated "
            "linearly at the policy's AL (rows outside the curve's ALs left out):\n"
            + _table(["policy", "AL", "BLEU", "wait-k curve", "its BLEU at that AL", "difference"], out))


def _cpu(m: dict[str, Any]) -> str:
    return (f"{m['processor']}, {m['threads']} thread(s) per job, {m['jobs']} job(s) at once, "
            f"PyTorch {m['torch']}")


#: The run before word delays became a reader's (last-piece delays): the memory-attention
#: comparison, which does not depend on delays, is read from it until the current run has one.
PREVIOUS_SIMULTANEOUS = "simultaneous_multi30k-previous.json"


def memory_multi30k() -> str:
    source = "simultaneous_multi30k.json"
    if not _result(source).get("memory"):
        source = PREVIOUS_SIMULTANEOUS
    data = _result(source)
    if not data.get("memory"):
        return ("\nNot measured yet: `python -m benchmarks simultaneous_multi30k --part memory` trains the "
                "models and times them.\n")
    training = data["training"]
    rows = []
    for r in data["memory"]:
        t = training[r["model"]]
        rows.append([r["model"], f"{t['bleu']:.2f}", f"{t['chrf']:.2f}",
                     *(f"{r[f'beam{b}_{m}_seconds']:.1f} ({_pct(r[f'beam{b}_{m}_attention_share'])})"
                       for b in (4, 1) for m in ("batch", "single"))])
    single = data["memory"][0]["single_sentences"]
    header = ["model", "BLEU (beam 4)", "chrF", "beam 4, batches: s (attention)",
              f"beam 4, one at a time ({single} sentences)", "greedy, batches",
              f"greedy, one at a time ({single})"]
    steps = [[str(r["source_length"]), f"{r['scaled_dot_ms_per_step']:.3f}", f"{r['memory_ms_per_step']:.3f}",
              _ratio(1 / r["memory_over_scaled_dot"])] for r in data["attention_step"]]
    return (_table(header, rows) + "\nEncoder–decoder attention alone, one decoding step of 32 sentences "
            "× beam 4 "
            "(random weights, width 256):\n" +
            _table(["source length", "scaled_dot ms/step", "memory (K = 32) ms/step", "speedup"], steps)
            + _source(source, machine=_cpu(data["machine"])))


def memory_long() -> str:
    if not (RESULTS / "memory_long.json").is_file():
        return "\nNot measured yet: `python -m benchmarks memory_long` trains the models and times them.\n"
    data = _result("memory_long.json")
    rows = []
    for r in data["rows"]:
        load = r["rounds"][0]["b1"]["load_before"][0], r["rounds"][0]["b32"]["load_before"][0]
        speed = (f"{r['b1_speedup']:.2f} / {r['b32_speedup']:.2f}" if "b1_speedup" in r else "-")
        rows.append([r["model"], str(r["slots"]), f"{r['bleu']:.2f}", f"{r['timed_bleu']:.2f}",
                     f"{r['free_median_output_tokens']:g}",
                     f"{r['b1_seconds']:.1f} ({load[0]:.1f})", f"{r['b32_seconds']:.1f} ({load[1]:.1f})",
                     speed, f"{r['free_b32_seconds']:.1f}", f"{r['b32_peak_mib']:.0f}",
                     f"{r['process_peak_mib']:.0f}"])
    first = data["rows"][0]
    header = ["model", "K", "BLEU", "BLEU, timed documents", "median output tokens, free lengths",
              "batch 1: s (load)", "batch 32: s (load)",
              "speed-up over scaled-dot, batch 1 / 32", "batch 32, free lengths: s", "batch 32 peak MiB",
              "process peak MiB"]
    caption = (f"\nBLEU of all {first['test_documents']} test documents; timings of the first "
               f"{first['documents']} (median {first['median_source_tokens']:g} source tokens), beam 4, "
               f"outputs held to {first['output_length']} tokens; {first['updates']} updates each; "
               "load: the 1-minute load average when the timing started.\n")
    return (caption + _table(header, rows) + _profiles(data["profile"])
            + _source("memory_long.json", machine=_cpu({**data["machine"], "jobs": 1})))


def _profiles(profiles: list[dict[str, Any]]) -> str:
    """The operators with the most self time in each profile, with their shares."""
    if not profiles:
        return ""
    rows = []
    for p in profiles:
        for size in (1, 32):
            part = p[f"b{size}"]
            top = ", ".join(f"`{o['operation']}` {_pct(o['share'])}" for o in part["operations"][:5])
            rows.append([p["model"], str(size), _pct(part["attention_share"]), top])
    return ("\nWhere the time goes (torch.profiler, self time; the attention's share of end-to-end "
            "decoding timed apart):\n" + _table(["model", "batch", "encoder-decoder attention",
                                                 "operators with the most self time"], rows))


def attention_copy() -> str:
    data = _result("attention_copy.json")
    results: dict[str, dict[str, dict[str, float]]] = data["results"]
    lengths = sorted({int(n) for by_length in results.values() for n in by_length})
    baseline = results["scaled_dot"]

    def grid(title: str, cell: Callable[[str, str], str]) -> str:
        rows = [[name] + [cell(name, str(n)) if str(n) in by_length else "-" for n in lengths]
                for name, by_length in results.items()]
        table = _table([title] + [f"L={n}" for n in lengths], rows)
        return table.replace("|---|" + "---|" * len(lengths), "|---|" + "---:|" * len(lengths))

    out = [grid("exact match", lambda m, n: f"{results[m][n]['exact_match']:.3f}"),
           grid("decode s (1,000 seq.)", lambda m, n: f"{results[m][n]['decode_seconds']:.2f}"),
           grid("attention s", lambda m, n: f"{results[m][n]['attention_seconds']:.2f}"),
           grid("speed-up over scaled_dot",
                lambda m, n: f"{baseline[n]['decode_seconds'] / results[m][n]['decode_seconds']:.2f}x")]
    rows = []
    for name, fit in data["scaling"].items():
        last = fit["points"][-1]
        rows.append([name, f"{fit['linear_fit']['ms_per_source_token']:.2f} ({fit['linear_fit']['r2']:.3f})",
                     f"{1000 * fit['quadratic_fit']['a_ms']:.2f}",
                     f"{fit['decode_linear_fit']['ms_per_source_token']:.2f}",
                     f"{last['attention_seconds']:.2f}", f"{last['decode_seconds']:.2f}"])
    n = data["scaling"]["scaled_dot"]["points"][-1]["length"]
    header = [f"L={max(lengths)} model, exactly n tokens in and out", "attention ms per source token (R²)",
              "x² term of a parabola, µs", "decode ms per source token", f"attention s at n={n}",
              f"decode s at n={n}"]
    out.append(_table(header, rows).replace("|---|" + "---|" * 5, "|---|" + "---:|" * 5))
    return "".join(out) + _source("attention_copy.json")


def translation_multi30k() -> str:
    run, tuned = _result("translation_multi30k.json"), _result("translation_multi30k-alpha.json")
    m, machine, test = run["metrics"], run["machine"], tuned["test"]
    first = (f"`{run['preset']}` preset, {machine['cpus']} CPU cores, PyTorch {machine['torch']}, "
             f"α {run['config']['decode']['alpha']:g}")
    empty = [""] * 4
    rows = [[first, f"{m['bleu']:.2f}", f"{m['chrf']:.2f}", f"{m['bleu_length_ratio']:.3f}",
             f"{m['train_steps']:,}", _num(m["train_tokens_per_s"], 0), f"{m['train_minutes']:.1f}",
             f"{run['wall_minutes']:.1f}"],
            [f"the same model, α {tuned['chosen_alpha']:g} tuned on dev (now the `{run['preset']}` preset's)",
             f"**{test['bleu']:.2f}**", f"{test['chrf']:.2f}", f"{test['bleu_length_ratio']:.3f}", *empty],
            [f"reference: {run['reference']['name']}", f"{run['reference']['bleu']:.2f}", "", "", *empty]]
    header = ["run", "BLEU", "chrF", "length ratio", "updates", "training tokens/s", "training min",
              "wall min"]
    return _table(header, rows) + _source("translation_multi30k.json", "translation_multi30k-alpha.json")


def parsing_sample() -> str:
    seeds = {1: _result("parsing_sample-cpu.json"), 2: _result("parsing_sample-cpu-seed2.json")}

    def row(label: str, m: dict[str, float], prefix: str = "", bold: bool = False) -> list[str]:
        f1 = f"{m[prefix + 'f1']:.2f}"
        rest = [f"{m[prefix + k]:.2f}" for k in ("recall", "precision", "complete_match", "f1_len40")]
        repairs = f"{m[prefix + 'malformed']:.1f} % ({m[prefix + 'repairs']:,.0f} repairs)"
        return [label, f"**{f1}**" if bold else f1, *rest, repairs]

    rows = [row("with the bracket constraint (default), seed 1", seeds[1]["metrics"], bold=True),
            row("the same, seed 2", seeds[2]["metrics"], bold=True),
            row("without it (`decode.constrained=false`), seed 1", seeds[1]["metrics"], "unconstrained_")]
    n = seeds[1]["metrics"]["test_sentences"]
    header = [f"test split ({n:.0f} sentences), EVALB COLLINS.prm", "F1", "recall", "precision",
              "complete match", "F1 len ≤ 40", "malformed before repair"]
    return _table(header, rows) + _source("parsing_sample-cpu.json", "parsing_sample-cpu-seed2.json")


def parsing_vectors() -> str:
    """The cpu preset with and without the GloVe vectors, 30 training minutes on one machine."""
    runs = [("the preset, seed 1", "parsing_sample-cpu-epyc-seed1.json"),
            ("with GloVe vectors, seed 1", "parsing_sample-cpu-vectors-seed1.json"),
            ("with GloVe vectors, seed 2", "parsing_sample-cpu-vectors-seed2.json")]
    rows = []
    for label, name in runs:
        r = _result(name)
        m, by = r["metrics"], r["by_label"]
        rows.append([label, f"{m['train_steps']:,}", f"**{m['f1']:.2f}**",
                     *(f"{m[k]:.2f}" for k in ("recall", "precision", "complete_match")),
                     f"{m['tag_accuracy']:.1f}", f"{by['PP']['recall']:.1f} / {by['PP']['precision']:.1f}",
                     f"{by['ADJP']['recall']:.1f} / {by['ADJP']['precision']:.1f}",
                     f"{m['decode_sentences_per_s']:.1f}"])
    header = ["`cpu` preset, 30 training minutes", "updates", "test F1", "recall", "precision",
              "complete match", "tag accuracy", "PP recall / precision", "ADJP recall / precision",
              "decoding, sentences/s"]
    return _table(header, rows) + _source(*(name for _, name in runs))


DISTILL = "distill_multi30k.json"
DISTILL_PICTURE = DOCS / "images" / "distill-multi30k.png"


def distill_multi30k() -> str:
    """The students against their teacher and CTranslate2 on the teacher, when measured."""
    if not (RESULTS / DISTILL).is_file():
        return ("\nNot measured yet: `python -m benchmarks distill_multi30k --threads 1 --mirror DIR` "
                "trains the teacher and the students and times them; `python docs/generate.py` then "
                "writes this table and draws the picture.\n")
    data = _result(DISTILL)
    teacher, ct2 = data["teacher"], data["ct2_int8_teacher_tokens_per_s"]

    def row(name: str, shortlist: str, r: dict[str, Any]) -> list[str]:
        speed = r["int8_tokens_per_s"]
        against_ct2 = "not run" if ct2 is None else _ratio(speed / ct2)
        alpha = f"{r['alpha']:g}" if "alpha" in r else ""  # chosen on dev, in runs that chose it
        beam = str(r.get("beam", ""))
        return [name, beam, shortlist, alpha, f"{r['bleu']:.2f}", _num(speed),
                _ratio(speed / teacher["int8_tokens_per_s"]), against_ct2, f"{r['latency_ms']:.1f} ms"]

    rows = [row("teacher (`cpu` preset)", "", teacher)]
    if "teacher_greedy" in data:
        rows.append(row("teacher (`cpu` preset)", "", data["teacher_greedy"]))
    rows += [row(f"`{s['name']}`", "yes" if s["shortlist"] else "no", s) for s in data["students"]]
    measured = data.get("ct2_int8_teacher", {})
    ct2_bleu = measured.get("bleu")
    if "run" in measured:  # the teacher cannot export: CTranslate2 ran a bidirectional stand-in
        stand_in = measured["seqtrans_int8"]
        rows.append(row("stand-in: the teacher's settings, bidirectional encoder", "", stand_in))
    if ct2 is not None:
        name = "CTranslate2, the " + ("stand-in" if "run" in measured else "teacher")
        rows.append([name, "4", "", "", "" if ct2_bleu is None else f"{ct2_bleu:.2f}",
                     _num(ct2), _ratio(ct2 / teacher["int8_tokens_per_s"]), "1.00", ""])
    header = ["model (int8)", "beam", "shortlist", "α (best on dev)", "test2016 BLEU", "target tokens/s",
              "against the teacher", "against CTranslate2", "one sentence"]
    m = data["machine"]
    machine = f"{m['processor']}, {m['threads']} thread(s), PyTorch {m['torch']}"
    return (_table(header, rows) + f"\n![test2016 BLEU against int8 target tokens/s]"
            f"(images/{DISTILL_PICTURE.name})\n" + _source(DISTILL, machine=machine))


PRETRAINED_STREAMING = "pretrained_streaming.json"


def pretrained_streaming() -> str:
    """An imported model streamed by re-encoding beside its distilled causal student."""
    if not (RESULTS / PRETRAINED_STREAMING).is_file():
        return ("\nNot measured yet: `python -m benchmarks pretrained_streaming --mirror DIR` trains, "
                "distils and streams both models; `python docs/generate.py` then writes this table.\n")
    data = _result(PRETRAINED_STREAMING)
    label = {"teacher": "imported, fine-tuned (re-encoding)", "student": "distilled student (causal)"}
    rows = [[label[r["model"]], str(r["wait_k"]) if r["wait_k"] else "whole source", f"{r['bleu']:.2f}",
             f"{r['chrf']:.2f}", f"{r['stream_al']:.2f}", f"{r['stream_laal']:.2f}", f"{r['stream_dal']:.2f}",
             "" if r["same_as_offline"] is None else f"{r['same_as_offline']:.3f}",
             f"{r['ms_per_sentence']:.1f}"]
            for r in data["rows"]]
    header = ["model", "k", "BLEU", "chrF", "AL", "LAAL", "DAL", "same as offline", "ms a sentence"]
    m, minutes = data["machine"], data["train_minutes"]
    machine = (f"{m['processor']}, {m['threads']} threads, PyTorch {m['torch']}; training minutes: "
               f"teacher {minutes['teacher']:.1f}, student {minutes['student']:.1f}")
    return _table(header, rows) + _source(PRETRAINED_STREAMING, machine=machine)


def draw_distill_picture() -> Path | None:
    """BLEU against int8 tokens/s of every model of the distillation results, when measured."""
    if not (RESULTS / DISTILL).is_file():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    data = _result(DISTILL)

    def label(name: str, r: dict[str, Any]) -> str:
        greedy = ", greedy" if r.get("beam") == 1 else ""
        return name + greedy + (" + shortlist" if r.get("shortlist") else "")

    teachers = [data["teacher"], *([data["teacher_greedy"]] if "teacher_greedy" in data else [])]
    points = [(label("teacher", t), t["int8_tokens_per_s"], t["bleu"]) for t in teachers]
    points += [(label(s["name"], s), s["int8_tokens_per_s"], s["bleu"]) for s in data["students"]]
    ct2 = data.get("ct2_int8_teacher", {})
    if ct2.get("bleu") is not None:
        name = "CTranslate2, the " + ("stand-in" if "run" in ct2 else "teacher")
        points.append((name, ct2["int8_tokens_per_s"], ct2["bleu"]))
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    for i, (name, speed, bleu) in enumerate(points):
        ax.scatter([speed], [bleu])
        # labels above and below in turn, so that neighbours' do not overlap
        ax.annotate(name, (speed, bleu), textcoords="offset points", xytext=(5, 5 if i % 2 else -11),
                    fontsize=8)
    ax.set_xlabel("int8 target tokens/s (one thread)")
    ax.set_ylabel("test2016 BLEU")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:,.0f}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xticks([1000, 2000, 5000, 10000, 20000])
    ax.margins(x=0.15, y=0.1)
    fig.tight_layout()
    fig.savefig(DISTILL_PICTURE)
    plt.close(fig)
    return DISTILL_PICTURE


def speed_summary() -> str:
    """One line per benchmark: seqtrans against the peer, the range over its cases."""

    def span(values: list[float]) -> str:
        low, high = min(values), max(values)
        return f"{low:.2f}x" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}x to {high:.2f}x"

    rows = []
    for device in ("cpu", "cuda"):
        data = _result(f"decode_speed-{device}.json")
        rows.append([f"decoding, {len(data['rows'])} cases", data["device"],
                     f"{span([r['ratio'] for r in data['rows']])} the tokens/s", "",
                     f"[`decode_speed-{device}.json`](results/decode_speed.md#decode_speed-{device})"])
    for names in (["train_speed-base-cpu.json", "train_speed-base-dropout0.1-cpu.json"],
                  ["train_speed-base-cuda.json", "train_speed-base-25000tok-cuda.json"]):
        runs = [_result(n) for n in names]
        rows.append([f"training, base shape, {len(runs)} cases", runs[0]["device"],
                     f"{span([r['ratio'] for r in runs])} the tokens/s",
                     f"{span([r['memory_ratio'] for r in runs])} the peak memory",
                     ", ".join(f"[`{n}`](results/train_speed.md#{n.removesuffix('.json')})" for n in names)])
    return _table(["benchmark", "device", "seqtrans against the peer", "memory", "results"], rows)


def abilities() -> str:
    from seqtrans.tasks.abilities import markdown_table as abilities_table

    return abilities_table()


def example_package() -> dict[str, bytes]:
    """The files of the plugin guide's example, as ``seqtrans new-task mytask`` writes them."""
    import tempfile

    from seqtrans.tasks.scaffold import new_task

    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "seqtrans-mytask"
        return {path.relative_to(out).as_posix(): path.read_bytes()
                for path in new_task("mytask", directory=out, installed=set())}


def write_example() -> None:
    """Write :data:`EXAMPLE` anew from :func:`example_package`."""
    import shutil

    shutil.rmtree(EXAMPLE, ignore_errors=True)
    for name, data in example_package().items():
        (EXAMPLE / name).parent.mkdir(parents=True, exist_ok=True)
        (EXAMPLE / name).write_bytes(data)


#: Generated blocks: page -> block name -> the function that writes it.
BLOCKS: dict[Path, dict[str, Callable[[], str]]] = {
    DOCS / "speed.md": {"summary": speed_summary, "decode_ct2_cpu": decode_ct2_cpu,
                        "parsing_decode_cpu": parsing_decode_cpu,
                        "decode_cuda": decode_cuda, "gpu_h200": gpu_h200,
                        "distill_multi30k": distill_multi30k},
    DOCS / "streaming-policies.md": {"streaming_copy": streaming_copy},
    DOCS / "streaming-multi30k.md": {"simultaneous_multi30k": simultaneous_multi30k,
                                     "simultaneous_multi30k_small": simultaneous_multi30k_small},
    DOCS / "pretrained-families.md": {"pretrained_streaming": pretrained_streaming},
    DOCS / "attention-results.md": {"attention_copy": attention_copy, "memory_multi30k": memory_multi30k,
                                    "memory_long": memory_long},
    DOCS / "tasks" / "translation.md": {"translation_multi30k": translation_multi30k},
    DOCS / "tasks" / "parsing-results.md": {"parsing_sample": parsing_sample,
                                            "parsing_vectors": parsing_vectors},
    DOCS / "plugin-contract.md": {"abilities": abilities},
}


def _block_pattern(name: str) -> re.Pattern[str]:
    name = re.escape(name)
    return re.compile(rf"(<!-- begin generated: {name} -->\n)(.*?)(<!-- end generated: {name} -->)",
                      re.DOTALL)


def blocks() -> dict[tuple[Path, str], tuple[str | None, str]]:
    """Every generated block: (page, name) -> (the text there now or None, the text it should have)."""
    out: dict[tuple[Path, str], tuple[str | None, str]] = {}
    for path, makers in BLOCKS.items():
        text = path.read_text(encoding="utf-8")
        for name, make in makers.items():
            match = _block_pattern(name).search(text)
            out[path, name] = (match.group(2) if match else None, make())
    return out


def main() -> None:
    for path, table in tables().items():
        text = path.read_text(encoding="utf-8")
        match = re.search(r"<!-- generated: .*?-->\n", text)
        if match is None:
            raise SystemExit(f"{path}: no '<!-- generated: ... -->' marker")
        path.write_text(text[: match.end()] + table, encoding="utf-8")
        print(f"updated {path.relative_to(DOCS.parent)}")
    for path, makers in BLOCKS.items():
        text = path.read_text(encoding="utf-8")
        for name, make in makers.items():
            pattern = _block_pattern(name)
            match = pattern.search(text)
            if match is None:
                raise SystemExit(f"{path}: no '<!-- begin generated: {name} -->' ... "
                                 f"'<!-- end generated: {name} -->' markers")
            text = text[: match.start(2)] + make() + text[match.end(2):]
        path.write_text(text, encoding="utf-8")
        print(f"updated {path.relative_to(DOCS.parent)}")
    write_example()
    print(f"wrote {EXAMPLE.relative_to(DOCS.parent)}")
    picture = draw_distill_picture()
    if picture is not None:
        print(f"drew {picture.relative_to(DOCS.parent)}")
    for path in runpy.run_path(str(DOCS / "results_pages.py"))["write"]():
        print(f"updated {path.relative_to(DOCS.parent)}")


if __name__ == "__main__":
    main()
