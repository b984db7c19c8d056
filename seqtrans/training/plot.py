"""Learning curves of runs, from their own logs (``DIR/train.jsonl``), as a PNG:
``seqtrans plot RUN_DIR [RUN_DIR ...]``. Needs matplotlib (``pip install seqtrans[plot]``).

Each panel holds one quantity for every run: training loss, learning rate and
tokens/s (logged every ``train.log_every`` updates), dev loss and the task's dev
metrics (every validation); the left column against updates, the right against
training minutes (validation excluded). A run that was resumed logged some updates
twice; the later record of an update is the one kept. The validation metric of each
run's task is marked at its best validation, by the task's direction (``metric_mode``:
higher is better, or lower for an error rate), which its panel's title says. A run
that logged too little to draw a curve of (no quantity at two updates) is named in a
warning and drawn as points; when every run is, that is an error and nothing is written.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from seqtrans import tasks
from seqtrans.errors import DataError, SeqtransError, UsageError
from seqtrans.runtime import atomic
from seqtrans.tasks.protocol import metric_mode

log = logging.getLogger(__name__)

#: (event, key, title) of the panels, top to bottom; dev metrics follow dev loss.
_PANELS = [("train", "loss", "training loss"), ("validation", "dev_loss", "dev loss")]
_AFTER = [("train", "lr", "learning rate"), ("train", "tokens_per_s", "target tokens/s")]


def curves(run_dir: str | Path) -> dict[str, list[dict[str, Any]]]:
    """The records of a run's log by event (``train``, ``validation``), one per update,
    in update order."""
    path = Path(run_dir) / "train.jsonl"
    if not path.is_file():
        raise UsageError(f"{run_dir}: not a run directory (no train.jsonl)")
    by_event: dict[str, dict[int, dict[str, Any]]] = {}
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                event, step = record["event"], int(record["step"])
            except (ValueError, KeyError, TypeError) as exc:
                raise DataError(path, number, f"not a log record ({exc})") from None
            by_event.setdefault(event, {})[step] = record  # a resumed run logs an update again
    return {event: [records[s] for s in sorted(records)] for event, records in by_event.items()}


def task_metric(run_dir: str | Path) -> tuple[str, str] | None:
    """The key of the run's validation metric in its log (``dev_METRIC``) and its direction
    ("max" or "min"), from the task its ``config.json`` names; None when the run has no
    config or its task is not installed (its curves are drawn all the same)."""
    try:
        task_cls = tasks.load(json.loads((Path(run_dir) / "config.json").read_text(encoding="utf-8"))["task"])
        return f"dev_{task_cls.metric}", metric_mode(task_cls)
    except (OSError, ValueError, KeyError, TypeError, SeqtransError):
        return None


def best_validation(records: Sequence[dict[str, Any]], key: str, mode: str) -> dict[str, Any] | None:
    """The first validation record with the best ``key`` (highest for ``mode`` "max",
    lowest for "min"), as early stopping counts it; None when no record has it."""
    scored = [r for r in records if key in r]
    if not scored:
        return None
    sign = 1.0 if mode == "max" else -1.0
    return max(scored, key=lambda r: sign * float(r[key]))  # max() keeps the first of equals


def labels(run_dirs: Sequence[str | Path]) -> list[str]:
    """The runs' names in the legend: their directories' names, or their paths where
    two share a name."""
    names = [Path(d).name or str(d) for d in run_dirs]
    return names if len(set(names)) == len(names) else [str(d) for d in run_dirs]


def plot(run_dirs: Sequence[str | Path], out: str | Path) -> Path:
    """Write the learning curves of ``run_dirs`` to ``out`` (PNG)."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError("seqtrans plot needs matplotlib: pip install 'seqtrans[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {name: curves(d) for name, d in zip(labels(run_dirs), run_dirs, strict=True)}
    _check_drawable(runs, run_dirs)
    watched = {name: task_metric(d) for name, d in zip(runs, run_dirs, strict=True)}
    metrics = sorted({k for c in runs.values() for r in c.get("validation", [])
                      for k in r if k.startswith("dev_") and k not in ("dev_loss", "dev_ppl")})
    panels = _PANELS + [("validation", m, _title(m, watched.values())) for m in metrics] + _AFTER
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 2.4 * len(panels)), squeeze=False)
    for row, (event, key, title) in enumerate(panels):
        for col, x_key in enumerate(("step", "seconds")):
            ax = axes[row][col]
            for name, c in runs.items():
                records = [r for r in c.get(event, []) if key in r and x_key in r]
                xs = [r[x_key] / 60 if x_key == "seconds" else r[x_key] for r in records]
                dots = event == "validation" or len(records) == 1  # a lone point drawn as a line is not seen
                line, = ax.plot(xs, [r[key] for r in records], marker="." if dots else None, label=name)
                found = watched[name]
                best = best_validation(records, key, found[1]) if found and found[0] == key else None
                if best is not None:
                    ax.plot([best[x_key] / 60 if x_key == "seconds" else best[x_key]], [best[key]],
                            marker="*", markersize=11, color=line.get_color())
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("updates" if x_key == "step" else "training minutes", fontsize=9)
            ax.grid(alpha=0.3)
            if key == "lr":
                ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    with atomic.replacing(out) as f:
        fig.savefig(f, format="png", dpi=90)
    plt.close(fig)
    return out


def too_little(run_curves: dict[str, list[dict[str, Any]]]) -> str | None:
    """What a run logged, when it is too little to draw a curve of (no quantity logged at
    two updates); None when it is enough."""
    train = len([r for r in run_curves.get("train", []) if "loss" in r])
    validations = len(run_curves.get("validation", []))
    if train >= 2 or validations >= 2:
        return None
    return (f"its log holds {train} training line(s) and {validations} validation(s), too little to draw a "
            "curve (a run logs every train.log_every updates and validates every train.eval_every)")


def _check_drawable(runs: dict[str, dict[str, list[dict[str, Any]]]], run_dirs: Sequence[str | Path]) -> None:
    """A warning for each run too thin to draw (its points are still drawn); a DataError,
    and nothing written, when no run is drawable."""
    thin = {d: problem for c, d in zip(runs.values(), run_dirs, strict=True)
            if (problem := too_little(c)) is not None}
    if len(thin) == len(runs):
        first, problem = next(iter(thin.items()))
        others = f" (and the {len(thin) - 1} other run(s) as little)" if len(thin) > 1 else ""
        raise DataError(Path(first) / "train.jsonl", None, f"{problem}{others}; nothing drawn")
    for run_dir, problem in thin.items():
        log.warning("%s: %s; drawn as points", Path(run_dir) / "train.jsonl", problem)


def _title(key: str, watched: Iterable[tuple[str, str] | None]) -> str:
    """A dev metric's panel title, with the direction of the runs' tasks that validate on it."""
    modes = {found[1] for found in watched if found is not None and found[0] == key}
    words = {"max": " (higher is better)", "min": " (lower is better)"}
    return f"dev {key[4:].replace('_', ' ')}{words[modes.pop()] if len(modes) == 1 else ''}"
