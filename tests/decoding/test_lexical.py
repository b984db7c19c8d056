"""Positive lexical constraints (dynamic beam allocation) against brute force: the
progress on phrases against a count over plain lists, the bank shares against hand-made
cases, and beam search against every output of tiny models, alone and with banned
phrases, the task's constraint hook, ensembles, prefixes and batches."""

from __future__ import annotations

import logging
import random

import pytest
import torch
from test_search import BODY, VOCAB, brute_force

from conftest import tiny_model
from seqtrans.config import DecodeConfig
from seqtrans.data.batches import pad_batch
from seqtrans.data.vocab import EOS, UNK
from seqtrans.decoding import beam_search, lexical
from seqtrans.decoding.ensemble import Ensemble
from seqtrans.decoding.generate import generate
from seqtrans.decoding.lexical import advance, allocate, bank_sizes, met_tokens, phrase_set, required_problem

pytestmark = pytest.mark.usefixtures("no_grad")


def occurrences(y: list[int], phrase: list[int]) -> int:
    """Non-overlapping occurrences of ``phrase`` in ``y``, counted left to right."""
    count, i = 0, 0
    while i + len(phrase) <= len(y):
        if y[i : i + len(phrase)] == phrase:
            count, i = count + 1, i + len(phrase)
        else:
            i += 1
    return count


def meets(y: list[int], required: list[list[int]]) -> bool:
    """Whether ``y`` contains every phrase as many times as it is listed."""
    return all(occurrences(y, p) >= required.count(p) for p in required)


def test_progress_counts_occurrences_and_the_partial_phrase_as_plain_lists_do() -> None:
    rng = random.Random(3)
    for _ in range(300):
        required = [[rng.choice([4, 5]) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 3))]
        y = [rng.choice([4, 5, 6]) for _ in range(rng.randint(0, 9))]
        phrases = phrase_set(required)
        progress = tuple((0, 0) for _ in phrases)
        for token in y:
            progress = advance(phrases, progress, token)
        expected = 0
        for p in phrases:
            phrase, count = list(p.tokens), occurrences(y, list(p.tokens))
            if count >= p.times:
                expected += p.times * len(phrase)
                continue
            # the partial occurrence starts after the last counted one ends
            start, i = 0, 0
            while i + len(phrase) <= len(y):
                if y[i : i + len(phrase)] == phrase:
                    i = start = i + len(phrase)
                else:
                    i += 1
            tail = y[start:]
            partial = max(k for k in range(min(len(phrase), len(tail) + 1))
                          if tail[len(tail) - k :] == phrase[:k])
            expected += count * len(phrase) + partial
        assert met_tokens(phrases, progress) == expected, (required, y)
        assert all((c >= p.times) == (occurrences(y, list(p.tokens)) >= p.times)
                   for p, (c, _) in zip(phrases, progress))


def test_bank_sizes_share_the_beam_and_pass_on_what_a_bank_cannot_fill() -> None:
    assert bank_sizes([9, 9, 9], 6) == [2, 2, 2]
    assert bank_sizes([9, 9, 9], 7) == [2, 2, 3]  # the remainder to the most tokens met
    assert bank_sizes([9, 0, 1], 6) == [5, 0, 1]  # what banks 1 and 2 cannot fill goes to bank 0
    assert bank_sizes([1, 9, 9], 6) == [1, 2, 3]  # spare slots go to the highest bank first
    assert bank_sizes([1, 9, 0], 4) == [1, 3, 0]
    assert bank_sizes([0, 0, 5], 1) == [0, 0, 1]  # one slot: the most tokens met
    rng = random.Random(0)
    for _ in range(200):
        available = [rng.randint(0, 5) for _ in range(rng.randint(1, 5))]
        beam = rng.randint(1, 12)
        sizes = bank_sizes(available, beam)
        assert sum(sizes) == min(beam, sum(available))
        assert all(0 <= s <= a for s, a in zip(sizes, available))


