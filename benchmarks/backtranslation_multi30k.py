"""Back-translation with sampling on Multi30k (Edunov et al. 2018; tagged, Caswell et al. 2019).

The training pairs are split in two halves, in file order. The first half is the
"real" parallel data; the second plays monolingual German, its English side never used.

1. backward: a de->en model trained on the real half;
2. synthetic: the German side of the held-out half translated into English by that
   model, one sample each (``decode.sample=1``, with ``--temperature`` and ``--top-p``),
   each synthetic source tagged with ``--tag`` at its start;
3. forward models, en->de, the same budget each: on the real half alone, and on the
   real half plus the synthetic pairs.

test2016 BLEU (sacreBLEU, the translation task's settings) of all three is printed and
written to ``benchmarks/results/backtranslation_multi30k.json``. Models already trained in
``--work`` with the same settings are reused.

    python -m benchmarks backtranslation_multi30k --steps 1500 --mirror ../shared/data/multi30k
    python -m benchmarks backtranslation_multi30k --smoke --mirror ../shared/data/multi30k

``--smoke`` runs the whole recipe in seconds on a sliver of the data with a tiny model
(its numbers mean nothing): a check that the steps fit together.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import time
from pathlib import Path
from typing import Any

import sacrebleu
import torch

import seqtrans
from benchmarks.common import RESULTS, arguments, budget, write_results
from seqtrans import pipeline, tasks
from seqtrans.inference import evaluation, loading
from seqtrans.runtime import atomic
from seqtrans.tasks import Example

OUT = RESULTS / "backtranslation_multi30k.json"
TINY = ["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=32", "model.d_ff=64",
        "model.heads=2", "data.vocab_size=1000", "train.max_tokens=512"]


def common(args: argparse.Namespace) -> list[str]:
    """Settings of every run: the budget, the data source, and the smoke test's tiny model."""
    out = budget(args.steps)
    if args.mirror:
        out.append(f"data.mirror={Path(args.mirror).resolve()}")
    if args.smoke:
        out += [*TINY, "train.eval_every=2", "train.valid_max_examples=20"]
    return out


def _task(args: argparse.Namespace) -> Any:
    """The translation task en->de with the common settings."""
    config = seqtrans.resolve_config("translation", preset="cpu", overrides=common(args))
    return tasks.load("translation")(config.data)


def _test(args: argparse.Namespace, direction: str) -> list[str]:
    """The smoke run's small test file in one direction; nothing for a real run (test2016)."""
    return [f"data.test_tsv={(Path(args.work) / f'test.{direction}.tsv').resolve()}"] if args.smoke else []


def halves(args: argparse.Namespace) -> tuple[list[Example[str, str]], list[Example[str, str]]]:
    """The training pairs (en source, de target) in file order, split in two halves."""
    pairs = list(evaluation.read_split(_task(args), "train").examples)
    if args.smoke:
        pairs = pairs[:200]
    middle = len(pairs) // 2
    return pairs[:middle], pairs[middle:]


def write_tsv(path: Path, rows: list[tuple[str, str]]) -> Path:
    # Multi30k has a tab inside one German sentence: in a TSV field it would be a third field
    atomic.write_text(path, "".join(f"{' '.join(a.split())}\t{' '.join(b.split())}\n" for a, b in rows))
    return path.resolve()


