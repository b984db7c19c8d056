"""Multi30k en->de within a training budget: test2016 sacreBLEU and wall time.

Runs ``seqtrans run translation`` (the ``cpu`` preset unless told otherwise) through the
Python API, then prints the score beside the targets and a reference point, with
ratios, and writes everything to ``benchmarks/results/translation_multi30k[-TAG].json``:

    python -m benchmarks translation_multi30k                   # cpu preset, 30 minutes
    python -m benchmarks translation_multi30k --set train.max_minutes=5 --tag short

Reference points: a small Hugging Face Marian model with sentencepiece reaches 29.85
BLEU in 30 minutes of training on the same 2-core CPU; published small Transformers
reach about 35-41 on this test set.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from pathlib import Path

import torch

import seqtrans
from benchmarks.common import RESULTS, arguments, write_results
from seqtrans import config as cfg

TARGET_CPU, TARGET_GPU, MARIAN_CPU = 35.0, 40.0, 29.85
SAMPLES = ["A man is riding a bicycle.", "Two dogs are playing in the snow.",
           "A little girl in a pink dress is climbing the stairs."]


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[],
                        metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path,
                        help="run directory (default: runs/bench-translation-PRESET[-TAG])")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--tag", default="", help="suffix of the run directory and the results file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    suffix = f"-{args.tag}" if args.tag else ""
    out = args.out or Path("runs") / f"bench-translation-{args.preset}{suffix}"
    config = seqtrans.resolve_config("translation", preset=args.preset, overrides=args.overrides)
    started = time.perf_counter()
    metrics = seqtrans.run(config, out, device=args.device)
    wall = time.perf_counter() - started
    loaded = seqtrans.load(out, device=args.device)
    samples = dict(zip(SAMPLES, seqtrans.predict(loaded, SAMPLES)))

    bleu = float(metrics["bleu"])
    gpu = loaded.device.type == "cuda"
    target = TARGET_GPU if gpu else TARGET_CPU
    result = {
        "benchmark": "translation_multi30k",
        "preset": args.preset,
        "overrides": args.overrides,
        "test_set": config.data.test_set or "test_2016_flickr",
        "direction": f"{config.data.source_lang}-{config.data.target_lang}",
        "metrics": metrics,
        "wall_minutes": round(wall / 60, 2),
        "target_bleu": target,
        "bleu_over_target": round(bleu / target, 3),
        "reference": {"name": "Hugging Face Marian + sentencepiece, 30 CPU minutes", "bleu": MARIAN_CPU},
        "bleu_over_reference": round(bleu / MARIAN_CPU, 3),
        "samples": samples,
        "config": cfg.to_dict(config),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpus": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "device": str(loaded.device)},
    }
    path = write_results(RESULTS / f"translation_multi30k{suffix}.json", result, ensure_ascii=False)

    rows = [("test2016 sacreBLEU", f"{bleu:.2f}"), ("chrF", f"{float(metrics['chrf']):.2f}"),
            (f"target ({'GPU' if gpu else 'CPU'})", f"{target:.2f}"),
            ("BLEU / target", f"{bleu / target:.3f}"),
            ("Marian reference, 30 CPU min", f"{MARIAN_CPU:.2f}"),
            ("BLEU / Marian", f"{bleu / MARIAN_CPU:.3f}"),
            ("training minutes", f"{metrics['train_minutes']}"),
            ("wall minutes (all)", f"{wall / 60:.2f}"),
            ("training tokens/s", f"{metrics['train_tokens_per_s']}"),
            ("updates", f"{metrics['train_steps']}"),
            ("signature", str(metrics["bleu_signature"]))]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")
    for src, hyp in samples.items():
        print(f"  {src}  ->  {hyp}")
    print(f"wrote {path}")
