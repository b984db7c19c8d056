"""Sampling: truncation against a reference written over plain lists, inverse transform
against hand-placed uniforms, the empirical distribution of sampled outputs against the
exact one (chi-square over enumerated outputs), and streams that follow the input, not
its batch."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
from test_beam_table import A, B, TableModel

from conftest import tiny_model
from seqtrans.config import DecodeConfig
from seqtrans.data.vocab import BOS, EOS, PAD
from seqtrans.decoding.generate import generate
from seqtrans.decoding.sampling import Truncation, draw, input_uniforms, sample, truncate
from seqtrans.errors import ConfigError

CPU = torch.device("cpu")
TRUNCATIONS = [Truncation(), Truncation(temperature=0.5), Truncation(temperature=2.0),
               Truncation(top_k=1), Truncation(top_k=3), Truncation(top_p=0.3), Truncation(top_p=0.75),
               Truncation(epsilon=0.12), Truncation(temperature=0.7, top_k=4, top_p=0.9, epsilon=0.05)]


def reference(probs: list[float], t: Truncation) -> list[float]:
    """The truncated distribution by the documented rule, one step after another, in floats."""
    p = [q ** (1 / t.temperature) for q in probs]
    p = [q / sum(p) for q in p]
    order = sorted(range(len(p)), key=lambda i: -p[i])
    if t.top_k:
        p = [q if i in order[: t.top_k] else 0.0 for i, q in enumerate(p)]
        p = [q / sum(p) for q in p]
    if t.top_p < 1:
        kept, mass = set(), 0.0
        for i in order:
            if mass >= t.top_p:
                break
            kept.add(i)
            mass += p[i]
        p = [q if i in kept else 0.0 for i, q in enumerate(p)]
        p = [q / sum(p) for q in p]
    if t.epsilon:
        p = [q if q >= t.epsilon or i == order[0] else 0.0 for i, q in enumerate(p)]
        p = [q / sum(p) for q in p]
    return p


@pytest.mark.parametrize("truncation", TRUNCATIONS, ids=repr)
def test_truncation_keeps_the_reference_distribution(truncation: Truncation) -> None:
    rng = random.Random(0)
    for _ in range(20):
        probs = [rng.random() ** 3 for _ in range(7)]
        probs = [q / sum(probs) for q in probs]
        got = truncate(torch.tensor([probs]).log(), truncation).exp()[0]
        assert got.tolist() == pytest.approx(reference(probs, truncation), abs=1e-6)


def test_truncation_leaves_forbidden_tokens_and_empty_rows_forbidden() -> None:
    log_probs = torch.tensor([[0.0, -1.0, float("-inf"), -2.0], [float("-inf")] * 4])
    out = truncate(log_probs, Truncation(temperature=0.5, top_k=3, top_p=0.9))
    assert out[0, 2] == float("-inf") and torch.isfinite(out[0, 0])
    assert bool(torch.isneginf(out[1]).all())


@pytest.mark.parametrize("truncation", [
    *TRUNCATIONS, Truncation(top_k=40), Truncation(top_p=0.5),
    Truncation(temperature=0.7, top_k=30, top_p=0.8, epsilon=0.001)], ids=repr)
def test_the_fast_routes_draw_what_truncating_the_whole_vocabulary_draws(truncation: Truncation) -> None:
    g = torch.Generator().manual_seed(0)
    for scale in (0.5, 3.0, 8.0):  # flat to peaked: the nucleus within the first tokens probed, or not
        logits = torch.randn(64, 500, generator=g) * scale
        logits[:3, 7:] = float("-inf")  # rows with fewer allowed tokens than top_k
        logits[3] = float("-inf")  # a row with none
        log_probs = torch.log_softmax(logits, dim=1)
        log_probs[5, 11] = float("-inf")  # masked by a rule afterwards: not renormalised
        u = torch.rand(64, generator=g)
        expected = draw(truncate(log_probs, truncation), u)
        got = sample(log_probs, truncation, u)
        assert torch.equal(got[4:], expected[4:]) and torch.equal(got[:3], expected[:3])
        assert bool(got[:3].lt(7).all())


def test_draw_picks_the_token_whose_interval_holds_the_uniform() -> None:
    probs = torch.tensor([0.0, 0.25, 0.0, 0.5, 0.25, 0.0])
    log_probs = probs.log().expand(8, -1)
    u = torch.tensor([0.0, 0.2499, 0.25, 0.5, 0.7499, 0.75, 0.9999, 1.0 - 2**-24])
    assert draw(log_probs, u).tolist() == [1, 1, 3, 3, 3, 4, 4, 4]


def test_uniforms_depend_on_the_input_not_on_its_neighbours() -> None:
    alone = input_uniforms(7, [5], samples=3, steps=[4])
    among = input_uniforms(7, [2, 5, 9], samples=3, steps=[6, 4, 2])
    assert torch.equal(among[3:6, :4], alone)
    assert not torch.equal(input_uniforms(8, [5], samples=3, steps=[4]), alone)
    assert not torch.equal(input_uniforms(7, [6], samples=3, steps=[4]), alone)


TABLE = {
    (): {EOS: 0.3, A: 0.45, B: 0.25},
    (A,): {EOS: 0.5, A: 0.2, B: 0.3},
    (B,): {EOS: 0.8, A: 0.2},
    (A, A): {EOS: 0.6, B: 0.4},
    (A, B): {EOS: 0.1, A: 0.9},
}
V = 6


def exact_distribution(truncation: Truncation) -> dict[tuple[int, ...], float]:
    """P(output) of every output under the truncated table, by enumeration."""
    out: dict[tuple[int, ...], float] = {}

    def walk(prefix: tuple[int, ...], p: float) -> None:
        row = [0.0] * V
        for tok, q in TABLE.get(prefix, {EOS: 1.0}).items():
            row[tok] = q
        allowed = reference(row, truncation) if len([q for q in row if q]) > 1 else row
        for tok, q in enumerate(allowed):
            if q == 0:
                continue
            if tok == EOS:
                out[prefix] = out.get(prefix, 0.0) + p * q
            else:
                walk((*prefix, tok), p * q)

    walk((), 1.0)
    return out


# 0.999 quantiles of chi-square with df degrees of freedom
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12}


@pytest.mark.parametrize("truncation", [Truncation(), Truncation(temperature=0.6),
                                        Truncation(top_k=2), Truncation(top_p=0.7),
                                        Truncation(temperature=1.5, epsilon=0.25)], ids=repr)
def test_samples_follow_the_exact_distribution_of_outputs(truncation: Truncation) -> None:
    n = 4000
    config = DecodeConfig(sample=n, temperature=truncation.temperature, top_k=truncation.top_k,
                          top_p=truncation.top_p, epsilon=truncation.epsilon, max_len_b=10, seed=3)
    hyps = generate(TableModel(TABLE), [[A, EOS]], config, device=CPU)[0]  # type: ignore[arg-type]
    assert len(hyps) == n
    counts: dict[tuple[int, ...], int] = {}
    for h in hyps:
        counts[tuple(h.tokens)] = counts.get(tuple(h.tokens), 0) + 1
    exact = exact_distribution(truncation)
    assert set(counts) <= set(exact)  # nothing outside the allowed set is ever emitted
    chi2 = sum((counts.get(y, 0) - n * p) ** 2 / (n * p) for y, p in exact.items())
    assert chi2 < CHI2_999[len(exact) - 1], (chi2, counts, exact)
    for h in hyps[:20]:  # the model's log-probability, before truncation
        p, prefix = 1.0, ()
        for tok in (*h.tokens, EOS):
            p *= TABLE.get(prefix, {EOS: 1.0})[tok]
            prefix = (*prefix, tok)
        assert h.log_prob == pytest.approx(math.log(p), abs=1e-5)


def test_samples_do_not_depend_on_the_batch_and_follow_the_seed() -> None:
    model = tiny_model(vocab=9, seed=2)
    sources = [[4, 5, 6, EOS], [7, EOS], [5, 5, 8, 6, 4, EOS], [8, 4, EOS]]
    config = DecodeConfig(sample=3, max_len_b=5, top_k=5, seed=11)
    together = generate(model, sources, config, device=CPU)
    one_at_a_time = [generate(model, [s], config, device=CPU, positions=[i])[0]
                     for i, s in enumerate(sources)]
    small_batches = generate(model, sources, DecodeConfig(sample=3, max_len_b=5, top_k=5, seed=11,
                                                          batch_tokens=4), device=CPU)
    tokens = [[h.tokens for h in hyps] for hyps in together]
    assert tokens == [[h.tokens for h in hyps] for hyps in one_at_a_time]
    assert tokens == [[h.tokens for h in hyps] for hyps in small_batches]
    assert all(len(hyps) == 3 for hyps in together)
    other_seed = generate(model, sources, DecodeConfig(sample=3, max_len_b=5, top_k=5, seed=12), device=CPU)
    assert tokens != [[h.tokens for h in hyps] for hyps in other_seed]


def test_top_k_and_top_p_never_emit_a_token_outside_the_allowed_set() -> None:
    model = tiny_model(vocab=9, seed=5)
    src = torch.tensor([[4, 5, 6, 7, EOS]])
    longest = 4 + 3  # decode.max_len_b + the source's length: then only the end is allowed
    probs_after: dict[tuple[int, ...], list[float]] = {}  # the step's distribution by full recomputation
    for truncation in (Truncation(top_k=2), Truncation(top_p=0.5), Truncation(top_k=3, top_p=0.6)):
        config = DecodeConfig(sample=32, max_len_b=3, top_k=truncation.top_k, top_p=truncation.top_p)
        for hyp in generate(model, src.tolist(), config, device=CPU)[0]:
            for t, tok in enumerate([*hyp.tokens, EOS][:longest]):
                prefix = tuple(hyp.tokens[:t])
                if prefix not in probs_after:
                    logits = model(src, torch.tensor([[BOS, *prefix]]))[0, -1].float()
                    logits[[PAD, BOS]] = float("-inf")
                    probs_after[prefix] = logits.softmax(-1).tolist()
                assert reference(probs_after[prefix], truncation)[tok] > 0, (truncation, hyp.tokens)


def test_greedy_is_unchanged_by_the_sampling_keys_when_not_sampling() -> None:
    model = tiny_model(vocab=9, seed=2)
    sources = [[4, 5, 6, EOS], [7, EOS]]
    plain = generate(model, sources, DecodeConfig(beam=1), device=CPU)
    keyed = generate(model, sources, DecodeConfig(beam=1, temperature=3.0, top_k=1, seed=9), device=CPU)
    assert [(h[0].tokens, h[0].log_prob) for h in plain] == [(h[0].tokens, h[0].log_prob) for h in keyed]


@pytest.mark.parametrize("key, value", [("top_p", 0.0), ("top_p", 1.5), ("temperature", 0.0),
                                        ("temperature", -1.0), ("top_k", -1), ("epsilon", 1.0),
                                        ("sample", -2)])
def test_bad_sampling_settings_name_their_key(key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"decode.{key}"):
        DecodeConfig(**{key: value})


def test_sampling_with_an_n_best_list_is_an_error_naming_nbest() -> None:
    with pytest.raises(ConfigError, match="decode.nbest"):
        DecodeConfig(sample=2, beam=4, nbest=2)


def test_every_output_of_the_table_is_enumerated() -> None:
    # guards the chi-square test: the enumeration sums to 1
    for truncation in (Truncation(), Truncation(top_p=0.7)):
        assert sum(exact_distribution(truncation).values()) == pytest.approx(1.0)
    assert list(itertools.islice(exact_distribution(Truncation(top_k=1)), 2)) == [(A,)]