def test_allocation_keeps_the_best_of_the_banks_with_progress_beside_better_free_candidates() -> None:
    # candidates best first: three with no required token met, then one with both met
    assert allocate([0, 0, 0, 2], [True] * 4, 2, 3) == [0, 3]  # top-2 alone would keep 0 and 1
    assert allocate([0, 0, 0, 2], [False, True, True, True], 2, 3) == [1, 3]  # an ending one goes elsewhere
    assert allocate([1, 0, 1, 0, 1], [True] * 5, 4, 2) == [0, 1, 2, 3]  # two slots each, best of each
    assert allocate([1, 1, 1, 0], [True] * 4, 4, 3) == [0, 1, 2, 3]  # bank 2 is empty: its slot passes on


# a token, a phrase, two phrases that overlap each other, a phrase given twice, a phrase
# that overlaps itself, a phrase of <unk>
REQUIRED = [[[5]], [[6, 4]], [[4, 5], [5]], [[4], [4]], [[6, 6]], [[UNK, 6]], [[6], [5, 4]]]


@pytest.mark.parametrize("required", REQUIRED, ids=str)
@pytest.mark.parametrize("seed", [0, 1])
def test_wide_beam_returns_the_best_outputs_that_contain_every_phrase(required: list[list[int]],
                                                                     seed: int) -> None:
    model = tiny_model(vocab=VOCAB, seed=seed)
    src = torch.tensor([[4, 5, 6, 4, EOS]])
    allowed = [(s, y) for s, y in brute_force(model, src, 3, 1.0) if meets(y, required)]
    hyps = beam_search(model, src, beam=VOCAB**3, alpha=1.0, max_len=torch.tensor([3]), nbest=3,
                       required=[required])[0]
    assert [h.tokens for h in hyps] == [y for _, y in allowed[:3]]
    assert [h.score for h in hyps] == pytest.approx([s for s, _ in allowed[:3]], abs=1e-4)


def test_the_constraints_change_the_best_output_of_the_models_above() -> None:
    # the test above is only worth something if the free best output lacks some phrases
    src = torch.tensor([[4, 5, 6, 4, EOS]])
    tops = [brute_force(tiny_model(vocab=VOCAB, seed=seed), src, 3, 1.0)[0][1] for seed in (0, 1)]
    assert sum(not meets(y, r) for y in tops for r in REQUIRED) >= len(REQUIRED)


@pytest.mark.parametrize("beam", [1, 2, 3, 5])
def test_every_output_contains_every_phrase_at_any_beam_that_holds_them(beam: int) -> None:
    rng = random.Random(beam)
    for trial in range(12):
        model = tiny_model(vocab=VOCAB, seed=trial)
        tokens = rng.randint(1, beam)
        required: list[list[int]] = []
        while (left := tokens - sum(map(len, required))) > 0:
            required.append([rng.choice(BODY) for _ in range(min(rng.randint(1, 2), left))])
        src = torch.tensor([[rng.choice([4, 5, 6]) for _ in range(4)] + [EOS]])
        hyps = beam_search(model, src, beam=beam, alpha=0.6, max_len=torch.tensor([6]), nbest=min(beam, 2),
                           required=[required])[0]
        assert hyps, (beam, required)
        assert all(meets(h.tokens, required) for h in hyps), (required, [h.tokens for h in hyps])


