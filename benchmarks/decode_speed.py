"""Decoding speed: seqtrans against Hugging Face ``MarianMTModel.generate`` and CTranslate2.

The models have the same shape (layers, d_model, heads, d_ff, shared vocabulary) and
random weights, decode the same source batch, and produce exactly ``--out-len`` tokens
per output (minimum = maximum length), so they do the same work. Each system is built
and decodes once (its warm-up); then the systems decode in turn, ``--repeats`` rounds,
and each one's median counts, so that a machine whose speed drifts during the run slows
them alike. Prints target tokens per second of each and the ratios, each system's model
FLOP/s as a fraction of the machine's fp32 (and bf16) matrix-multiply peak, and each
system's peak memory while it builds (or loads) its model and decodes once
(``*_peak_mib``: the peak resident set over the process's memory before, on a CPU;
torch's peak of allocated memory on CUDA, where CTranslate2's own is not seen) and what
it still holds after (``*_held_mib``); writes JSON under benchmarks/results/.
``--precision`` also times seqtrans in other ``decode.precision`` settings (int8 on CPU).

CTranslate2 decodes the seqtrans model itself, exported by ``seqtrans.inference.export`` (so the
weights are the same), with ``intra_threads`` = torch's threads, in each compute type of
:data:`CT2_COMPUTE_TYPES` for the device; the ratio printed is seqtrans (fp32) over it. On a
CPU it is timed at its best setting: under each OpenMP wait policy of ``--ct2-policies``
(libgomp's default, ``ACTIVE`` and ``PASSIVE``), each in a fresh process at every round
(CTranslate2's own OpenMP runtime reads the policy when it loads), and the fastest counts
(``ct2_TYPE_tok_s``, with ``ct2_TYPE_best_policy`` and every policy's own speed). seqtrans
runs in this process under the policy its environment gives (recorded; ``ACTIVE`` is
refused there, since its idle threads would spin beside CTranslate2's processes).

``--background-load N`` runs N CPU-burning processes beside every system for the whole run
(started after the machine's peak and bandwidth are measured, killed when it ends), as on
a shared machine; the JSON records N. At batch 1, where every step reads every decoder
weight once, each row also reports the weight bandwidth each system achieves (fp32 and
int8 bytes per step times steps per second) against the fastest read of memory measured
in the same run. The process keeps freed memory as the ``seqtrans`` command does
(``SEQTRANS_MALLOC=system`` for glibc's own policy; the JSON records which).

    python -m benchmarks decode_speed                 # all cases, CPU or CUDA
    python -m benchmarks decode_speed --cases base-beam4-b32 --repeats 5
    python -m benchmarks decode_speed --no-peer --precision fp32,int8,bf16
    python -m benchmarks decode_speed --ct2-policies here   # CTranslate2 in this process, as before
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    ROOT,
    arguments,
    background_load,
    device_name,
    gemm_peak,
    memory_bandwidth,
    peak_memory,
    pick_device,
    policy_environment,
    read_bandwidth,
    synchronize,
    timed_in_turn,
    write_json,
)
from seqtrans.config import ModelConfig
from seqtrans.data.vocab import BOS, EOS, PAD, Vocab, Vocabularies
from seqtrans.decoding import beam_search, greedy_search
from seqtrans.decoding.generate import decoding_model
from seqtrans.errors import UsageError
from seqtrans.inference.export import export_ctranslate2
from seqtrans.linear.quantize import int8_only
from seqtrans.model.transformer import Transformer
from seqtrans.runtime import environment
from seqtrans.runtime.system import keep_freed_memory
from seqtrans.runtime.threads import WAIT_POLICIES, parse_wait_policy

SHAPES = {
    "base": {"layers": 6, "d_model": 512, "d_ff": 2048, "heads": 8, "vocab": 37000},
    "parsing": {"layers": 4, "d_model": 1024, "d_ff": 4096, "heads": 16, "vocab": 16000},
    # the translation task's `cpu` preset with its Multi30k vocabulary: a distilled student's
    # size, where a step's fixed costs outweigh its products
    "small": {"layers": 3, "d_model": 256, "d_ff": 1024, "heads": 4, "vocab": 8000},
}


@dataclass(frozen=True)
class Case:
    shape: str
    beam: int
    batch: int

    @property
    def name(self) -> str:
        mode = "greedy" if self.beam == 1 else f"beam{self.beam}"
        return f"{self.shape}-{mode}-b{self.batch}"


CASES = [Case("base", 1, 1), Case("base", 1, 32), Case("base", 4, 1), Case("base", 4, 32),
         Case("parsing", 21, 1), Case("parsing", 21, 32), Case("small", 4, 1), Case("small", 4, 32)]


def sources(batch: int, vocab: int, *, seed: int = 0, lengths: tuple[int, int] = (15, 30)) -> torch.Tensor:
    """Random source sentences of random lengths, each ending in EOS, padded.  -> [B, S]"""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lengths[0], lengths[1] + 1, (batch,), generator=g)
    src = torch.full((batch, int(lens.max()) + 1), PAD, dtype=torch.long)
    for i, n in enumerate(lens.tolist()):
        src[i, :n] = torch.randint(4, vocab, (n,), generator=g)
        src[i, n] = EOS
    return src


def seqtrans_model(shape: dict[str, int], device: torch.device, *, dropout: float = 0.0) -> Transformer:
    """``dropout``: residual and attention dropout (it acts in training mode only)."""
    torch.manual_seed(0)
    config = ModelConfig(encoder_layers=shape["layers"], decoder_layers=shape["layers"],
                         d_model=shape["d_model"], d_ff=shape["d_ff"], heads=shape["heads"], dropout=dropout,
                         attention_dropout=dropout)
    model = Transformer(config, source_vocab_size=shape["vocab"], target_vocab_size=shape["vocab"],
                        shared_vocab=True)
    return model.to(device).eval()


def marian_model(shape: dict[str, int], device: torch.device, *, dropout: float = 0.0) -> Any:
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=shape["vocab"], d_model=shape["d_model"], encoder_layers=shape["layers"],
        decoder_layers=shape["layers"], encoder_attention_heads=shape["heads"],
        decoder_attention_heads=shape["heads"], encoder_ffn_dim=shape["d_ff"],
        decoder_ffn_dim=shape["d_ff"], activation_function="relu", dropout=dropout, attention_dropout=dropout,
        activation_dropout=0.0, max_position_embeddings=1024, scale_embedding=True,
        pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=BOS, forced_eos_token_id=None,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
    )
    return MarianMTModel(config).to(device).eval()


# CTranslate2's compute types timed on each device (int8 on CUDA: int8 matrices, fp16 elsewhere)
CT2_COMPUTE_TYPES = {"cpu": ("float32", "int8"), "cuda": ("float32", "float16", "int8_float16")}


class CTranslate2Models:
    """The seqtrans benchmark model of each shape, exported once to CTranslate2 (float32
    weights; CTranslate2 converts them to the compute type when it loads them)."""

    def __init__(self, shapes: Mapping[str, dict[str, int]] = SHAPES) -> None:
        self._scratch = tempfile.TemporaryDirectory(prefix="decode-speed-ct2-")
        self._paths: dict[str, Path] = {}
        self._shapes = shapes

    def path(self, shape: str) -> Path:
        if shape not in self._paths:
            vocab = Vocab(f"w{i}" for i in range(self._shapes[shape]["vocab"] - 4))
            model = seqtrans_model(self._shapes[shape], torch.device("cpu"))
            self._paths[shape] = export_ctranslate2(model, Vocabularies(vocab, vocab),
                                                    Path(self._scratch.name) / shape)
        return self._paths[shape]


def ct2_decoder(case: Case, device: torch.device, src: torch.Tensor, out_len: int, *, path: Path,
                compute_type: str) -> Callable[[], None]:
    """Decoding of ``src`` by CTranslate2, exactly ``out_len`` tokens each."""
    import ctranslate2

    translator = ctranslate2.Translator(str(path), device=device.type, compute_type=compute_type,
                                        inter_threads=1, intra_threads=torch.get_num_threads())
    # the exported vocabulary names id i "w{i-4}"; CTranslate2 appends the source's EOS itself
    batch = [[f"w{i - 4}" for i in row if i not in (PAD, EOS)] for row in src.tolist()]

    def decode() -> None:
        out = translator.translate_batch(batch, beam_size=case.beam, length_penalty=0.6,
                                         max_decoding_length=out_len, min_decoding_length=out_len)
        assert all(len(r.hypotheses[0]) == out_len for r in out)

    return decode


class CTranslate2Process:
    """CTranslate2's decoding of ``src`` under one OpenMP wait ``policy``, in a process of its
    own at each call (:mod:`benchmarks._ct2_child`): CTranslate2's bundled OpenMP runtime
    reads the policy once, when it loads. A call returns the seconds of the process's timed
    decode, after its warm-up (its start and loading do not count); ``peak_mib`` and
    ``held_mib`` are the most that any call's process peaked at and held, ``reported`` what
    the last one printed."""

    def __init__(self, case: Case, src: torch.Tensor, out_len: int, *, path: Path, compute_type: str,
                 policy: str) -> None:
        self._name = f"{case.name}, {compute_type}, {policy}"
        self._spec = json.dumps({
            "model": str(path), "compute_type": compute_type, "threads": torch.get_num_threads(),
            "beam": case.beam, "length_penalty": 0.6, "out_len": out_len,
            "batch": [[f"w{i - 4}" for i in row if i not in (PAD, EOS)] for row in src.tolist()]})
        self._env = policy_environment(policy)
        self.peak_mib = self.held_mib = 0.0
        self.reported: dict[str, Any] = {}

    def __call__(self) -> float:
        done = subprocess.run([sys.executable, "-m", "benchmarks._ct2_child"], input=self._spec, cwd=ROOT,
                              env=self._env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"CTranslate2's process ({self._name}) failed:\n{done.stderr}")
        got = self.reported = json.loads(done.stdout.strip().splitlines()[-1])
        self.peak_mib = max(self.peak_mib, got["peak_mib"])
        self.held_mib = max(self.held_mib, got["held_mib"])
        return float(got["seconds"])


def best_policy(row: dict[str, Any], key: str, policies: Sequence[str],
                processes: Mapping[str, CTranslate2Process]) -> None:
    """``row``'s speeds of ``key`` (a CTranslate2 compute type's) under each of ``policies``
    summed up: ``KEY_best_policy``, and as ``KEY_tok_s`` and its memory, the best."""
    best = max(policies, key=lambda p: row[f"{key}_{p}_tok_s"])
    row[f"{key}_best_policy"] = best
    row[f"{key}_tok_s"] = row[f"{key}_{best}_tok_s"]
    row[f"{key}_peak_mib"] = processes[f"{key}_{best}"].peak_mib
    row[f"{key}_held_mib"] = processes[f"{key}_{best}"].held_mib


def model_flops(shape: dict[str, int], src: torch.Tensor, beam: int, out_len: int) -> float:
    """Matrix-multiply FLOPs of encoding the batch and decoding ``out_len`` tokens per hypothesis."""
    d, f, v, n_layers = shape["d_model"], shape["d_ff"], shape["vocab"], shape["layers"]
    lengths = src.ne(PAD).sum(dim=1).float()
    tokens = float(lengths.sum())
    encoder = tokens * n_layers * 2 * (4 * d * d + 2 * d * f) + n_layers * 4 * d * float((lengths**2).sum())
    cross_kv = tokens * n_layers * 2 * 2 * d * d
    rows = src.size(0) * beam
    per_row_step = n_layers * 2 * (6 * d * d + 2 * d * f) + 2 * d * v
    steps = rows * out_len * per_row_step
    attention = sum(rows * n_layers * 4 * d * (t + 1) for t in range(out_len))
    attention += beam * n_layers * 4 * d * out_len * tokens  # cross-attention scores and sums
    return encoder + cross_kv + steps + attention


def seqtrans_decoder(case: Case, device: torch.device, src: torch.Tensor,
                     out_len: int, *, precision: str = "fp32",
                     shapes: Mapping[str, dict[str, int]] = SHAPES) -> Callable[[], None]:
    """Decoding of ``src`` by a fresh seqtrans model, exactly ``out_len`` tokens each, in a
    ``decode.precision`` setting, with the model ``generate`` decodes with for it (in int8
    the int8-only model a run loads as, or on a CPU the fp32 copy with oneDNN's products;
    made once, outside the timing)."""
    model = seqtrans_model(shapes[case.shape], device)
    if precision == "int8":  # as decode.precision=int8 loads a run: the int8 weights only
        model = int8_only(model, in_place=True)
    model = decoding_model(model, precision, device)
    max_len = torch.full((src.size(0),), out_len)

    def decode() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            search()

    def search() -> None:
        if case.beam == 1:
            out = greedy_search(model, src, max_len=max_len, min_len=out_len)
        else:
            out = beam_search(model, src, beam=case.beam, alpha=0.6, max_len=max_len, min_len=out_len)
        assert all(len(h[0].tokens) == out_len for h in out)

    return decode


HALF_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def hf_decoder(case: Case, hf: Any, src: torch.Tensor, out_len: int) -> Callable[[], None]:
    """Decoding of ``src`` by the peer's ``generate``, exactly ``out_len`` tokens each."""
    mask = src.ne(PAD).long()

    def theirs() -> None:
        with torch.no_grad():
            out = hf.generate(input_ids=src, attention_mask=mask, num_beams=case.beam,
                              max_new_tokens=out_len, min_new_tokens=out_len, length_penalty=0.6,
                              do_sample=False, num_return_sequences=1)
        assert out.size(1) == out_len + 1  # the start symbol and out_len tokens

    return theirs


