"""Import and export of a base-size Marian model, and decoding it against transformers' ``generate``.

A Marian model of OPUS-MT's shape (d_model 512, d_ff 2048, 6 + 6 layers, 8 heads, a
vocabulary of 58,101 symbols, swish) is built with random weights by transformers and
saved as a model directory (its sentencepiece models are small; vocab.json is filled
to the full size). Then, each in its own process so that its peak memory is its own:

- ``seqtrans import hf-marian`` of that directory, and ``seqtrans export --to hf-marian``
  of the imported run: wall-clock seconds and peak resident memory, also as a multiple
  of the model's size in float32 and over the process's memory before the conversion
  (Python, torch and seqtrans loaded);
- loading the imported run for decoding in fp32 and in int8 (``decode.precision``):
  seconds, peak memory, and what the loaded model holds after;
- decoding ``--sentences`` sources at beam 4 in one batch, to a fixed number of tokens
  (random weights never end by themselves), by seqtrans (searching as transformers
  does: decode.length_penalty=power, decode.end_in_beam) and by ``generate`` with the
  same beam and length limit, in one process; the ratio of their times (median of
  ``--repeats``).

Needs the ``bench`` extra (transformers). Results go to
benchmarks/results/pretrained_marian-cpu.json.

    python -m benchmarks pretrained_marian
    python -m benchmarks pretrained_marian --sentences 32 --tokens 32 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import ROOT, arguments, process_peak_mib, resident_mib, timed, write_json

VOCAB = 58101
WORDS = "the a small big dog cat house tree runs sees green old man woman child walks near under".split()


def build(directory: Path) -> None:
    """A random base-size Marian model with its tokenizer files."""
    import io

    import sentencepiece as spm
    from transformers import MarianConfig, MarianMTModel

    texts = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(8)) for i in range(200)]
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=buffer,
        vocab_size=60,
        model_type="unigram",
        hard_vocab_limit=False,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(buffer.getvalue())
    pieces = [
        sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))
    ]
    symbols = ["</s>", "<unk>", *pieces]
    symbols += [f"▁w{i}" for i in range(VOCAB - 1 - len(symbols))] + ["<pad>"]
    config = MarianConfig(
        vocab_size=VOCAB,
        decoder_vocab_size=VOCAB,
        d_model=512,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
        max_position_embeddings=512,
        pad_token_id=VOCAB - 1,
        eos_token_id=0,
        decoder_start_token_id=VOCAB - 1,
        activation_function="swish",
        scale_embedding=True,
    )
    torch.manual_seed(0)
    MarianMTModel(config).save_pretrained(directory)
    for name in ("source.spm", "target.spm"):
        (directory / name).write_bytes(buffer.getvalue())
    (directory / "vocab.json").write_text(json.dumps({s: i for i, s in enumerate(symbols)}), encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps({"separate_vocabs": False}), encoding="utf-8")


def convert(phase: str, source: Path, out: Path) -> dict[str, float]:
    """Import or export in this process: seconds and peak memory."""
    from seqtrans.inference import formats
    from seqtrans.inference.loading import load

    fmt = formats.load("hf-marian")
    before = resident_mib()
    start = time.perf_counter()
    if phase == "import":
        fmt.import_model(source, out=out)
    else:
        fmt.export_model(load(source, device="cpu"), out=out)
    return {"seconds": time.perf_counter() - start, "peak_mib": process_peak_mib(), "before_mib": before}


def load_in(precision: str, run: Path) -> dict[str, float]:
    """Load the imported run for decoding in ``precision`` in this process: seconds,
    peak memory, and the memory the loaded model holds after (the process's resident
    set then, over before)."""
    from seqtrans.inference.loading import load

    before = resident_mib()
    start = time.perf_counter()
    loaded = load(run, overrides=[f"decode.precision={precision}"], device="cpu")
    seconds = time.perf_counter() - start
    held = resident_mib() - before
    del loaded
    return {"seconds": seconds, "peak_mib": process_peak_mib(), "before_mib": before, "held_mib": held}


def decode(hf_dir: Path, run: Path, *, sentences: int, tokens: int, repeats: int) -> dict[str, float]:
    from transformers import MarianMTModel

    from seqtrans.config import DecodeConfig
    from seqtrans.inference.loading import load

    loaded = load(run, device="cpu")
    hf = MarianMTModel.from_pretrained(hf_dir).eval()
    texts = [" ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(12)) for i in range(sentences)]
    settings = DecodeConfig(
        beam=4,
        alpha=1.0,
        length_penalty="power",
        end_in_beam=True,
        max_len_a=0.0,
        max_len_b=tokens,
        min_len=tokens,
        batch_tokens=1_000_000,
    )
    vocab = loaded.codec.vocabularies.source
    marian = json.loads((hf_dir / "vocab.json").read_text(encoding="utf-8"))
    symbols = vocab.symbols
    src_ids = [[marian[symbols[i]] for i in vocab.encode(loaded.codec.source_tokens(t))] + [0] for t in texts]
    width = max(map(len, src_ids))
    pad = hf.config.pad_token_id
    src = torch.tensor([s + [pad] * (width - len(s)) for s in src_ids])

    def ours() -> None:
        loaded.decode(texts, decode=settings)

    def theirs() -> None:
        with torch.inference_mode():
            hf.generate(
                input_ids=src,
                attention_mask=src.ne(pad),
                num_beams=4,
                do_sample=False,
                max_length=tokens + 2,
                min_length=tokens + 1,
                length_penalty=1.0,
                early_stopping="never",
                bad_words_ids=[[pad]],
            )

    seqtrans_s = timed(ours, torch.device("cpu"), repeats=repeats)
    transformers_s = timed(theirs, torch.device("cpu"), repeats=repeats)
    return {
        "seqtrans_s": seqtrans_s,
        "transformers_s": transformers_s,
        "speedup": transformers_s / seqtrans_s,
    }


def _child(*args: str, flags: tuple[str, ...] = ()) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks", "pretrained_marian", *flags, "--phase", *args], cwd=ROOT,
        check=True, capture_output=True, text=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--sentences", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32, help="Output tokens per sentence.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--phase", nargs="+", help=argparse.SUPPRESS)  # one step, in a process of its own
    args = parser.parse_args(argv)
    if args.phase:
        phase, *paths = args.phase
        if phase == "build":
            build(Path(paths[0]))
            result: dict[str, Any] = {}
        elif phase in ("import", "export"):
            result = convert(phase, Path(paths[0]), Path(paths[1]))
        elif phase == "load":
            result = load_in(paths[0], Path(paths[1]))
        else:
            result = decode(
                Path(paths[0]),
                Path(paths[1]),
                sentences=args.sentences,
                tokens=args.tokens,
                repeats=args.repeats,
            )
        print(json.dumps(result))
        return
    with tempfile.TemporaryDirectory(prefix="marian-bench-") as scratch:
        base = Path(scratch)
        _child("build", str(base / "hf"))
        size_mib = sum(p.stat().st_size for p in (base / "hf").iterdir()) / 2**20
        imported = _child("import", str(base / "hf"), str(base / "run"))
        exported = _child("export", str(base / "run"), str(base / "out"))
        loads = {p: _child("load", p, str(base / "run")) for p in ("fp32", "int8")}
        flags = (
            "--sentences",
            str(args.sentences),
            "--tokens",
            str(args.tokens),
            "--repeats",
            str(args.repeats),
        )
        speed = _child("decode", str(base / "hf"), str(base / "run"), flags=flags)
    for r in (imported, exported, *loads.values()):
        r["peak_over_model"] = r["peak_mib"] / size_mib
        r["growth_over_model"] = (r["peak_mib"] - r["before_mib"]) / size_mib
    for r in loads.values():
        r["held_over_model"] = r["held_mib"] / size_mib
    result = {
        "model_mib": size_mib,
        "import": imported,
        "export": exported,
        "load_fp32": loads["fp32"],
        "load_int8": loads["int8"],
        "decode": {"sentences": args.sentences, "tokens": args.tokens, "beam": 4, **speed},
    }
    path = write_json("pretrained_marian", result, torch.device("cpu"))
    print(json.dumps(result, indent=2))
    print(f"wrote {path}")