class EndMask:
    """The naive baseline as a task constraint: plain beam search that may not end an
    output before it holds every phrase."""

    def __init__(self, required: list[list[int]]) -> None:
        self.required = required

    def allowed(self, prefix: torch.Tensor, *, rows: torch.Tensor, remaining: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(prefix.size(0), VOCAB, dtype=torch.bool)
        done = [meets([t for t in y if t >= UNK], self.required) for y in prefix.tolist()]
        mask[:, EOS] = torch.tensor(done)
        return mask


def test_allocation_finds_constrained_outputs_that_end_masking_and_plain_top_k_miss(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # at the smallest beam that holds the phrases, against brute force: dynamic beam
    # allocation, end masking alone, and the same candidates kept by plain top-k
    def plain_top_k(banks: list[int], usable: list[bool], beam: int, num_banks: int) -> list[int]:
        return [c for c, ok in enumerate(usable) if ok][:beam]

    rng = random.Random(0)
    found = {"allocation": 0, "end masking": 0, "plain top-k": 0}
    optimal = dict.fromkeys(found, 0)
    for trial in range(40):
        model = tiny_model(vocab=VOCAB, seed=trial, d_model=32)
        required = [[rng.choice(BODY) for _ in range(rng.randint(1, 2))] for _ in range(2)]
        src = torch.tensor([[rng.choice([4, 5, 6]) for _ in range(4)] + [EOS]])
        best = next(y for _, y in brute_force(model, src, 5, 0.6) if meets(y, required))

        def best_met(**rule: object) -> tuple[float, list[int] | None]:
            hyps = beam_search(model, src, beam=sum(map(len, required)), alpha=0.6,  # noqa: B023
                               max_len=torch.tensor([5]), **rule)[0]  # type: ignore[arg-type]
            ok = [h for h in hyps if meets(h.tokens, required)]  # noqa: B023
            return (ok[0].score, ok[0].tokens) if ok else (float("-inf"), None)

        results = {"allocation": best_met(required=[required]),
                   "end masking": best_met(constraint=EndMask(required))}
        with monkeypatch.context() as patched:
            patched.setattr(lexical, "allocate", plain_top_k)
            results["plain top-k"] = best_met(required=[required])
        for name, (score, tokens) in results.items():
            found[name] += tokens is not None
            optimal[name] += tokens == best
            assert score <= results["allocation"][0] + 1e-5, (name, trial)
    assert found["allocation"] == 40 and optimal["allocation"] >= 10
    for name in ("end masking", "plain top-k"):
        assert found[name] <= 10 and 3 * optimal[name] <= optimal["allocation"], (found, optimal)


def test_each_source_keeps_its_own_phrases_in_a_batch() -> None:
    model = tiny_model(vocab=VOCAB, seed=1)
    sources = [[4, 5, 6, 4, EOS], [5, 5, EOS], [6, 4, EOS]]
    max_len = torch.tensor([5, 5, 5])
    required = [[[6, 6]], [], [[4], [UNK, 5]]]
    free = beam_search(model, pad_batch(sources), beam=4, alpha=1.0, max_len=max_len, nbest=2)
    together = beam_search(model, pad_batch(sources), beam=4, alpha=1.0, max_len=max_len, nbest=2,
                           required=required)
    for src, own, hyps in zip(sources, required, together):
        alone = beam_search(model, torch.tensor([src]), beam=4, alpha=1.0, max_len=torch.tensor([5]), nbest=2,
                            required=[own])[0]
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in alone], abs=1e-5)
        assert all(meets(h.tokens, own) for h in hyps)
    assert [h.tokens for h in together[1]] == [h.tokens for h in free[1]]  # no phrase: as without
    assert not meets(free[0][0].tokens, required[0]) and not meets(free[2][0].tokens, required[2])


def test_required_and_banned_phrases_and_the_task_constraint_hold_together() -> None:
    model = tiny_model(vocab=VOCAB, seed=0)
    src = torch.tensor([[4, 5, 6, 4, EOS]])
    required, banned = [[4], [6]], [[4, 6], [6, 4]]

    class NoFive:  # a task's rule: token 5 never comes first
        def allowed(self, prefix: torch.Tensor, *, rows: torch.Tensor,
                    remaining: torch.Tensor) -> torch.Tensor:
            mask = torch.ones(prefix.size(0), VOCAB, dtype=torch.bool)
            mask[:, 5] = prefix.size(1) > 0
            return mask

    def keeps(y: list[int]) -> bool:
        no_banned = not any(y[i : i + 2] in banned for i in range(len(y) - 1))
        return meets(y, required) and no_banned and y[:1] != [5]

    allowed = [(s, y) for s, y in brute_force(model, src, 3, 1.0) if keeps(y)]
    hyps = beam_search(model, src, beam=VOCAB**3, alpha=1.0, max_len=torch.tensor([3]), nbest=3,
                       required=[required], banned=[banned], constraint=NoFive())[0]
    assert [h.tokens for h in hyps] == [y for _, y in allowed[:3]]


