"""Parsing quality and cost on the Penn Treebank sample, with the errors broken down.

Train with a preset (by default ``cpu``, 30 minutes of training on a 2-core CPU), decode
the test split with the bracket constraint (beam 21) and without it, and break the errors
down.

Records EVALB F1 (COLLINS.prm) with and without the constraint, the malformed outputs
before repair, training and total wall time, and where the errors are: per phrase label
(recall and precision of labelled brackets) and per sentence length (F1 from EVALB's
per-sentence counts). Writes ``benchmarks/results/parsing_sample-PRESET.json`` (or
``parsing_sample-PRESET-TAG.json``).

    python -m benchmarks parsing_sample [--preset cpu] [--out DIR] [--set KEY=VALUE ...] [--tag TAG]
    python -m benchmarks parsing_sample --analyse RUN_DIR   # the breakdown of a finished run
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, ROOT, arguments, write_results
from seqtrans_parsing import ParsingConfig, ParsingTask
from seqtrans_parsing.evalb import COLLINS, evalb
from seqtrans_parsing.trees import Tree, read_trees

TARGET_F1 = 85.0


def labelled_spans(tree: Tree) -> Counter[tuple[str, int, int]]:
    """Labelled brackets as EVALB with COLLINS.prm counts them: punctuation removed,
    function tags already stripped, the root label TOP deleted."""
    out: Counter[tuple[str, int, int]] = Counter()
    deleted = set(COLLINS.delete_labels)

    def walk(node: Tree, start: int) -> int:
        if node.is_preterminal:
            return start + (node.label not in deleted)
        end = start
        for child in node.children:
            if isinstance(child, Tree):
                end = walk(child, end)
        if end > start and node.label not in deleted:
            label = "ADVP" if node.label == "PRT" else node.label
            out[(label, start, end)] += 1
        return end

    walk(tree, 0)
    return out


def analyse(run: Path) -> dict[str, Any]:
    config = json.loads((run / "config.json").read_text())
    task = ParsingTask(ParsingConfig(**config["data"]))
    gold = [e.target for e in task.read("test")]
    lines = (run / "predictions" / "test.txt").read_text().splitlines()
    pred = [tree for line in lines for tree, _ in read_trees(line)]
    assert len(pred) == len(gold)
    per_label: dict[str, Counter[str]] = {}
    for g, p in zip(gold, pred):
        gs, ps = labelled_spans(g), labelled_spans(p)
        for (label, _, _), n in gs.items():
            per_label.setdefault(label, Counter())["gold"] += n
        for (label, _, _), n in ps.items():
            per_label.setdefault(label, Counter())["test"] += n
        for key, n in (gs & ps).items():
            per_label[key[0]]["matched"] += n
    labels = {}
    for label, c in sorted(per_label.items(), key=lambda kv: -kv[1]["gold"]):
        r = 100 * c["matched"] / c["gold"] if c["gold"] else 0.0
        p = 100 * c["matched"] / c["test"] if c["test"] else 0.0
        labels[label] = {"gold": c["gold"], "test": c["test"], "recall": round(r, 1),
                         "precision": round(p, 1), "missed": c["gold"] - c["matched"],
                         "spurious": c["test"] - c["matched"]}
    report = evalb([f"(TOP {t})" for t in gold], lines, COLLINS, limits=False, max_error=-1)
    buckets: dict[str, Counter[str]] = {}
    for r in report.sentences:
        key = "1-10" if r.length <= 10 else "11-20" if r.length <= 20 else "21-30" if r.length <= 30 \
            else "31-40" if r.length <= 40 else "41+"
        b = buckets.setdefault(key, Counter())
        b["sentences"] += 1
        b["matched"] += r.matched
        b["gold"] += r.gold_brackets
        b["test"] += r.test_brackets
        b["complete"] += r.matched == r.gold_brackets == r.test_brackets
    lengths = {}
    for key in sorted(buckets, key=lambda k: int(k.split("-")[0].rstrip("+"))):
        b = buckets[key]
        r, p = b["matched"] / max(b["gold"], 1), b["matched"] / max(b["test"], 1)
        lengths[key] = {"sentences": b["sentences"], "f1": round(200 * r * p / max(r + p, 1e-9), 2),
                        "complete_match": round(100 * b["complete"] / b["sentences"], 1)}
    return {"evalb_f1": round(report.all.fmeasure, 2), "by_label": labels, "by_length": lengths}


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--tag", default="", help="Written to parsing_sample-PRESET-TAG.json instead.")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--set", dest="overrides", nargs="+", default=[])
    parser.add_argument("--analyse", type=Path, default=None, help="Only analyse a finished run directory.")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {}
    if args.analyse is None:
        run = args.out or ROOT / "runs" / f"parsing-{args.preset}-{time.strftime('%Y%m%d-%H%M%S')}"
        command = [sys.executable, "-m", "seqtrans", "run", "parsing", "--preset", args.preset,
                   "--out", str(run), "--device", "cpu"]
        if args.overrides:
            command += ["--set", *args.overrides]
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        result["wall_minutes"] = round((time.perf_counter() - start) / 60, 2)
        # the run directory as the repository sees it, not as this machine does
        where = str(run.resolve().relative_to(ROOT)) if run.resolve().is_relative_to(ROOT) else run.name
        shown = [where if a == str(run) else a for a in command[3:]]
        result["command"] = " ".join(["seqtrans", *shown])
        result["run"] = shown[shown.index("--out") + 1]
    else:
        run = args.analyse
    metrics = json.loads((run / "metrics.json").read_text())
    result.update({"preset": args.preset, "metrics": metrics, **analyse(run),
                   "target_f1": TARGET_F1, "machine": platform.processor() or platform.machine()})
    m = metrics
    print(f"test F1 {m['f1']:.2f} (target {TARGET_F1}; len<=40 {m['f1_len40']:.2f}), "
          f"unconstrained {m.get('unconstrained_f1', float('nan')):.2f}; malformed before repair: "
          f"{m['malformed']:.1f}% constrained, {m.get('unconstrained_malformed', float('nan')):.1f}% "
          f"unconstrained; {m['train_minutes']:.1f} training minutes, {m['train_steps']} updates")
    worst = sorted(result["by_label"].items(), key=lambda kv: -(kv[1]["missed"] + kv[1]["spurious"]))[:6]
    print("most errors (missed + spurious):",
          ", ".join(f"{k} {v['missed']}+{v['spurious']}" for k, v in worst))
    print("F1 by length:", ", ".join(f"{k}: {v['f1']}" for k, v in result["by_length"].items()))
    name = f"parsing_sample-{args.preset}" + (f"-{args.tag}" if args.tag else "")
    out = RESULTS / f"{name}.json"
    write_results(out, result, sort_keys=False)
    print(f"wrote {out.relative_to(ROOT)}")
