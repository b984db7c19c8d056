"""Beam search's candidates straight from the logits (:func:`seqtrans.decoding.search.fused_candidates`)
against the [N, V] scores they replace: per step, exactly the same candidates in the same order
with the same scores where both normalise with the same log-sum-exp, ties, -inf, forced and
banned tokens included; whole searches (n-best, length penalties, rules, prefixes) with the
same outputs and scores to float rounding."""

from __future__ import annotations

import random

import pytest
import torch

from conftest import require_native_kernels, tiny_model
from seqtrans import native
from seqtrans.data.batches import pad_batch
from seqtrans.data.vocab import BOS, EOS, PAD
from seqtrans.decoding import beam, beam_search
from seqtrans.decoding.generate import decoding_model
from seqtrans.decoding.search import ALL, NEG_INF, Exclusions, fused_candidates
from seqtrans.model import transformer

pytestmark = pytest.mark.usefixtures("no_grad", "built")


@pytest.fixture
def built() -> None:
    require_native_kernels()


def random_step(seed: int, *, b: int, k: int, v: int, t: int) -> dict:
    """A step's logits with ties and -inf, prefixes with empty slots, histories that repeat."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(b * k, v, generator=gen) * 3
    logits[:, 7:12] = logits[:, 2:7]  # ties within a row, one of them with the end symbol
    logits[1::k] = logits[0::k]  # ties between a sentence's rows
    logits[:, 5] = NEG_INF
    logits[0, 9] = NEG_INF
    prefix = -torch.rand(b * k, generator=gen) * 4
    prefix[1::k] = prefix[0::k]
    prefix[k - 1 :: k] = NEG_INF  # a slot with no hypothesis
    history = torch.randint(4, 9, (b * k, t), generator=gen)  # few tokens: n-grams repeat
    history[:, 0] = BOS
    return {"logits": logits, "prefix": prefix, "history": history}


def candidates_both_ways(step: dict, monkeypatch: pytest.MonkeyPatch, **rules: object) -> tuple[tuple, tuple]:
    """The candidates of one step by the fused kernel, and by the [N, V] scores normalised
    with the same log-sum-exp as the kernel's (torch's differs in the last bits)."""
    kernel = native.beam_candidates
    shifts = []

    def recording(*args: object, **kwargs: object) -> object:
        found = kernel(*args, **kwargs)  # type: ignore[arg-type]
        assert found is not None
        shifts.append(found[2])
        return found

    monkeypatch.setattr(native, "beam_candidates", recording)
    args = {"beam": 4, "prefix": step["prefix"], "constraint": None, "required": None, "columns": ALL,
            **rules}
    fused = beam._beam_candidates(step["logits"].clone(), step["history"], step["step"], **args)
    assert len(shifts) == 1

    def same_shift(logits: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
        most = logits.max(dim=1, keepdim=True).values
        return ((logits - most) - shifts[0].unsqueeze(1)) + prefix.unsqueeze(1)

    monkeypatch.setattr(beam, "extend", same_shift)
    monkeypatch.setattr(beam, "fused_candidates", lambda *a: None)
    scores = beam._beam_candidates(step["logits"].clone(), step["history"], step["step"], **args)
    return fused, scores


RULES = {
    "plain": {},
    "min_len": {"min_len": 9},
    "ngrams": {"no_repeat_ngram_size": 2},
    "unigrams": {"no_repeat_ngram_size": 1},
    "banned": {"banned": [[[4, 6], [7]], [[8]], [], [[5, 5, 7], [11]]]},
}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("rules", list(RULES.values()), ids=list(RULES))
@pytest.mark.parametrize("ending", ["free", "some_must_end", "all_must_end"])
@pytest.mark.parametrize("forcing", [False, True])
def test_fused_candidates_are_those_of_the_scores(seed: int, rules: dict, ending: str, forcing: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    b, k, v, t = 4, 4, 40, 5
    step = random_step(seed, b=b, k=k, v=v, t=t)
    step["step"] = t - 1
    limit = torch.full((b * k,), 20)
    if ending == "some_must_end":
        limit[: 2 * k + 1] = t - 1
    elif ending == "all_must_end":
        limit[:] = t - 1
    forced = None
    if forcing:  # free rows, a token, the end symbol, a token no rule allows
        forced = torch.tensor([PAD, 13, EOS, PAD, 7, 7, BOS, PAD, 9, 9, 9, 9, PAD, PAD, 5, 21])
    fused, scores = candidates_both_ways(step, monkeypatch, limit=limit, rules=beam.Rules(**rules),
                                         forced=forced, sources=torch.arange(b).repeat_interleave(k))
    for mine, theirs in zip(fused, scores):  # which end: None both ways where none does
        assert (mine is None and theirs is None) or (mine.dtype == theirs.dtype and torch.equal(mine, theirs))
    # no test of nothing: candidates remain, but where every row must end and none may yet
    assert bool(torch.isfinite(fused[0]).any()) == (ending != "all_must_end" or "min_len" not in rules)


def test_the_log_sum_exp_is_torchs_to_rounding() -> None:
    gen = torch.Generator().manual_seed(0)
    for v in (7, 1000, 50_000):
        logits = torch.randn(12, v, generator=gen) * 5
        logits[3, ::3] = NEG_INF
        found = native.beam_candidates(logits, torch.zeros(12), 4, never=torch.tensor([], dtype=torch.long))
        assert found is not None
        values, columns, shift = found
        expected = torch.log_softmax(logits.double(), dim=1)
        assert torch.allclose(values.double(), expected.gather(1, columns), rtol=0, atol=2e-6)
        reference = expected.topk(4, dim=1)
        assert torch.equal(columns, reference.indices)


def test_rows_whose_largest_logit_is_not_finite_take_the_long_way() -> None:
    logits = torch.randn(8, 30)
    never = torch.tensor([PAD, BOS])
    assert fused_candidates(logits, torch.zeros(8), 4, Exclusions(never)) is not None
    for bad in (float("nan"), float("inf")):
        broken = logits.clone()
        broken[5, 3] = bad
        assert fused_candidates(broken, torch.zeros(8), 4, Exclusions(never)) is None
    empty = logits.clone()
    empty[2] = NEG_INF
    assert fused_candidates(empty, torch.zeros(8), 4, Exclusions(never)) is None


def test_without_the_native_kernels_the_scores_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "available", lambda: False)
    assert fused_candidates(torch.randn(8, 30), torch.zeros(8), 4, Exclusions(torch.tensor([PAD]))) is None


SEARCHES = {
    "nbest-gnmt": {"nbest": 3, "alpha": 0.6},
    "power": {"nbest": 2, "alpha": 1.0, "length_penalty": "power", "end_in_beam": True},
    "rules": {"alpha": 0.6, "min_len": 3, "no_repeat_ngram_size": 2, "nbest": 2},
    "banned": {"alpha": 1.0, "banned": [[[5, 6]], [[7], [8, 9]], [], [[10]]]},
    "prefixes": {"alpha": 0.6, "prefixes": pad_batch([[7, 8], [], [9], [12, 12, 12]])},
}


@pytest.mark.parametrize("settings", list(SEARCHES.values()), ids=list(SEARCHES))
@pytest.mark.parametrize("seed", [0, 1])
def test_searches_find_the_same_outputs_either_way(settings: dict, seed: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model(vocab=40, seed=seed)
    rng = random.Random(seed)
    src = pad_batch([[rng.randrange(4, 40) for _ in range(n)] + [EOS] for n in (3, 7, 5, 2)])
    max_len = torch.tensor([4, 9, 6, 3])
    kernel = native.beam_candidates
    calls = []
    monkeypatch.setattr(native, "beam_candidates", lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
    fused = beam_search(model, src, beam=4, max_len=max_len, **settings)
    assert calls  # the fused path decided
    monkeypatch.setattr(beam, "fused_candidates", lambda *a, **kw: None)
    scores = beam_search(model, src, beam=4, max_len=max_len, **settings)
    for mine, theirs in zip(fused, scores):
        assert [h.tokens for h in mine] == [h.tokens for h in theirs]
        assert [h.log_prob for h in mine] == pytest.approx([h.log_prob for h in theirs], abs=1e-5)
        assert [h.score for h in mine] == pytest.approx([h.score for h in theirs], abs=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_logits_that_round_to_one_score_rank_by_column_as_the_scores_do(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nearly equal logits that a large prefix rounds to one score rank by column, the lower
    first, as the [N, V] scores rank them, not by logit (a ranking from a row's largest
    logits alone must notice the tie)."""
    b, k, v, t = 2, 4, 64, 3
    step = random_step(seed, b=b, k=k, v=v, t=t)
    gen = torch.Generator().manual_seed(seed)
    columns = torch.randperm(v - 12, generator=gen)[:12] + 12  # past the tokens the rules touch
    near = 20.0 - torch.arange(12) * 1e-5  # the largest, at random columns
    step["logits"][:, columns] = near
    step["logits"][1, columns[:5]] = 20.0 + torch.arange(5) * 0.5  # a row whose best are far apart
    step["prefix"][: 2 * k : 2] = -3000.0  # rounds the near logits to one score
    step["step"] = t - 1
    fused, scores = candidates_both_ways(step, monkeypatch, limit=torch.full((b * k,), 20),
                                         rules=beam.Rules(), forced=None, sources=None)
    for mine, theirs in zip(fused, scores):  # which end: None both ways where none does
        assert (mine is None and theirs is None) or torch.equal(mine, theirs)
    # row 0's near logits as one score: lowest columns first; without the prefix, largest first
    never = torch.tensor([], dtype=torch.long)
    for prefix, expected in ((-3000.0, sorted(columns.tolist())[:8]), (0.0, columns[:8].tolist())):
        row = step["logits"][:1].contiguous()
        found = native.beam_candidates(row, torch.tensor([prefix]), 8, never=never)
        assert found is not None and found[1][0].tolist() == expected


