"""The decoding toolbox's cost: sampling against greedy, required phrases against plain beam.

Sampling against greedy search, and beam search with required phrases (dynamic beam
allocation) against the same beam without them.

A random-weight model of the ``--shape`` decodes the same source batch through
``seqtrans.decoding.generate.generate`` in every mode, and every output is exactly
``--out-len`` tokens long (minimum = maximum length), so that each mode does the same
number of decoder steps. The modes:

- greedy; sampling (one sample per input) from the model's distribution, with top-k 50
  and with top-p 0.9, each one's ratio to greedy in target tokens per second (target:
  within 10 %). Top-p sorts only the 64 most probable tokens of a row whose nucleus
  lies among them, and the whole vocabulary of the others: the random weights' near-uniform
  distributions are the worst case, every row sorted whole;
- beam ``--beam`` (8); the same with ``--phrases`` (3) required phrases of two random
  tokens per input, its time over the unconstrained time (target: within 2x).

Writes ``benchmarks/results/decode_toolbox-<device>.json``.

    python -m benchmarks decode_toolbox                 # base shape, batch 32
    python -m benchmarks decode_toolbox --run runs/m30k # a trained model on its test sentences
    python -m benchmarks decode_toolbox --smoke         # tiny shapes: checks the script in seconds
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import arguments, device_name, pick_device, timed, write_json
from benchmarks.decode_speed import SHAPES, seqtrans_model, sources
from seqtrans.config import DecodeConfig
from seqtrans.data.batches import source_ids
from seqtrans.data.vocab import EOS, PAD
from seqtrans.decoding.generate import generate
from seqtrans.inference.evaluation import read_split
from seqtrans.inference.loading import load

TINY = {"layers": 1, "d_model": 32, "d_ff": 64, "heads": 2, "vocab": 50}


def required_phrases(batch: int, vocab: int, *, phrases: int, seed: int = 0) -> list[list[list[int]]]:
    """``phrases`` phrases of two tokens per input, drawn from the ordinary tokens."""
    rng = random.Random(seed)
    return [[[rng.randrange(4, vocab) for _ in range(2)] for _ in range(phrases)] for _ in range(batch)]


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--shape", default="base", choices=sorted(SHAPES))
    parser.add_argument("--run", type=Path, help="A trained run to time instead of random weights "
                        "(its test sentences as the sources).")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--beam", type=int, default=8)
    parser.add_argument("--phrases", type=int, default=3, help="Required phrases per input (default 3).")
    parser.add_argument("--out-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--smoke", action="store_true",
                        help="A tiny model, batch 4, one repeat; writes nothing.")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.smoke:
        args.batch, args.out_len, args.repeats = 4, 8, 1
    device = pick_device(args.device)
    shape = TINY if args.smoke else SHAPES[args.shape]
    if args.run is not None:  # a trained model and the first sentences of its test split
        loaded = load(args.run, device=device)
        model, vocab = loaded.model, len(loaded.codec.vocabularies.target)
        test = read_split(loaded.task, "test").examples[: args.batch]
        inputs = [source_ids(loaded.codec, e.source) for e in test]
    else:
        model, vocab = seqtrans_model(shape, device), shape["vocab"]
        inputs = [[t for t in row if t != PAD] for row in sources(args.batch, vocab).tolist()]
    assert all(row[-1] == EOS for row in inputs)
    required = required_phrases(args.batch, vocab, phrases=args.phrases)
    fixed = {"max_len_a": 0.0, "max_len_b": args.out_len, "min_len": args.out_len, "batch_tokens": 10**9}
    modes: dict[str, tuple[DecodeConfig, Any]] = {
        "greedy": (DecodeConfig(beam=1, **fixed), None),
        "sampling": (DecodeConfig(sample=1, seed=1, **fixed), None),
        "sampling, top-k 50": (DecodeConfig(sample=1, top_k=50, seed=1, **fixed), None),
        "sampling, top-p 0.9": (DecodeConfig(sample=1, top_p=0.9, seed=1, **fixed), None),
        f"beam {args.beam}": (DecodeConfig(beam=args.beam, **fixed), None),
        f"beam {args.beam}, {args.phrases} required phrases":
            (DecodeConfig(beam=args.beam, **fixed), required),
    }
    rows = []
    with torch.inference_mode():
        for name, (config, phrases) in modes.items():
            def decode(config: DecodeConfig = config, phrases: Any = phrases) -> None:
                out = generate(model, inputs, config, device=device, required=phrases)
                assert all(len(h[0].tokens) == args.out_len for h in out)

            seconds = timed(decode, device, repeats=args.repeats)
            tokens_per_s = args.batch * args.out_len / seconds
            rows.append({"mode": name, "seconds": seconds, "tokens_per_s": tokens_per_s})
            print(f"{name:<40} {seconds:8.3f} s  {tokens_per_s:9.1f} target tokens/s", flush=True)
    by_mode = {row["mode"]: row for row in rows}
    sampling_ratios = {mode: row["tokens_per_s"] / by_mode["greedy"]["tokens_per_s"]
                       for mode, row in by_mode.items() if mode.startswith("sampling")}
    beam = f"beam {args.beam}"
    phrases_ratio = by_mode[f"{beam}, {args.phrases} required phrases"]["seconds"] / by_mode[beam]["seconds"]
    for mode, ratio in sampling_ratios.items():
        print(f"{mode} / greedy tokens/s: {ratio:.3f} (target >= 0.9)")
    print(f"beam with phrases / without, time: {phrases_ratio:.3f} (target <= 2)")
    if args.smoke:
        return
    name = "decode_toolbox" if args.run is None else f"decode_toolbox-{args.run.name}"
    path = write_json(name, {
        "shape": args.shape if args.run is None else str(args.run), "batch": args.batch, "beam": args.beam,
        "phrases": args.phrases,
        "out_len": args.out_len, "repeats": args.repeats, "machine": device_name(device), "rows": rows,
        "sampling_over_greedy": sampling_ratios, "phrases_over_beam_time": phrases_ratio}, device)
    print(f"wrote {path}")