def step_weight_bytes(shape: dict[str, int], *, precision: str = "fp32") -> int:
    """Bytes of the weights every decoding step reads: the decoder's layers (the
    cross-attention keys and values are computed once per source) and the output
    projection; in fp32, 4 bytes a weight; in int8, 1, and per output row a float32
    scale and an int32 compensation (biases and LayerNorms, small, left out of both)."""
    d, f, v, n_layers = shape["d_model"], shape["d_ff"], shape["vocab"], shape["layers"]
    weights = n_layers * (6 * d * d + 2 * d * f) + v * d
    if precision == "int8":
        rows = n_layers * (6 * d + f + d) + v  # the output rows of those matrices
        return weights + 8 * rows
    return 4 * weights


#: The systems whose weight bandwidth a batch-1 row reports: (row key prefix, weight precision).
WEIGHT_READERS = (("seqtrans", "fp32"), ("seqtrans_int8", "int8"), ("ct2_float32", "fp32"),
                  ("ct2_int8", "int8"))


def weight_bandwidth(row: dict[str, Any], shape: dict[str, int], *, bandwidth: float) -> None:
    """At batch 1 (one output token per step), add to ``row`` the bytes of weights a step
    reads in fp32 and int8, the tokens/s that reading them at ``bandwidth`` allows, and for
    each system timed the bandwidth it achieves (``*_weight_gb_s``) and its fraction of
    ``bandwidth`` (``*_of_bandwidth``)."""
    if row["batch"] != 1:
        return
    step = {p: step_weight_bytes(shape, precision=p) for p in ("fp32", "int8")}
    row["step_weight_bytes"] = step
    row["bandwidth_bound_tok_s"] = {p: bandwidth / n for p, n in step.items()}
    for key, precision in WEIGHT_READERS:
        tok_s = row.get(f"{key}_tok_s")
        if tok_s is not None:
            achieved = tok_s * step[precision]  # bytes per second: a step per token at batch 1
            row[f"{key}_weight_gb_s"] = achieved / 1e9
            row[f"{key}_of_bandwidth"] = achieved / bandwidth