def test_an_ensemble_with_phrases_is_exact_against_its_own_brute_force() -> None:
    ensemble = Ensemble([tiny_model(vocab=VOCAB, seed=0), tiny_model(vocab=VOCAB, seed=2)])
    src = torch.tensor([[4, 5, 6, 4, EOS]])
    required = [[5, 6], [UNK]]
    allowed = [(s, y) for s, y in brute_force(ensemble, src, 3, 0.6) if meets(y, required)]  # type: ignore[arg-type]
    hyps = beam_search(ensemble, src, beam=VOCAB**3, alpha=0.6, max_len=torch.tensor([3]), nbest=2,
                       required=[required])[0]
    assert [h.tokens for h in hyps] == [y for _, y in allowed[:2]]


def test_a_forced_prefix_counts_towards_the_phrases() -> None:
    model = tiny_model(vocab=VOCAB, seed=1)
    src = torch.tensor([[4, 5, 6, 4, EOS]])
    hyps = beam_search(model, src, beam=4, alpha=1.0, max_len=torch.tensor([4]), nbest=2,
                       prefixes=torch.tensor([[6, 5]]), required=[[[5, 4], [UNK]]])[0]
    assert hyps and all(h.tokens[:2] == [6, 5] and meets(h.tokens, [[5, 4], [UNK]]) for h in hyps)


def test_generate_takes_phrases_per_source_and_searches_them_at_beam_one() -> None:
    model = tiny_model(vocab=VOCAB, seed=1)
    sources = [[4, 5, 6, 4, EOS], [5, 5, EOS]]
    required = [[[6]], [[UNK]]]
    for beam in (1, 4):
        config = DecodeConfig(beam=beam, max_len_b=5, alpha=1.0)
        hyps = generate(model, sources, config, device=torch.device("cpu"), required=required)
        assert all(h and meets(h[0].tokens, own) for h, own in zip(hyps, required))
    with pytest.raises(ValueError, match="sampling"):
        generate(model, sources, DecodeConfig(sample=2), device=torch.device("cpu"), required=required)


def test_phrases_the_other_rules_rule_out_leave_the_input_without_output_and_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    model = tiny_model(vocab=VOCAB, seed=1)
    sources = [[4, 5, 6, 4, EOS], [5, 5, EOS]]
    with caplog.at_level(logging.WARNING):
        hyps = generate(model, sources, DecodeConfig(beam=4, max_len_b=5), device=torch.device("cpu"),
                        required=[[[5], [4, 6]], [[6]]], banned=[[[4, 6]], []])
    assert hyps[0] == [] and hyps[1] and meets(hyps[1][0].tokens, [[6]])
    assert [r.getMessage()[:37] for r in caplog.records] == ["input 0: no output contains its requi"]


@pytest.mark.parametrize(("phrases", "beam", "max_len", "message"), [
    ([[4, 5], [6]], 2, 9, "3 required tokens need a beam of at least 3"),
    ([[4, 5, 6, 4]], 8, 3, "4 required tokens do not fit the maximum output length of 3"),
    ([[]], 4, 9, "empty"),
    ([[4, EOS]], 4, 9, r"ids \[2\] that are not target tokens"),
])
def test_phrases_the_search_cannot_take_are_errors_naming_the_source(phrases: list[list[int]], beam: int,
                                                                    max_len: int, message: str) -> None:
    assert required_problem(phrases, beam=beam, max_len=max_len) is not None
    model = tiny_model(vocab=VOCAB, seed=0)
    src = pad_batch([[4, EOS], [5, 6, EOS]])
    with pytest.raises(ValueError, match=f"source 1: .*{message}"):
        beam_search(model, src, beam=beam, alpha=0.6, max_len=torch.tensor([max_len, max_len]),
                    required=[[], phrases])


def test_an_id_outside_the_vocabulary_is_an_error() -> None:
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        beam_search(tiny_model(vocab=VOCAB, seed=0), torch.tensor([[4, EOS]]), beam=2, alpha=0.6,
                    max_len=torch.tensor([4]), required=[[[VOCAB + 3]]])
