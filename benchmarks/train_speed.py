"""Training speed: seqtrans against Hugging Face ``MarianMTModel`` on the same batch.

One training step = forward, label-smoothed loss, backward and an Adam step, on a
model of the same shape with random weights and the same batch. Prints target tokens
per second of both, the ratio, model FLOP/s as a fraction of the machine's matmul
peak, and the peak memory of a step (on CPU: the growth of the resident set's high
water mark; on CUDA: the allocator's peak); writes JSON under benchmarks/results/.

    python -m benchmarks train_speed --shape base --tokens 4096 [--dropout 0.1]
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.common import arguments, device_name, gemm_peak, peak_memory, pick_device, timed, write_json
from benchmarks.decode_speed import SHAPES, marian_model, seqtrans_model
from seqtrans.data.vocab import BOS, EOS, PAD
from seqtrans.training.loss import projected_label_smoothed_loss


def batch(tokens: int, vocab: int, *, seed: int = 0,
          length: tuple[int, int] = (20, 30)) -> dict[str, torch.Tensor]:
    """About ``tokens`` source and target tokens in sentences of similar length."""
    g = torch.Generator().manual_seed(seed)
    n = tokens // length[1]
    src_len = torch.randint(length[0], length[1] + 1, (n,), generator=g)
    tgt_len = torch.randint(length[0], length[1] + 1, (n,), generator=g)
    src = torch.full((n, int(src_len.max()) + 1), PAD, dtype=torch.long)
    tgt_in = torch.full((n, int(tgt_len.max()) + 1), PAD, dtype=torch.long)
    tgt_out = tgt_in.clone()
    for i in range(n):
        s, t = int(src_len[i]), int(tgt_len[i])
        src[i, :s] = torch.randint(4, vocab, (s,), generator=g)
        src[i, s] = EOS
        y = torch.randint(4, vocab, (t,), generator=g)
        tgt_in[i, 0] = BOS
        tgt_in[i, 1 : t + 1] = y
        tgt_out[i, :t] = y
        tgt_out[i, t] = EOS
    return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out}


def train_flops(shape: dict[str, int], b: dict[str, torch.Tensor]) -> float:
    """Matrix-multiply FLOPs of forward + backward (3x forward) for the batch."""
    d, f, v, n = shape["d_model"], shape["d_ff"], shape["vocab"], shape["layers"]
    s_tok = b["src"].numel()
    t_tok = b["tgt_in"].numel()
    s_len, t_len = b["src"].size(1), b["tgt_in"].size(1)
    rows = b["src"].size(0)
    enc = s_tok * n * 2 * (4 * d * d + 2 * d * f) + rows * n * 4 * d * s_len * s_len
    dec = t_tok * n * 2 * (8 * d * d + 2 * d * f) + s_tok * n * 2 * 2 * d * d
    dec += rows * n * 4 * d * (t_len * t_len + t_len * s_len) + t_tok * 2 * d * v
    return 3.0 * (enc + dec)


def measure(step: Any, device: torch.device, repeats: int) -> tuple[float, int]:
    step()  # allocate optimizer state before measuring memory
    with peak_memory(device) as peak:
        step()
    seconds = timed(step, device, repeats=repeats, warmup=1)
    return seconds, round(peak["mib"] * 2**20)


def seqtrans_step(shape: dict[str, int], device: torch.device, b: dict[str, torch.Tensor],
                  target_tokens: int, *, autocast: bool = False, dropout: float = 0.0,
                  compiled: bool | str = False) -> Callable[[], None]:
    """One training step exactly as the trainer takes it (fused projection and loss);
    ``compiled``: its forward pass and loss under ``torch.compile`` (a string: with that
    backend), the optimizer's step as it is."""
    model = seqtrans_model(shape, device, dropout=dropout).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9,
                           fused=device.type == "cuda" or None)  # as the trainer's

    def forward(src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            hidden = model.hidden(src, tgt_in)  # [B, T, D]
            loss, _ = projected_label_smoothed_loss(hidden, model.output_weight, tgt_out, smoothing=0.1)
        return loss

    if compiled:
        forward = torch.compile(forward, **({"backend": compiled} if isinstance(compiled, str) else {}))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = forward(b["src"], b["tgt_in"], b["tgt_out"])
        (loss / target_tokens).backward()
        opt.step()

    return step


def marian_step(shape: dict[str, int], device: torch.device, b: dict[str, torch.Tensor],
                target_tokens: int, *, dropout: float = 0.0) -> Callable[[], None]:
    """One training step of the peer, the usual way: logits, then smoothed cross-entropy."""
    hf = marian_model(shape, device, dropout=dropout).train()
    opt = torch.optim.Adam(hf.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    mask = b["src"].ne(PAD).long()
    dec_mask = b["tgt_in"].ne(PAD).long()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        logits = hf(input_ids=b["src"], attention_mask=mask, decoder_input_ids=b["tgt_in"],
                    decoder_attention_mask=dec_mask).logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), b["tgt_out"].view(-1),
                               ignore_index=PAD, label_smoothing=0.1, reduction="sum")
        (loss / target_tokens).backward()
        opt.step()

    return step


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--shape", default="base", choices=sorted(SHAPES))
    parser.add_argument("--tokens", type=int, default=4096, help="Source (and target) tokens per batch.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bf16", choices=["auto", "yes", "no"], default="auto",
                        help="Also time seqtrans under bf16 autocast: yes, no, or auto (when the "
                        "machine's bf16 matmul peak is above its fp32 peak).")
    parser.add_argument("--dropout", type=float, default=0.0,
                        help="Residual and attention dropout of both models (default 0: no random masks).")
    parser.add_argument("--no-peer", action="store_true")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    device = pick_device(args.device)
    shape = SHAPES[args.shape]
    peak32 = gemm_peak(device, torch.float32)
    peak16 = gemm_peak(device, torch.bfloat16)
    bf16 = args.bf16 == "yes" or (args.bf16 == "auto" and peak16 > peak32)
    b = {k: v.to(device) for k, v in batch(args.tokens, shape["vocab"]).items()}
    target_tokens = int(b["tgt_out"].ne(PAD).sum())
    flops = train_flops(shape, b)
    print(f"device: {device_name(device)}; matmul peak fp32 {peak32 / 1e12:.3f} TFLOP/s, "
          f"bf16 {peak16 / 1e12:.3f} TFLOP/s" + ("" if bf16 else " (bf16 run skipped: no faster than fp32)"))
    print(f"shape {args.shape}: batch of {b['src'].size(0)} sentences, {target_tokens} target tokens")
    result: dict[str, Any] = {"shape": args.shape, "dropout": args.dropout, "sentences": b["src"].size(0),
                              "target_tokens": target_tokens, "model_gflop": round(flops / 1e9, 1),
                              "gemm_peak_fp32_flops": peak32,
                              "gemm_peak_bf16_flops": peak16, "bf16_timed": bf16}

    seconds, memory = measure(seqtrans_step(shape, device, b, target_tokens, dropout=args.dropout), device,
                              args.repeats)
    result.update(seqtrans_tok_s=target_tokens / seconds, seqtrans_peak_bytes=memory,
                  seqtrans_mfu_fp32=flops / seconds / peak32)
    if bf16:
        step = seqtrans_step(shape, device, b, target_tokens, autocast=True, dropout=args.dropout)
        seconds, _ = measure(step, device, args.repeats)
        result["seqtrans_bf16_tok_s"] = target_tokens / seconds
    gc.collect()
    if not args.no_peer:
        seconds, memory = measure(marian_step(shape, device, b, target_tokens, dropout=args.dropout), device,
                                  args.repeats)
        result.update(hf_tok_s=target_tokens / seconds, hf_peak_bytes=memory,
                      hf_mfu_fp32=flops / seconds / peak32)
        result["ratio"] = result["seqtrans_tok_s"] / result["hf_tok_s"]
        result["memory_ratio"] = result["seqtrans_peak_bytes"] / max(result["hf_peak_bytes"], 1)

    for key in ("seqtrans_tok_s", "hf_tok_s", "ratio", "seqtrans_mfu_fp32", "hf_mfu_fp32",
                "seqtrans_peak_bytes", "hf_peak_bytes", "memory_ratio", "seqtrans_bf16_tok_s"):
        if key in result:
            value = result[key]
            shown = f"{value / 2**20:.0f} MiB" if key.endswith("bytes") else (
                f"{value:.1%}" if "mfu" in key else f"{value:.2f}")
            print(f"{key:>22}: {shown}")
    name = f"train_speed-{args.shape}" + (f"-dropout{args.dropout:g}" if args.dropout else "") \
        + (f"-{args.tokens}tok" if args.tokens != parser.get_default("tokens") else "")
    print(f"wrote {write_json(name, result, device)}")
