"""Imported Hugging Face families against CTranslate2 on the same weights: import, decoding speed, memory.

A model of NLLB-200-distilled-600M's shape (``--shape nllb-600m``: 12 + 12 layers,
d_model 1,024, d_ff 4,096, 16 heads, 256,206 words, M2M-100's architecture) is built
with random weights by transformers and saved as a model directory, with a tokenizer
of that many made-up pieces (``▁w0`` ...) and NLLB's language codes, saved as
transformers saves NLLB's. ``--shape nllb-small`` is the same architecture at 2 + 2
layers of width 256, for a quick look. ``--shape t5-small`` is t5-small's (T5 v1.0:
6 + 6 layers, d_model 512, d_ff 2,048, 8 heads, ReLU, the head tied to the embeddings,
32,128 rows), with a unigram tokenizer of made-up pieces and T5's sentinels;
``--shape flan-t5-small`` is flan-t5-small's (T5 v1.1: 8 + 8 layers, d_model 512, d_ff
1,024, 6 heads of 64, a gated GELU feed-forward, an untied head), with the same
tokenizer; ``--shape bart-base`` is bart-base's (6 + 6 post-norm layers, d_model 768, d_ff
3,072, 12 heads, GELU, learned positions, 50,265 words), with a byte-level BPE tokenizer
of made-up pieces as BART's is. Then, each
in its own process so that its time and peak memory are its own:

- ``seqtrans import hf`` of the directory: seconds and peak resident memory, also as a
  multiple of the weights' size;
- CTranslate2's own converter (``ct2-transformers-converter``) of the same directory,
  to float32 and to int8;
- decoding ``--sentences`` sources of ``--source-tokens`` pieces at beam 4, batch 1 (one
  sentence at a time; only the first ``--single`` where that is given) and batch ``--batch``
  (all together), to ``--tokens`` output
  tokens (random weights never end by themselves; both systems are held to that
  length), in float32 and int8, by seqtrans and by CTranslate2, each with each OpenMP
  wait policy (libgomp's default, ``ACTIVE`` and ``PASSIVE``, each in a fresh process:
  CTranslate2 bundles its own libgomp, which reads the policy once, and whose best policy
  differs by processor and case; ``seqtrans --wait-policy active`` is what a dedicated
  machine would set), ``--repeats`` times in turn; each system's tokens per
  second and peak memory, and seqtrans's ratio against CTranslate2 at its best policy,
  both at the ``PASSIVE`` policy the ``seqtrans`` command sets and at its own best;
- for NLLB, seqtrans in int8 with a vocabulary shortlist of Marian's usual size (50
  candidates per source token, 100 frequent tokens) that holds its unrestricted outputs
  (random weights have no translation table to count), against CTranslate2 int8 without
  one, and whether the outputs stayed the same.

Needs the ``bench`` extra (transformers, ctranslate2) and the translation plugin's
``hf`` extra. Results go to benchmarks/results/pretrained_families-SHAPE-CPU.json.

    python -m benchmarks pretrained_families --shape nllb-small --sentences 8
    python -m benchmarks pretrained_families --shape nllb-600m --sentences 32 --batch 32 --single 8
    python -m benchmarks pretrained_families --shape t5-small --sentences 32 --batch 32
    python -m benchmarks pretrained_families --shape flan-t5-small --sentences 32 --batch 32
    python -m benchmarks pretrained_families --shape bart-base --sentences 32 --batch 32
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS,
    ROOT,
    arguments,
    cpu_info,
    policy_environment,
    process_peak_mib,
    write_results,
)
from seqtrans.runtime.threads import WAIT_POLICIES

SHAPES: dict[str, dict[str, int]] = {
    "nllb-600m": {"layers": 12, "d_model": 1024, "d_ff": 4096, "heads": 16, "vocab": 256206},
    "nllb-small": {"layers": 2, "d_model": 256, "d_ff": 1024, "heads": 4, "vocab": 256206},
    # t5-small: v1.0 (ReLU, the head tied to the embeddings), 32,100 tokens in a table of 32,128
    "t5-small": {"layers": 6, "d_model": 512, "d_ff": 2048, "heads": 8, "vocab": 32128},
    # flan-t5-small: v1.1 (a gated GELU, the head untied), heads of 64 (384 wide, not 512)
    "flan-t5-small": {"layers": 8, "d_model": 512, "d_ff": 1024, "heads": 6, "head_dim": 64, "vocab": 32128,
                      "gated": 1},
    # bart-base: post-norm, GELU, learned positions, the head tied to the embeddings
    "bart-base": {"layers": 6, "d_model": 768, "d_ff": 3072, "heads": 12, "vocab": 50265},
}
LANGUAGES = ("eng_Latn", "deu_Latn", "fra_Latn")
LETTERS = ["▁", "w", *"0123456789"]  # what the made-up words are spelled with
T5_WORDS = 32000 - 3 - len(LETTERS)  # T5's 32,000 pieces, of them <pad>, </s> and <unk>


def multilingual(shape: str) -> bool:
    return shape.startswith("nllb")


def bart(shape: str) -> bool:
    return shape.startswith("bart")


def words(shape: str) -> int:
    """How many made-up words ``w0`` ... the tokenizer of ``shape`` reads as one piece each."""
    if bart(shape):
        return SHAPES[shape]["vocab"] - 5 - len(LETTERS) - 1  # the specials, <mask>, and "Ġw"
    if not multilingual(shape):
        return T5_WORDS
    return SHAPES[shape]["vocab"] - 4 - len(LANGUAGES) - 1 - len(LETTERS) - 1  # and "▁w"
#: libgomp's own policy (a spell of spinning, then sleep: CTranslate2's best in some cases
#: of ``decode_speed``), and the two that ``OMP_WAIT_POLICY`` names; in lower case, as the
#: results' keys spell them
POLICIES = WAIT_POLICIES


def build(shape: str, directory: Path) -> dict[str, Any]:
    """A random model of ``shape`` and its tokenizer, saved into ``directory``."""
    if bart(shape):
        return _build_bart(shape, directory)
    if not multilingual(shape):
        return _build_t5(shape, directory)
    import torch
    import transformers

    s = SHAPES[shape]
    codes = list(LANGUAGES)
    # the specials, the codes and <mask> after the pieces; the characters the words are made of
    made_up = [f"▁w{i}" for i in range(words(shape))]
    pieces = [*LETTERS, "▁w", *made_up]
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, **{p: 4 + i for i, p in enumerate(pieces)}}
    # one merge per word, onto the word one digit shorter, so that "w123" is one piece
    merges = [("▁", "w"), *((w[:-1], w[-1]) for w in made_up)]
    tokenizer = transformers.NllbTokenizer(vocab=vocab, merges=merges, extra_special_tokens=codes,
                                           src_lang=codes[0], tgt_lang=codes[1])
    config = transformers.M2M100Config(
        vocab_size=s["vocab"], d_model=s["d_model"], encoder_layers=s["layers"], decoder_layers=s["layers"],
        encoder_attention_heads=s["heads"], decoder_attention_heads=s["heads"], encoder_ffn_dim=s["d_ff"],
        decoder_ffn_dim=s["d_ff"], max_position_embeddings=1024, scale_embedding=True, dropout=0.0,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    torch.manual_seed(0)
    model = transformers.M2M100ForConditionalGeneration(config).eval()
    with torch.no_grad():
        # no symbol may end an output early: random weights would end some sentences at once
        model.model.shared.weight[2].zero_()
    tokenizer.save_pretrained(directory)
    model.save_pretrained(directory)
    assert len(tokenizer) <= s["vocab"], (len(tokenizer), s["vocab"])
    return {"parameters": sum(p.numel() for p in model.parameters())}


def _build_t5(shape: str, directory: Path) -> dict[str, Any]:
    """A T5 shape (t5-small's, flan-t5-small's) with random weights, and a unigram tokenizer
    of made-up words (T5's is a sentencepiece unigram model) with T5's 100 sentinels."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    s = SHAPES[shape]
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), *((p, -10.0) for p in LETTERS),
              *((f"▁w{i}", -1.0) for i in range(words(shape)))]
    unigram = Tokenizer(models.Unigram(pieces, unk_id=2))
    unigram.pre_tokenizer = pre_tokenizers.Metaspace()
    unigram.decoder = decoders.Metaspace()
    tokenizer = transformers.T5TokenizerFast(tokenizer_object=unigram, eos_token="</s>", unk_token="<unk>",
                                             pad_token="<pad>", extra_ids=100)
    config = transformers.T5Config(
        vocab_size=s["vocab"], d_model=s["d_model"], d_ff=s["d_ff"],
        d_kv=s.get("head_dim", s["d_model"] // s["heads"]), num_layers=s["layers"],
        num_decoder_layers=s["layers"], num_heads=s["heads"], dropout_rate=0.0,
        feed_forward_proj="gated-gelu" if s.get("gated") else "relu", tie_word_embeddings=not s.get("gated"),
        pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0)
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config).eval()
    tokenizer.save_pretrained(directory)
    model.save_pretrained(directory)
    assert len(tokenizer) <= s["vocab"], (len(tokenizer), s["vocab"])
    return {"parameters": sum(p.numel() for p in model.parameters())}