def bound_seconds(shape: dict[str, int], flops: float, out_len: int, *, peak: float,
                  bandwidth: float) -> float:
    """The roofline: no decoder is faster than the machine's matmul peak on its FLOPs, nor
    than reading the step's weights from memory at every one of the ``out_len`` steps."""
    return max(flops / peak, out_len * step_weight_bytes(shape) / bandwidth)


def run_case(case: Case, device: torch.device, *, out_len: int, repeats: int, peer: bool,
             bf16: bool, peak32: float, bandwidth: float,
             ct2: CTranslate2Models | None = None, precisions: tuple[str, ...] = (),
             shapes: Mapping[str, dict[str, int]] = SHAPES, ct2_types: Sequence[str] | None = None,
             peer_dtypes: Sequence[str] = (), read_bound: float | None = None,
             ct2_policies: Sequence[str] = ()) -> dict[str, Any]:
    """One case's row. ``ct2_types``: CTranslate2's compute types (default
    :data:`CT2_COMPUTE_TYPES` of the device); ``peer_dtypes``: the peer's weights also
    timed in these of fp16 and bf16 (``hf_DTYPE_tok_s``), beside its fp32; ``read_bound``:
    the memory bandwidth batch-1 rows compare weight reads with (default ``bandwidth``);
    ``ct2_policies``: OpenMP wait policies to time CTranslate2 under on a CPU, each in
    processes of its own (``ct2_TYPE_POLICY_tok_s``; ``ct2_TYPE_tok_s`` is then the best of
    them), instead of in this process under its policy."""
    shape = shapes[case.shape]
    src = sources(case.batch, shape["vocab"]).to(device)
    flops = model_flops(shape, src, case.beam, out_len)
    out_tokens = case.batch * out_len

    row: dict[str, Any] = {"case": case.name, "batch": case.batch, "beam": case.beam, "out_len": out_len,
                           "model_gflop": round(flops / 1e9, 2)}
    row["bound_tok_s"] = out_tokens / bound_seconds(shape, flops, out_len, peak=peak32,
                                                    bandwidth=bandwidth)

    decoders: dict[str, Callable[[], None]] = {}

    def build(key: str, make: Callable[[], Callable[[], None]], *, torch_memory: bool = True) -> None:
        """The decoder ``make()`` builds, decoding once (its warm-up), kept for the timed
        rounds. Its peak memory over building and that decode, the model's weights
        included, as ``row[key + "_peak_mib"]``, and what it holds then (the model and what
        decoding keeps) as ``row[key + "_held_mib"]``; on CUDA only for ``torch_memory``."""
        with peak_memory(device) as memory:
            decode = make()
            decode()
            synchronize(device)
        if "mib" in memory and (torch_memory or device.type != "cuda"):
            row[f"{key}_peak_mib"] = memory["mib"]
            row[f"{key}_held_mib"] = memory["end_mib"]
        decoders[key] = decode

    build("seqtrans", lambda: seqtrans_decoder(case, device, src, out_len, shapes=shapes))
    for precision in ("bf16", *precisions) if bf16 else precisions:  # beyond fp32
        build(f"seqtrans_{precision}", partial(
            seqtrans_decoder, case, device, src, out_len, precision=precision, shapes=shapes))
    if peer:
        build("hf", lambda: hf_decoder(case, marian_model(shape, device), src, out_len))

        def peer_in(dtype: torch.dtype) -> Callable[[], None]:
            return hf_decoder(case, marian_model(shape, device).to(dtype), src, out_len)

        for dtype in peer_dtypes:
            build(f"hf_{dtype}", partial(peer_in, HALF_DTYPES[dtype]))
    compute_types = list(ct2_types or CT2_COMPUTE_TYPES[device.type]) if ct2 is not None else []
    processes: dict[str, CTranslate2Process] = {}
    for compute_type in compute_types:
        assert ct2 is not None
        if ct2_policies:
            for policy in ct2_policies:
                processes[f"ct2_{compute_type}_{policy}"] = CTranslate2Process(
                    case, src, out_len, path=ct2.path(case.shape), compute_type=compute_type, policy=policy)
            continue
        build(f"ct2_{compute_type}", partial(ct2_decoder, case, device, src, out_len,
                                             path=ct2.path(case.shape), compute_type=compute_type),
              torch_memory=False)
    seconds = timed_in_turn({**decoders, **processes}, device, repeats=repeats)
    for key, value in seconds.items():
        row[f"{key}_tok_s"] = out_tokens / value
    for compute_type in compute_types if ct2_policies else ():
        best_policy(row, f"ct2_{compute_type}", ct2_policies, processes)

    row["seqtrans_of_bound"] = row["seqtrans_tok_s"] / row["bound_tok_s"]
    row["seqtrans_mfu_fp32"] = flops / seconds["seqtrans"] / peak32
    for precision in ("bf16", *precisions):
        if f"seqtrans_{precision}_tok_s" in row:
            row[f"seqtrans_{precision}_of_fp32"] = row[f"seqtrans_{precision}_tok_s"] / row["seqtrans_tok_s"]
    if peer:
        row["hf_mfu_fp32"] = flops / seconds["hf"] / peak32
        row["hf_of_bound"] = row["hf_tok_s"] / row["bound_tok_s"]
        row["ratio"] = row["seqtrans_tok_s"] / row["hf_tok_s"]
        if bf16:
            row["bf16_ratio_vs_hf_fp32"] = row["seqtrans_bf16_tok_s"] / row["hf_tok_s"]
    for compute_type in compute_types:
        row[f"ratio_vs_ct2_{compute_type}"] = row["seqtrans_tok_s"] / row[f"ct2_{compute_type}_tok_s"]
        if bf16:
            row[f"bf16_ratio_vs_ct2_{compute_type}"] = (row["seqtrans_bf16_tok_s"]
                                                        / row[f"ct2_{compute_type}_tok_s"])
    if "seqtrans_int8_tok_s" in row and "ct2_int8_tok_s" in row:
        row["int8_ratio_vs_ct2_int8"] = row["seqtrans_int8_tok_s"] / row["ct2_int8_tok_s"]
    weight_bandwidth(row, shape, bandwidth=read_bound or bandwidth)
    return row


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--cases", nargs="+", default=[c.name for c in CASES],
                        help=f"Some of: {', '.join(c.name for c in CASES)}.")
    parser.add_argument("--out-len", type=int, default=32, help="Target tokens per output.")
    parser.add_argument("--repeats", type=int, default=3, help="Timed runs per system (median).")
    parser.add_argument("--no-peer", action="store_true", help="Skip Hugging Face (seqtrans alone).")
    parser.add_argument("--no-ct2", action="store_true",
                        help="Skip CTranslate2 (skipped anyway when ctranslate2 is not installed).")
    parser.add_argument("--bf16", choices=["auto", "yes", "no"], default="auto",
                        help="Also time seqtrans under bf16 autocast: yes, no, or auto (when the "
                        "machine's bf16 matmul peak is above its fp32 peak).")
    parser.add_argument("--precision", default="fp32",
                        help="Comma-separated decode.precision settings to time seqtrans in, of "
                        "fp32, bf16, int8 (int8: CPU only). fp32 is always timed (the columns "
                        "above); bf16 here is --bf16 yes.")
    parser.add_argument("--label", default="",
                        help="Write benchmarks/results/decode_speed-LABEL-DEVICE.json instead of "
                        "decode_speed-DEVICE.json (to keep a run on another machine or with other cases).")
    parser.add_argument("--background-load", type=int, default=0, metavar="N",
                        help="Run N CPU-burning processes beside every system for the whole run (default "
                        "0); the results go to decode_speed-loadN-DEVICE.json unless --label says.")
    parser.add_argument("--ct2-policies", default=",".join(WAIT_POLICIES), metavar="POLICIES",
                        help="On a CPU, time CTranslate2 under each of these OpenMP wait policies (comma-"
                        "separated: default, active, passive or a spin count), each in processes of its "
                        "own, and compare with the best (default: all three); 'here' times it in this "
                        "process instead, under this process's policy.")
    args = parser.parse_args(argv)
    try:
        ct2_policies = ct2_policies_of(args.ct2_policies)
    except UsageError as e:
        parser.error(f"--ct2-policies: {e}")
    if args.background_load < 0:
        parser.error(f"--background-load: 0 or more processes, got {args.background_load}")
    chosen = [p for p in args.precision.split(",") if p]
    unknown = sorted(set(chosen) - {"fp32", "bf16", "int8"})
    if unknown:
        parser.error(f"--precision: unknown {', '.join(unknown)} (fp32, bf16, int8)")
    precisions = tuple(p for p in dict.fromkeys(chosen) if p not in ("fp32", "bf16"))
    device = pick_device(args.device)
    if device.type != "cpu":
        ct2_policies = ()  # OpenMP's waiting is the CPU's
    if ct2_policies and os.environ.get("OMP_WAIT_POLICY", "").upper() == "ACTIVE":
        parser.error("OMP_WAIT_POLICY=ACTIVE: this process's idle threads would spin beside the processes "
                     "that time CTranslate2 (--ct2-policies here times it in this process)")
    torch.set_grad_enabled(False)
    # as the seqtrans command does (SEQTRANS_MALLOC=system: glibc's own policy); the peers in
    # this process get it too, and CTranslate2 has an allocator of its own
    kept = environment.malloc() == "keep" and keep_freed_memory()
    peak32 = gemm_peak(device, torch.float32)
    peak16 = gemm_peak(device, torch.bfloat16)
    bf16 = args.bf16 == "yes" or (args.bf16 == "auto" and peak16 > peak32) or "bf16" in chosen
    bandwidth = memory_bandwidth(device)
    read = read_bandwidth(device)
    read_bound = max(bandwidth, read)  # the fastest read of memory measured: what weights can stream at
    print(f"device: {device_name(device)}; memory read bandwidth {bandwidth / 1e9:.1f} GB/s "
          f"(matrix-vector product), {read / 1e9:.1f} GB/s (sum)")
    print(f"matmul peak: fp32 {peak32 / 1e12:.3f} TFLOP/s, bf16 {peak16 / 1e12:.3f} TFLOP/s"
          + ("" if bf16 else " (bf16 runs skipped: no faster than fp32 here; --bf16 yes forces them)"))
    by_name = {c.name: c for c in CASES}
    ct2 = None
    if not args.no_ct2:
        try:
            import ctranslate2
        except ImportError:
            print("CTranslate2 runs skipped: pip install ctranslate2 (the bench extra)")
        else:
            ct2 = CTranslate2Models()
            print(f"CTranslate2 {ctranslate2.__version__}: compute types "
                  f"{', '.join(CT2_COMPUTE_TYPES[device.type])}, {torch.get_num_threads()} threads, "
                  + (f"wait policies {', '.join(ct2_policies)}, each in processes of its own" if ct2_policies
                     else "in this process"))
    rows = []
    print(f"{'case':<22}{'seqtrans tok/s':>15}{'HF tok/s':>11}{'ratio':>8}{'MFU ours':>10}"
          f"{'MFU HF':>8}{'bound tok/s':>13}{'ours/bound':>12}")
    with background_load(args.background_load) as burners:
        if burners:
            print(f"{len(burners)} CPU-burning processes running beside every system", flush=True)
        for name in args.cases:
            row = run_case(by_name[name], device, out_len=args.out_len, repeats=args.repeats,
                           peer=not args.no_peer, bf16=bf16, peak32=peak32, bandwidth=bandwidth, ct2=ct2,
                           precisions=precisions, read_bound=read_bound, ct2_policies=ct2_policies)
            rows.append(row)
            print_row(row, precisions, ct2_types=CT2_COMPUTE_TYPES[device.type] if ct2 is not None else (),
                      ct2_policies=ct2_policies)
    ct2_types = list(CT2_COMPUTE_TYPES[device.type]) if ct2 is not None else []
    label = args.label or (f"load{args.background_load}" if args.background_load else "")
    name = "decode_speed" + (f"-{label}" if label else "")
    path = write_json(name, {"gemm_peak_fp32_flops": peak32, "gemm_peak_bf16_flops": peak16,
                             "bf16_timed": bf16, "memory_bandwidth": bandwidth,
                             "memory_read_bandwidth": read, "weight_bandwidth_bound": read_bound,
                             "background_load": args.background_load, "freed_memory_kept": kept,
                             "ct2_compute_types": ct2_types,
                             "ct2_intra_threads": torch.get_num_threads(), "timing": "in turn",
                             "ct2_wait_policies": list(ct2_policies) or "this process's",
                             "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                             "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
                             "rows": rows}, device)
    print(f"wrote {path}")


