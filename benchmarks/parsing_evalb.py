"""EVALB speed: as many sentences as WSJ section 23 (2,416) against the one-second target.

The gold side repeats the Penn Treebank sample's test trees; the test side is each
tree rebracketed right-branching below its root (so brackets match, cross and go
missing as in real parser output). Prints sentences per second for the Python API and
for the ``seqtrans evalb`` command (process start-up included), and writes
``benchmarks/results/parsing_evalb.json``.

    python -m benchmarks parsing_evalb [--data ../shared/data]
"""

from __future__ import annotations

import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import RESULTS, ROOT, arguments, write_results
from seqtrans_parsing.evalb import COLLINS, evalb
from seqtrans_parsing.trees import Tree, preprocess, read_trees

SENTENCES = 2416


def right_branching(tree: Tree) -> Tree:
    """The same words and tags under the same root label, every phrase right-branching."""
    leaves = [Tree(t, [w]) for t, w in tree.tagged()]
    node: Tree | Tree = leaves[-1]
    for leaf in reversed(leaves[:-1]):
        node = Tree("NP" if leaf.label.startswith("N") else "VP", [leaf, node])
    return Tree(tree.label, node.children if not node.is_preterminal else [node])


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    text = (args.data / "ptb-sample" / "test.trees").read_text()
    trees = [t for t in (preprocess(raw) for raw, _ in read_trees(text)) if t is not None]
    gold_trees = [trees[i % len(trees)] for i in range(SENTENCES)]
    gold = [f"(TOP {t})" for t in gold_trees]
    test = [f"(TOP {right_branching(t)})" for t in gold_trees]

    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        report = evalb(gold, test, COLLINS)
        times.append(time.perf_counter() - start)
    api = statistics.median(times)

    with tempfile.TemporaryDirectory() as tmp:
        g, t = Path(tmp) / "gold", Path(tmp) / "test"
        g.write_text("\n".join(gold) + "\n")
        t.write_text("\n".join(test) + "\n")
        cli_times = []
        for _ in range(max(1, args.repeats // 2)):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "seqtrans", "evalb", str(g), str(t)], check=True,
                           stdout=subprocess.DEVNULL)
            cli_times.append(time.perf_counter() - start)
    cli = statistics.median(cli_times)

    result = {
        "sentences": SENTENCES, "api_seconds": round(api, 3), "command_seconds": round(cli, 3),
        "api_sentences_per_s": round(SENTENCES / api), "target_seconds": 1.0,
        "api_vs_target": round(1.0 / api, 2), "f1_of_the_test_side": round(report.all.fmeasure, 2),
        "machine": platform.processor() or platform.machine(), "python": platform.python_version(),
    }
    print(f"EVALB on {SENTENCES} sentences: API {api:.3f} s ({SENTENCES / api:,.0f} sentences/s), "
          f"command {cli:.3f} s with start-up; target 1 s -> {1.0 / api:.1f}x faster than needed")
    out = RESULTS / "parsing_evalb.json"
    write_results(out, result, sort_keys=False)
    print(f"wrote {out.relative_to(ROOT)}")
