"""Fine-tuning a pretrained Marian model on Multi30k, from the command line.

The worked example of docs/pretrained.md, run as a user runs it, each step a
``seqtrans`` command:

1. ``seqtrans import hf-marian MARIAN --out WORK/imported`` (``--marian``, e.g. an
   OPUS-MT en-de directory); or, with ``--from-run RUN``, first
   ``seqtrans export RUN --to hf-marian WORK/marian`` and import that;
2. ``seqtrans evaluate WORK/imported`` on test2016: BLEU before fine-tuning;
3. ``seqtrans run translation --init WORK/imported --out WORK/tuned`` with the cpu
   preset's training settings, ``--steps`` updates at ``--lr-scale`` after ``--warmup``;
   its test2016 BLEU after fine-tuning.

Both BLEU scores use the same decoding settings (the cpu preset's). Steps already done in
``--work`` are reused. Results go to ``benchmarks/results/finetune_multi30k.json``.

    python -m benchmarks finetune_multi30k --marian opus-mt-en-de --mirror ../shared/data/multi30k
    python -m benchmarks finetune_multi30k --from-run runs/backtranslation/forward-real \\
        --mirror ../shared/data/multi30k
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import RESULTS, arguments, budget, device_name, seqtrans_command, write_results

OUT = RESULTS / "finetune_multi30k.json"


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    start = parser.add_mutually_exclusive_group(required=True)
    start.add_argument("--marian", type=Path, help="A Hugging Face Marian model directory to start from.")
    start.add_argument("--from-run", type=Path, help="A seqtrans translation run, exported to Marian first.")
    parser.add_argument("--work", type=Path, default=Path("runs/finetune"), help="Where the runs go.")
    parser.add_argument("--mirror", help="A directory holding the Multi30k files (data.mirror).")
    parser.add_argument("--train-tsv", type=Path,
                        help="Fine-tune on this TSV file instead of Multi30k's training set.")
    parser.add_argument("--steps", type=int, default=300, help="Fine-tuning updates (default 300).")
    parser.add_argument("--lr-scale", type=float, default=0.5, help="train.lr_scale (default 0.5).")
    parser.add_argument("--warmup", type=int, default=100, help="train.warmup (default 100).")
    parser.add_argument("--out", type=Path, default=OUT,
                        help=f"The results JSON (default benchmarks/results/{OUT.name}).")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    data = ["data.dataset=multi30k", *([f"data.mirror={Path(args.mirror).resolve()}"] if args.mirror else [])]
    marian = args.marian
    if args.from_run is not None:
        marian = args.work / "marian"
        if not marian.is_dir():
            seqtrans_command("export", str(args.from_run), "--to", "hf-marian", str(marian))
    imported = args.work / "imported"
    if not imported.is_dir():
        seqtrans_command("import", "hf-marian", str(marian), "--out", str(imported))
    # the cpu preset's decoding settings for both scores (an import takes Marian's own)
    decode = ["decode.beam=4", "decode.alpha=1.4", "decode.length_penalty=gnmt"]
    before = json.loads(seqtrans_command("evaluate", str(imported), "--set", *data, *decode))

    train = [*budget(args.steps, warmup=args.warmup, average_last=None), f"train.lr_scale={args.lr_scale}"]
    if args.train_tsv is not None:
        train.append(f"data.train_tsv={args.train_tsv.resolve()}")
    tuned = args.work / "tuned"
    if not (tuned / "metrics.json").is_file():
        seqtrans_command("run", "translation", "--preset", "cpu", "--init", str(imported), "--out",
                         str(tuned), "--device", "cpu", "--set", *data, *train, *decode)
    after: dict[str, Any] = json.loads((tuned / "metrics.json").read_text())
    print(f"test2016 BLEU before fine-tuning {before['bleu']:.2f}, after {after['bleu']:.2f} "
          f"({args.steps} updates, {after.get('train_minutes', 0):.1f} minutes of training)")
    write_results(args.out, {
        "start": str(args.marian or args.from_run), "train_data": str(args.train_tsv or "multi30k train"),
        "steps": args.steps, "lr_scale": args.lr_scale, "warmup": args.warmup, "decode": decode,
        "bleu_before": before["bleu"], "chrf_before": before["chrf"],
        "bleu_after": after["bleu"], "chrf_after": after["chrf"],
        "train_minutes": after.get("train_minutes"),
        "machine": device_name(torch.device("cpu")), "torch": torch.__version__,
    })
    print(f"wrote {args.out}")