def train(name: str, overrides: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Train one model (unless ``--work`` holds it already); its run's metrics."""
    out = Path(args.work) / name
    done = out / "metrics.json"
    if not done.is_file():
        config = seqtrans.resolve_config("translation", preset="cpu", overrides=[*common(args), *overrides])
        started = time.perf_counter()
        pipeline.run(config, out, device=args.device)
        logging.info("%s trained in %.1f minutes", name, (time.perf_counter() - started) / 60)
    return dict(json.loads(done.read_text()))


def back_translate(args: argparse.Namespace, german: list[str]) -> list[str]:
    """English samples of German sentences from the backward model, one each."""
    loaded = loading.load(Path(args.work) / "backward", device=args.device,
                          overrides=["decode.sample=1", f"decode.seed={args.seed}",
                                     f"decode.temperature={args.temperature}", f"decode.top_p={args.top_p}"])
    predictions, _ = loaded.decode(german, progress=True)
    return [str(p) for p in predictions]


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--steps", type=int, default=1500, help="Updates of every model (default 1500).")
    parser.add_argument("--work", default="runs/backtranslation", help="Where the runs and data go.")
    parser.add_argument("--mirror", help="A directory holding the Multi30k files (data.mirror).")
    parser.add_argument("--tag", default="<BT>", help="Text before every synthetic source (default <BT>).")
    parser.add_argument("--temperature", type=float, default=1.0, help="Sampling temperature (default 1).")
    parser.add_argument("--top-p", type=float, default=1.0, help="Nucleus sampling's p (default 1: none).")
    parser.add_argument("--seed", type=int, default=1, help="decode.seed of the sampling (default 1).")
    parser.add_argument("--out", type=Path, default=OUT,
                        help=f"The results JSON (default benchmarks/results/{OUT.name}).")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice).")
    parser.add_argument("--smoke", action="store_true",
                        help="200 pairs, a tiny model, --steps 4 unless given: checks the recipe in seconds.")
    args = parser.parse_args(argv)
    if args.smoke and args.steps == parser.get_default("steps"):
        args.steps = 4
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)

    real, held_out = halves(args)
    if args.smoke:  # a few test sentences, so that scoring takes no time
        test = evaluation.read_split(_task(args), "test").examples[:20]
        write_tsv(work / "test.en-de.tsv", [(e.source, e.target) for e in test])
        write_tsv(work / "test.de-en.tsv", [(e.target, e.source) for e in test])
    real_en_de = write_tsv(work / "real.en-de.tsv", [(e.source, e.target) for e in real])
    real_de_en = write_tsv(work / "real.de-en.tsv", [(e.target, e.source) for e in real])
    backward = train("backward", ["data.source_lang=de", "data.target_lang=en",
                                  f"data.train_tsv={real_de_en}", *_test(args, "de-en")], args)
    synthetic = work / "synthetic.en-de.tsv"
    if not synthetic.is_file():
        english = back_translate(args, [e.target for e in held_out])
        write_tsv(synthetic, [(f"{args.tag} {en}", e.target) for en, e in zip(english, held_out)])
    synthetic_pairs = [line.split("\t", 1) for line in synthetic.read_text().splitlines()]
    # how far the synthetic sources are from the real English of the held-out half (never trained on)
    noise = sacrebleu.corpus_bleu([en.removeprefix(f"{args.tag} ") for en, _ in synthetic_pairs],
                                  [[" ".join(e.source.split()) for e in held_out]]).score
    mixed = write_tsv(work / "real+synthetic.en-de.tsv",
                      [(e.source, e.target) for e in real] + [(en, de) for en, de in synthetic_pairs])
    forward_real = train("forward-real", [f"data.train_tsv={real_en_de}", *_test(args, "en-de")], args)
    forward_bt = train("forward-real+bt", [f"data.train_tsv={mixed}", *_test(args, "en-de")], args)

    rows = [{"model": "de-en, real half (backward)", "bleu": backward["bleu"]},
            {"model": "en-de, real half", "bleu": forward_real["bleu"]},
            {"model": "en-de, real half + tagged sampled back-translations", "bleu": forward_bt["bleu"]}]
    for row in rows:
        print(f"{row['model']:<55} BLEU {row['bleu']:.2f}")
    print(f"{'synthetic English against the real English':<55} BLEU {noise:.2f}")
    result = {"steps": args.steps, "real_pairs": len(real), "synthetic_pairs": len(held_out),
              "sampling": {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed},
              "tag": args.tag, "synthetic_bleu_against_real_english": noise, "rows": rows,
              "machine": platform.processor() or platform.machine(),
              "torch": torch.__version__}
    if args.smoke:
        print("smoke run: nothing written to", args.out)
        return
    write_results(args.out, result)
    print(f"wrote {args.out}")
