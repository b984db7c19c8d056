"""Luong's local attention, local-p and local-m, against a direct computation."""

from __future__ import annotations

import math

import pytest
import torch

from seqtrans.attention.local import LocalAttention


@pytest.mark.parametrize("alignment", ["predictive", "monotonic"])
def test_local_attention_by_hand(alignment: str) -> None:
    torch.manual_seed(0)
    window = 2
    attn = LocalAttention(6, 1, window=window, alignment=alignment)
    memory = torch.randn(2, 9, 6)
    lengths = [9, 6]
    mask = torch.arange(9)[None] < torch.tensor(lengths)[:, None]
    x = torch.randn(2, 7, 6)
    with torch.no_grad():
        state = attn.prepare(memory, mask)
        got = torch.cat([attn(x[:, :3], state), attn(x[:, 3:], state)], 1)  # t counts on across calls
        for n in range(2):
            S = lengths[n]
            for t in range(7):
                h = x[n, t]
                if alignment == "predictive":  # p_t = S * sigmoid(v_p^T tanh(W_p h_t))
                    p = S * torch.sigmoid(attn.v_p.weight[0] @ torch.tanh(attn.w_p.weight @ h)).item()
                else:
                    p = float(t)
                window_pos = [s for s in range(S) if abs(s - p) <= window]
                if not window_pos:
                    context = torch.zeros(6)
                else:
                    scores = torch.tensor([float(h @ attn.score.w.weight @ memory[n, s]) for s in window_pos])
                    align = scores.softmax(0)
                    if alignment == "predictive":
                        sigma = window / 2
                        align = align * torch.tensor([math.exp(-((s - p) ** 2) / (2 * sigma**2))
                                                      for s in window_pos])
                    context = align @ memory[n, window_pos]
                torch.testing.assert_close(got[n, t], attn.out(context), atol=1e-5, rtol=1e-5)