def ct2_policies_of(text: str) -> tuple[str, ...]:
    """``--ct2-policies``: the wait policies, or none for 'here'."""
    if text.strip().lower() == "here":
        return ()
    given = [p for p in text.split(",") if p.strip()]
    policies = tuple(dict.fromkeys(parse_wait_policy(p, name="a policy") for p in given))
    if not policies:
        raise UsageError("no policy given (give 'here' to time CTranslate2 in this process)")
    return policies


def print_row(row: dict[str, Any], precisions: Sequence[str], *, ct2_types: Sequence[str],
              ct2_policies: Sequence[str] = ()) -> None:
    """One case's line of the table, and its CTranslate2 (under each of ``ct2_policies``, where
    it was timed under them), memory and batch-1 bandwidth lines."""
    print(f"{row['case']:<22}{row['seqtrans_tok_s']:>15.1f}{row.get('hf_tok_s', float('nan')):>11.1f}"
          f"{row.get('ratio', float('nan')):>8.2f}{row['seqtrans_mfu_fp32']:>10.1%}"
          f"{row.get('hf_mfu_fp32', float('nan')):>8.1%}{row['bound_tok_s']:>13.1f}"
          f"{row['seqtrans_of_bound']:>12.1%}"
          + "".join(f"   {p} {row[f'seqtrans_{p}_tok_s']:.1f} tok/s ({row[f'seqtrans_{p}_of_fp32']:.2f}x)"
                    for p in ("bf16", *precisions) if f"seqtrans_{p}_tok_s" in row),
          flush=True)
    if ct2_types:
        print(f"{'':<22}CTranslate2: " + ", ".join(
            f"{t} {row[f'ct2_{t}_tok_s']:.1f} tok/s (ratio {row[f'ratio_vs_ct2_{t}']:.2f})"
            + (f" with {row[f'ct2_{t}_best_policy']}" if f"ct2_{t}_best_policy" in row else "")
            for t in ct2_types), flush=True)
        if ct2_policies:
            print(f"{'':<22}CTranslate2 by wait policy, tok/s: " + ", ".join(
                f"{t} {p} {row[f'ct2_{t}_{p}_tok_s']:.1f}" for t in ct2_types for p in ct2_policies),
                flush=True)
    held = [k.removesuffix("_peak_mib") for k in row if k.endswith("_peak_mib")]
    if held:
        print(f"{'':<22}memory, MiB, peak / held after: " + ", ".join(
            f"{k} {row[f'{k}_peak_mib']:,.0f} / {row[f'{k}_held_mib']:,.0f}" for k in held), flush=True)
    read = [k for k, _ in WEIGHT_READERS if f"{k}_weight_gb_s" in row]
    if read:
        print(f"{'':<22}weights read, GB/s (of the bound): " + ", ".join(
            f"{k} {row[f'{k}_weight_gb_s']:.1f} ({row[f'{k}_of_bandwidth']:.0%})" for k in read), flush=True)