@pytest.mark.parametrize("settings", [SEARCHES["nbest-gnmt"], SEARCHES["prefixes"], SEARCHES["banned"]],
                         ids=["nbest-gnmt", "prefixes", "banned"])
def test_a_beams_first_step_scores_one_row_per_sentence_with_the_same_results(
        settings: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """At the first step a sentence's K rows hold one hypothesis: the output product runs on
    that row alone, whose logits are its own in any batch on the oneDNN decoding copy, so
    every output and score is the same bits as scoring all K rows."""
    model = decoding_model(tiny_model(vocab=40, seed=3), "fp32", torch.device("cpu"))
    src = pad_batch([[5, 6, 7, EOS], [8, 9, 10, 11, 12, EOS], [13, EOS], [14, 15, EOS]])
    max_len = torch.tensor([5, 7, 3, 4])
    projected: list[int] = []
    logits = transformer._logits
    monkeypatch.setattr(transformer, "_logits",
                        lambda model, hidden: projected.append(hidden.size(0)) or logits(model, hidden))
    first = beam_search(model, src, beam=4, max_len=max_len, **settings)
    assert projected[0] == 4 and projected[1] == 16  # one row per sentence, then the beam's
    monkeypatch.delattr(type(model), "decode_rows")  # the search scores every row, then takes these
    projected.clear()
    every = beam_search(model, src, beam=4, max_len=max_len, **settings)
    assert projected[0] == 16
    assert [[(h.tokens, h.log_prob, h.score) for h in n] for n in first] == \
        [[(h.tokens, h.log_prob, h.score) for h in n] for n in every]
