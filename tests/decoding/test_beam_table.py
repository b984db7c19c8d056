"""Beam search against hand-written probability tables (no neural model): the exact
hypotheses a beam of a given width keeps, finishes and returns."""

from __future__ import annotations

import math

import pytest
import torch

from seqtrans.data.vocab import BOS, EOS
from seqtrans.decoding import beam_search, greedy_search

A, B = 4, 5
V = 6  # <pad> <s> </s> <unk> a b


class TableModel:
    """P(next | prefix) from a dict; prefixes not listed end with certainty."""

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]]) -> None:
        self.table = table

    def eval(self) -> TableModel:
        return self

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        return src

    def start(self, encoded: torch.Tensor, *, beam: int, capacity: int) -> TableState:
        return TableState(torch.zeros(encoded.size(0) * beam, 0, dtype=torch.long))

    def decode(self, tokens: torch.Tensor, encoded: object = None, *, state: TableState) -> torch.Tensor:
        state.history = torch.cat([state.history, tokens], dim=1)
        logits = torch.full((tokens.size(0), 1, V), -1e9)
        for i, row in enumerate(state.history.tolist()):
            probs = self.table.get(tuple(t for t in row if t != BOS), {EOS: 1.0})
            for tok, p in probs.items():
                logits[i, 0, tok] = math.log(p)
        return logits


class TableState:
    def __init__(self, history: torch.Tensor) -> None:
        self.history = history

    def reorder(self, rows: torch.Tensor, sentences: torch.Tensor | None = None) -> None:
        self.history = self.history[rows]


TABLE = {
    (): {EOS: 0.4, A: 0.35, B: 0.25},
    (A,): {EOS: 0.5, A: 0.5},
    (B,): {EOS: 0.99, A: 0.01},
    (A, A): {EOS: 0.6, B: 0.4},
}
SRC = torch.tensor([[A, EOS]])


def search(beam: int, nbest: int, alpha: float = 0.0, max_len: int = 5) -> list[tuple[list[int], float]]:
    hyps = beam_search(TableModel(TABLE), SRC, beam=beam, alpha=alpha,  # type: ignore[arg-type]
                       max_len=torch.tensor([max_len]), nbest=nbest)[0]
    return [(h.tokens, h.log_prob) for h in hyps]


def test_an_ending_candidate_does_not_take_a_live_slot() -> None:
    # step 1: </s> (0.4) ends; a (0.35) and b (0.25) both stay live in a beam of 2
    out = search(beam=2, nbest=2)
    assert [t for t, _ in out] == [[], [B]]
    assert out[1][1] == pytest.approx(math.log(0.25 * 0.99))


def test_a_beam_of_one_keeps_only_the_best_continuation() -> None:
    out = search(beam=1, nbest=1)
    assert out == [([], pytest.approx(math.log(0.4)))]
    # with a strong length penalty the longest path wins: a a b </s>, scored
    # ln(0.35 * 0.5 * 0.4 * 1.0) / ((5 + 4) / 6)^3 = -0.788, ahead of a a </s> (-0.951)
    hyps = beam_search(TableModel(TABLE), SRC, beam=1, alpha=3.0,  # type: ignore[arg-type]
                       max_len=torch.tensor([5]))[0]
    assert hyps[0].tokens == [A, A, B]
    assert hyps[0].score == pytest.approx(math.log(0.35 * 0.5 * 0.4) / ((5 + 4) / 6) ** 3.0)


def test_n_best_lists_finished_hypotheses_best_first() -> None:
    out = search(beam=3, nbest=3)
    expected = sorted([([], 0.4), ([A], 0.35 * 0.5), ([B], 0.25 * 0.99), ([A, A], 0.35 * 0.5 * 0.6)],
                      key=lambda x: -x[1])[:3]
    assert [t for t, _ in out] == [t for t, _ in expected]
    assert [lp for _, lp in out] == pytest.approx([math.log(p) for _, p in expected])


