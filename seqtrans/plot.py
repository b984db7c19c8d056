"""Learning curves of runs, from their own logs (``DIR/train.jsonl``), as a PNG:
``seqtrans plot RUN_DIR [RUN_DIR ...]``. Needs matplotlib (``pip install seqtrans[plot]``).

Each panel holds one quantity for every run: training loss, learning rate and
tokens/s (logged every ``train.log_every`` updates), dev loss and the task's dev
metrics (every validation); the left column against updates, the right against
training minutes (validation excluded). A run that was resumed logged some updates
twice; the later record of an update is the one kept.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seqtrans import atomic
from seqtrans.errors import DataError, UsageError

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
    metrics = sorted({k for c in runs.values() for r in c.get("validation", [])
                      for k in r if k.startswith("dev_") and k not in ("dev_loss", "dev_ppl")})
    panels = _PANELS + [("validation", m, f"dev {m[4:].replace('_', ' ')}") for m in metrics] + _AFTER
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 2.4 * len(panels)), squeeze=False)
    for row, (event, key, title) in enumerate(panels):
        for col, x_key in enumerate(("step", "seconds")):
            ax = axes[row][col]
            for name, c in runs.items():
                records = [r for r in c.get(event, []) if key in r and x_key in r]
                xs = [r[x_key] / 60 if x_key == "seconds" else r[x_key] for r in records]
                ax.plot(xs, [r[key] for r in records], marker="." if event == "validation" else None,
                        label=name)
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