def _build_bart(shape: str, directory: Path) -> dict[str, Any]:
    """A BART shape with random weights and a byte-level BPE tokenizer (BART's kind) whose
    made-up words after a space (``Ġw0`` ...) are one piece each. ``<s>`` is written
    first, as bart-base forces it (:func:`forced`)."""
    import torch
    import transformers
    from tokenizers import pre_tokenizers

    s = SHAPES[shape]
    space = [("Ġ" + w) for w in ("w", *(f"w{i}" for i in range(words(shape))))]
    letters = ["Ġ", *LETTERS[1:]]
    pieces = [*letters, *space]
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, **{p: 4 + i for i, p in enumerate(pieces)}}
    vocab["<mask>"] = len(vocab)
    # one merge per word, onto the word one digit shorter, so that "Ġw123" is one piece
    merges = [("Ġ", "w"), *((w[:-1], w[-1]) for w in space[1:])]
    tokenizer = transformers.BartTokenizer(vocab=vocab, merges=merges)
    # GPT-2's pattern would split a word's letter from its digits before the merges
    backend = tokenizer.backend_tokenizer
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    config = transformers.BartConfig(
        vocab_size=s["vocab"], d_model=s["d_model"], encoder_layers=s["layers"], decoder_layers=s["layers"],
        encoder_attention_heads=s["heads"], decoder_attention_heads=s["heads"], encoder_ffn_dim=s["d_ff"],
        decoder_ffn_dim=s["d_ff"], max_position_embeddings=1024, activation_function="gelu", dropout=0.0,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    # CTranslate2's converter reads BART's post-norm from this field, which transformers 5 leaves out
    config.normalize_before = False
    torch.manual_seed(0)
    model = transformers.BartForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.model.shared.weight[2].zero_()  # as NLLB's: no early end
    tokenizer.save_pretrained(directory)
    model.save_pretrained(directory)
    assert len(tokenizer) <= s["vocab"], (len(tokenizer), s["vocab"])
    return {"parameters": sum(p.numel() for p in model.parameters())}


def convert(source: Path, out: Path) -> dict[str, Any]:
    """``seqtrans import hf`` in this process: seconds and peak memory."""
    from seqtrans.inference import formats

    start = time.perf_counter()
    formats.load("hf").import_model(source, out=out)
    return {"seconds": time.perf_counter() - start, "peak_mib": process_peak_mib()}


def sources(count: int, length: int, pieces: int) -> list[str]:
    return [" ".join(f"w{(i * 7919 + j * 104729) % pieces}" for j in range(length)) for i in range(count)]


def decode_seqtrans(run: Path, texts: list[str], *, precision: str, batch: int, tokens: int,
                    languages: bool, shortlist: bool = False) -> dict[str, Any]:
    from seqtrans.inference.loading import load

    loaded = load(run, device="cpu", overrides=[f"decode.precision={precision}",
                                                f"decode.shortlist={str(shortlist).lower()}"])
    settings = _settings(precision, tokens, languages=languages, shortlist=shortlist)
    loaded.decode(texts[:1], decode=settings)  # warm: the decoding copy, the kernels
    start = time.perf_counter()
    outputs: list[list[int]] = []
    for i in range(0, len(texts), batch):
        _, hyps = loaded.decode(texts[i:i + batch], decode=settings)
        outputs += [list(h[0].tokens) for h in hyps]
    return {"tokens": sum(map(len, outputs)), "seconds": time.perf_counter() - start,
            "peak_mib": process_peak_mib(), "outputs": outputs}


def _settings(precision: str, tokens: int, *, languages: bool, shortlist: bool = False) -> Any:
    from seqtrans.config import DecodeConfig

    return DecodeConfig(beam=4, max_len_a=0.0, max_len_b=tokens, min_len=tokens, precision=precision,
                        batch_tokens=10**7, target_lang=LANGUAGES[1] if languages else None,
                        source_lang=LANGUAGES[0] if languages else None, shortlist=shortlist)


def build_shortlist(run: Path, texts: list[str], *, tokens: int, top: int, frequent: int) -> dict[str, Any]:
    """A shortlist of Marian's usual size for ``run`` (``top`` candidates per source token,
    ``frequent`` tokens always allowed) that holds the model's unrestricted int8 outputs of
    ``texts``: random weights have no translation table to count, so each source token's
    candidates are the output tokens of the sentences it is in, then random target tokens
    up to ``top``. Written to the run directory; the unrestricted outputs are returned."""
    import numpy as np

    from seqtrans.inference.loading import load
    from seqtrans.shortlist import table

    loaded = load(run, device="cpu", overrides=["decode.precision=int8"])
    _, hyps = loaded.decode(texts, decode=_settings("int8", tokens, languages=True))
    outputs = [list(h[0].tokens) for h in hyps]
    vocabs = loaded.codec.vocabularies
    rng = np.random.default_rng(0)
    candidates = np.full((len(vocabs.source), top), -1, dtype=np.int32)
    seen: dict[int, list[int]] = {}
    for text, out in zip(texts, outputs):
        for s in vocabs.source.encode(loaded.codec.source_tokens(text)):
            seen.setdefault(s, []).extend(t for t in out if t not in seen.get(s, []))
    for s, own in seen.items():
        fill = rng.choice(len(vocabs.target), top, replace=False).tolist()
        row = list(dict.fromkeys(own + fill))[:top]
        candidates[s, : len(row)] = row
    always = rng.choice(len(vocabs.target), frequent, replace=False).astype(np.int32)
    shortlist = table.Shortlist(candidates, always, len(vocabs.target), loaded.vocabulary_digest,
                                table.ShortlistSettings(top=top, frequent=frequent))
    shortlist.save(run / table.FILE)
    ids = [vocabs.source.encode(loaded.codec.source_tokens(t)) for t in texts]
    sizes = shortlist.allowed(ids).sum(axis=1)
    # greedy too: the shortlist holds its outputs, so they must stay the same (at beam 4 the
    # scores are renormalised over each hypothesis's list, which can reorder a beam whose
    # random-weight candidates are nearly tied)
    greedy = dataclasses.replace(_settings("int8", tokens, languages=True), beam=1)
    _, plain = loaded.decode(texts, decode=greedy)
    listed = load(run, device="cpu", overrides=["decode.precision=int8", "decode.shortlist=true"])
    _, restricted = listed.decode(texts, decode=dataclasses.replace(greedy, shortlist=True))
    same = sum(a[0].tokens == b[0].tokens for a, b in zip(plain, restricted))
    return {"outputs": outputs, "allowed_per_sentence": [int(n) for n in sizes], "greedy_equal_outputs": same}


def forced(shape: str) -> str | None:
    """The token a shape's model writes first, forced (seqtrans forces it by itself;
    CTranslate2 is given it as a prefix): NLLB's target language code, BART's ``<s>``."""
    return LANGUAGES[1] if multilingual(shape) else "<s>" if bart(shape) else None


def decode_ct2(model: Path, hf: Path, texts: list[str], *, batch: int, tokens: int,
               shape: str) -> dict[str, Any]:
    import ctranslate2
    import transformers

    first = forced(shape)
    if bart(shape):
        # transformers makes BART's pre-tokenizer anew, with GPT-2's pattern, which the
        # benchmark's tokenizer.json leaves out (_build_bart); seqtrans reads that file
        from tokenizers import Tokenizer

        inputs = [Tokenizer.from_file(str(hf / "tokenizer.json")).encode(t).tokens for t in texts]
    else:
        language = {"src_lang": LANGUAGES[0]} if multilingual(shape) else {}
        tokenizer = transformers.AutoTokenizer.from_pretrained(hf, **language)
        inputs = [tokenizer.convert_ids_to_tokens(tokenizer(t)["input_ids"]) for t in texts]
    translator = ctranslate2.Translator(str(model), device="cpu", intra_threads=int(os.environ["THREADS"]))
    # the forced first token is a prefix CTranslate2 counts in the output's length
    length = tokens + 1 if first else tokens
    options = {"beam_size": 4, "max_decoding_length": length, "min_decoding_length": length}

    def prefix(n: int) -> list[list[str]] | None:
        return [[first]] * n if first else None

    translator.translate_batch(inputs[:1], target_prefix=prefix(1), **options)
    start = time.perf_counter()
    produced = 0
    for i in range(0, len(inputs), batch):
        chunk = inputs[i:i + batch]
        out = translator.translate_batch(chunk, target_prefix=prefix(len(chunk)), **options)
        # its hypotheses hold the prefix it was given, which it did not write: seqtrans's leave it out
        produced += sum(len(r.hypotheses[0]) - (1 if first else 0) for r in out)
    return {"tokens": produced, "seconds": time.perf_counter() - start, "peak_mib": process_peak_mib()}


def _child(args: list[str], *, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One phase in a process of its own, with this process's environment or ``env``."""
    out = subprocess.run([sys.executable, "-m", "benchmarks", "pretrained_families", *args], cwd=ROOT,
                         check=True, capture_output=True, text=True, env=env)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _phase(args: argparse.Namespace) -> dict[str, Any]:
    phase, *paths = args.phase
    if phase == "build":
        return build(args.shape, Path(paths[0]))
    if phase == "import":
        return convert(Path(paths[0]), Path(paths[1]))
    texts = sources(args.sentences, args.source_tokens, words(args.shape))
    batch = int(paths[-1])
    if batch == 1 and phase != "shortlist" and args.single:
        texts = texts[:args.single]  # a large model's sentences one at a time: a few are enough
    if phase == "shortlist":
        return build_shortlist(Path(paths[0]), texts, tokens=args.tokens, top=50, frequent=100)
    if phase == "seqtrans":
        return decode_seqtrans(Path(paths[0]), texts, precision=paths[1], batch=batch, tokens=args.tokens,
                               languages=multilingual(args.shape), shortlist=paths[2] == "shortlist")
    return decode_ct2(Path(paths[0]), Path(paths[1]), texts, batch=batch, tokens=args.tokens,
                      shape=args.shape)


def _ct2_convert(hf: Path, out: Path, quantization: str) -> float:
    start = time.perf_counter()
    subprocess.run(["ct2-transformers-converter", "--model", str(hf), "--output_dir", str(out),
                    "--quantization", quantization], check=True, capture_output=True)
    return time.perf_counter() - start


def _case(args: argparse.Namespace, base: Path, common: list[str], threads: str, precision: str,
          batch: int) -> dict[str, Any]:
    """One case's systems, each at each OpenMP wait policy, measured in turn ``--repeats``
    times so that a slow spell of a shared machine falls on all of them: each one's median
    speed; seqtrans's ratio at the policy its command sets (``PASSIVE``) and at its better
    one, each against CTranslate2 at its better one; and, repeated, each round's own ratio
    of the bests (``ratios``)."""
    ct2 = str(base / f"ct2-{'float32' if precision == 'fp32' else 'int8'}")
    systems = {f"{name}_{policy}": (phase, policy) for name, phase in
               (("seqtrans", ["seqtrans", str(base / "run"), precision, "full"]),
                ("ct2", ["ct2", ct2, str(base / "hf")])) for policy in POLICIES}
    speeds: dict[str, list[float]] = {key: [] for key in systems}
    peaks: dict[str, float] = {}
    tokens: dict[str, int] = {}
    for _ in range(args.repeats):
        for key, (phase, policy) in systems.items():
            got = _child([*common, "--phase", *phase, str(batch)],
                         env={**policy_environment(policy, threads), "THREADS": threads})
            speeds[key].append(got["tokens"] / got["seconds"])
            peaks[key] = max(peaks.get(key, 0.0), got["peak_mib"])  # the highest of its rounds
            tokens[key] = got["tokens"]
    if len(set(tokens.values())) != 1:  # the speeds compare the same work only if every system wrote as much
        raise RuntimeError(f"the systems wrote different numbers of tokens: {tokens}")
    row: dict[str, Any] = {"precision": precision, "batch": batch, "beam": 4,
                           "tokens": tokens["seqtrans_passive"]}
    for key in systems:
        row[f"{key}_tok_s"] = statistics.median(speeds[key])
        row[f"{key}_peak_mib"] = peaks[key]
    for name in ("seqtrans", "ct2"):
        row[f"{name}_best_policy"] = max(POLICIES, key=lambda p: row[f"{name}_{p}_tok_s"])
    ours, theirs = (f"{name}_{row[f'{name}_best_policy']}" for name in ("seqtrans", "ct2"))
    # the names earlier results used: seqtrans at its command's policy
    row["seqtrans_tok_s"], row["seqtrans_peak_mib"] = row["seqtrans_passive_tok_s"], peaks["seqtrans_passive"]
    row["ratio_vs_ct2_best"] = row["seqtrans_tok_s"] / row[f"{theirs}_tok_s"]
    row["best_ratio_vs_ct2_best"] = row[f"{ours}_tok_s"] / row[f"{theirs}_tok_s"]
    row["memory_ratio_vs_ct2_best"] = row["seqtrans_peak_mib"] / peaks[theirs]
    if args.repeats > 1:
        row["runs"] = speeds
        row["ratios"] = [max(speeds[f"seqtrans_{p}"][i] for p in POLICIES)
                         / max(speeds[f"ct2_{p}"][i] for p in POLICIES) for i in range(args.repeats)]
    return row


def _cases(args: argparse.Namespace, base: Path, common: list[str], threads: str) -> list[dict[str, Any]]:
    rows = []
    for precision in ("fp32", "int8"):
        for batch in (1, args.batch):
            rows.append(_case(args, base, common, threads, precision, batch))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _shortlist_cases(args: argparse.Namespace, base: Path, common: list[str], threads: str,
                     rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """seqtrans int8 with a shortlist that holds its outputs, against CTranslate2 int8
    without one (the rows already measured), and whether the outputs stayed the same."""
    made = _child([*common, "--phase", "shortlist", str(base / "run"), "0"],
                  env=policy_environment("passive", threads))
    out = []
    for batch in (1, args.batch):
        ours = _child([*common, "--phase", "seqtrans", str(base / "run"), "int8", "shortlist", str(batch)],
                      env=policy_environment("passive", threads))
        plain = next(r for r in rows if r["precision"] == "int8" and r["batch"] == batch)
        ct2 = plain[f"ct2_{plain['ct2_best_policy']}_tok_s"]
        row = {"precision": "int8", "batch": batch, "beam": 4, "shortlist": True,
               "allowed_per_sentence": made["allowed_per_sentence"],
               "seqtrans_tok_s": ours["tokens"] / ours["seconds"], "seqtrans_peak_mib": ours["peak_mib"],
               "ct2_int8_without_shortlist_tok_s": ct2, "ct2_best_policy": plain["ct2_best_policy"],
               "seqtrans_without_shortlist_tok_s": plain["seqtrans_tok_s"],
               "equal_outputs": sum(a == b for a, b in zip(ours["outputs"], made["outputs"])),
               "greedy_equal_outputs": made["greedy_equal_outputs"], "sentences": len(ours["outputs"])}
        row["ratio_vs_ct2_int8_without_shortlist"] = row["seqtrans_tok_s"] / ct2
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="nllb-small")
    parser.add_argument("--sentences", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8, help="The larger batch (sentences decoded together).")
    parser.add_argument("--single", type=int, default=0,
                        help="Decode only the first N sentences one at a time (default: all of them).")
    parser.add_argument("--source-tokens", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=24, help="Output tokens per sentence.")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=1,
                        help="Measure each case's systems in turn this many times and take the medians.")
    parser.add_argument("--phase", nargs="+", help=argparse.SUPPRESS)  # one step, in a process of its own
    args = parser.parse_args(argv)
    if args.phase:
        print(json.dumps(_phase(args)))
        return
    common = ["--shape", args.shape, "--sentences", str(args.sentences), "--source-tokens",
              str(args.source_tokens), "--tokens", str(args.tokens), "--single", str(args.single)]
    with tempfile.TemporaryDirectory(prefix="families-bench-") as scratch:
        base = Path(scratch)
        built = _child([*common, "--phase", "build", str(base / "hf")])
        weights_mib = (base / "hf" / "model.safetensors").stat().st_size / 2**20
        imported = _child([*common, "--phase", "import", str(base / "hf"), str(base / "run")])
        ct2_seconds = {q: _ct2_convert(base / "hf", base / f"ct2-{q}", q) for q in ("float32", "int8")}
        print(json.dumps({"built": built, "weights_mib": weights_mib, "import": imported,
                          "ct2_convert_s": ct2_seconds}), flush=True)
        rows = _cases(args, base, common, str(args.threads))
        # NLLB's 256,206-word output layer is what a shortlist is for
        shortlisted = (_shortlist_cases(args, base, common, str(args.threads), rows)
                       if multilingual(args.shape) else [])
    tag = "amd" if "AMD" in cpu_info()["model"] else "intel" if "Intel" in cpu_info()["model"] else "cpu"
    write_results(RESULTS / f"pretrained_families-{args.shape}-{tag}.json", {
        "shape": {"name": args.shape, **SHAPES[args.shape], "parameters": built["parameters"]},
        "weights_mib": weights_mib,
        "import": {**imported, "memory_over_weights": imported["peak_mib"] / weights_mib},
        "ct2_convert_s": ct2_seconds, "threads": args.threads,
        "rows": rows, "shortlist_rows": shortlisted})