def test_the_maximum_length_forces_the_end() -> None:
    out = search(beam=2, nbest=2, alpha=5.0, max_len=1)
    assert all(len(t) <= 1 for t, _ in out)
    assert [t for t, _ in out] == [[B], [A]]  # alpha 5 favours length; b</s> is the likelier of length 1


def test_greedy_takes_the_argmax_at_every_step() -> None:
    table = {(): {A: 0.6, EOS: 0.4}, (A,): {A: 0.51, EOS: 0.49}, (A, A): {EOS: 1.0}}
    hyp = greedy_search(TableModel(table), SRC, max_len=torch.tensor([5]))[0][0]  # type: ignore[arg-type]
    assert hyp.tokens == [A, A] and hyp.log_prob == pytest.approx(math.log(0.6 * 0.51))


def test_end_in_beam_ends_a_hypothesis_only_within_the_beam() -> None:
    # step 1 ranks a (0.5), b (0.45), </s> (0.05): the ending is third, outside a beam of 2
    table = {(): {A: 0.5, B: 0.45, EOS: 0.05}, (A,): {A: 0.99, EOS: 0.01}, (B,): {B: 0.99, EOS: 0.01}}
    model = TableModel(table)
    anywhere = beam_search(model, SRC, beam=2, alpha=0.0, max_len=torch.tensor([1]))[0]  # type: ignore[arg-type]
    within = beam_search(model, SRC, beam=2, alpha=0.0, max_len=torch.tensor([1]),  # type: ignore[arg-type]
                         end_in_beam=True)[0]
    assert anywhere[0].tokens == [] and anywhere[0].log_prob == pytest.approx(math.log(0.05))
    assert within[0].tokens == [A] and within[0].log_prob == pytest.approx(math.log(0.5 * 0.01))


def test_the_power_length_penalty_divides_by_the_length_to_the_alpha() -> None:
    # ln(0.35 * 0.5 * 0.4) / 4 = -0.665 beats b </s> (ln(0.25 * 0.99) / 2 = -0.698) and a a </s> (-0.751)
    hyps = beam_search(TableModel(TABLE), SRC, beam=3, alpha=1.0,  # type: ignore[arg-type]
                       max_len=torch.tensor([5]), length_penalty="power")[0]
    assert hyps[0].tokens == [A, A, B]
    assert hyps[0].score == pytest.approx(math.log(0.35 * 0.5 * 0.4) / 4)


class CountingTable(TableModel):
    """A table model that remembers how many hypotheses each step decoded."""

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]]) -> None:
        super().__init__(table)
        self.rows: list[int] = []

    def decode(self, tokens: torch.Tensor, encoded: object = None, *, state: TableState) -> torch.Tensor:
        self.rows.append(tokens.size(0))
        return super().decode(tokens, encoded, state=state)


@pytest.mark.parametrize("beam", [1, 2])
def test_a_cancelled_source_leaves_the_batch_after_the_step_and_the_others_decode_as_alone(beam: int) -> None:
    long = {tuple([A] * n): {A: 0.9, EOS: 0.1} for n in range(5)}  # A until the maximum length
    model = CountingTable(long)
    src = torch.tensor([[A, EOS], [B, EOS]])
    search_of = beam_search if beam > 1 else greedy_search
    options = {"beam": beam, "alpha": 0.0, "nbest": beam} if beam > 1 else {}
    out = search_of(model, src, max_len=torch.tensor([5, 5]),  # type: ignore[operator]
                    cancelled=lambda b: b == 0 and len(model.rows) >= 2, **options)
    assert model.rows[:2] == [2 * beam, 2 * beam]  # cancelled during the second step: it leaves after it
    assert len(model.rows) > 3 and set(model.rows[2:]) == {beam}  # the other goes on alone
    alone = search_of(TableModel(long), src[1:], max_len=torch.tensor([5]), **options)  # type: ignore[operator]
    assert out[1] == alone[0] and alone[0]
    if beam == 1:
        assert out[0] == []  # unfinished when cancelled: no output
