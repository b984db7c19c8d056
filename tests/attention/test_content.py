"""Luong's dot, general and location scores and Bahdanau's additive score: one head is
the paper's formula, computed here directly."""

from __future__ import annotations

import pytest
import torch

from seqtrans.attention.additive import AdditiveScore
from seqtrans.attention.content import ContentCrossAttention, ContentSelfAttention
from seqtrans.attention.luong import DotScore, GeneralScore, LocationScore


def score_by_hand(score: torch.nn.Module, h_t: torch.Tensor, h_s: torch.Tensor, s: int) -> float:
    """The paper's score of target state h_t against source position s (one head)."""
    if isinstance(score, DotScore):
        return float(h_t @ h_s)
    if isinstance(score, GeneralScore):
        return float(h_t @ score.w.weight @ h_s)
    if isinstance(score, LocationScore):
        return float((score.w.weight @ h_t)[s])
    assert isinstance(score, AdditiveScore)  # v^T tanh(W s + U h + b)
    return float(score.v[0] @ torch.tanh(score.query.weight @ h_t + score.key.weight @ h_s + score.key.bias))


SCORES = {
    "dot": lambda: DotScore(6, 1),
    "general": lambda: GeneralScore(6, 1),
    "location": lambda: LocationScore(6, 1, max_length=8),
    "additive": lambda: AdditiveScore(6, 1),
}


@pytest.mark.parametrize("name", SCORES)
def test_one_head_computes_the_papers_attention(name: str) -> None:
    torch.manual_seed(0)
    attn = ContentCrossAttention(SCORES[name](), 6)  # type: ignore[no-untyped-call]
    memory = torch.randn(2, 5, 6)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    x = torch.randn(2, 2, 6)
    with torch.no_grad():
        got = attn(x, attn.prepare(memory, mask))
        for n in range(2):
            length = int(mask[n].sum())
            for i in range(2):
                scores = torch.tensor([score_by_hand(attn.score, x[n, i], memory[n, s], s)  # type: ignore[arg-type]
                                       for s in range(length)])
                context = scores.softmax(0) @ memory[n, :length]
                torch.testing.assert_close(got[n, i], attn.out(context), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", SCORES)
def test_heads_split_the_query_and_keys(name: str) -> None:
    torch.manual_seed(1)
    score = {"dot": DotScore(8, 2), "general": GeneralScore(8, 2), "additive": AdditiveScore(8, 2),
             "location": LocationScore(8, 2, max_length=6)}[name]
    attn = ContentSelfAttention(score, 8)
    x = torch.randn(1, 4, 8)
    with torch.no_grad():
        scores = score.scores(x, score.keys(x))  # [1, 2, 4, 4]
    assert scores.shape == (1, 2, 4, 4)
    if name == "dot":  # head h compares the h-th halves
        torch.testing.assert_close(scores[0, 1], x[0, :, 4:] @ x[0, :, 4:].T)
    with torch.no_grad():
        assert attn(x, causal=True).shape == (1, 4, 8)


def test_location_refuses_positions_beyond_its_table() -> None:
    attn = ContentCrossAttention(LocationScore(4, 1, max_length=3), 4)
    with pytest.raises(ValueError, match="model.location_max_length=3"):
        attn(torch.randn(1, 1, 4), attn.prepare(torch.randn(1, 4, 4), torch.ones(1, 4, dtype=torch.bool)))
