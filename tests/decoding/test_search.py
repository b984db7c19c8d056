"""Beam and greedy search against brute force on a tiny vocabulary, the length penalty
against hand-computed values, the constraint hook and batch independence."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_model
from seqtrans.data.batches import pad_batch
from seqtrans.data.vocab import BOS, EOS, PAD, UNK
from seqtrans.decoding import beam_search, greedy_search, length_penalty
from seqtrans.decoding.protocol import SearchModel
from seqtrans.decoding.search import split_finished
from seqtrans.model.transformer import Transformer

pytestmark = pytest.mark.usefixtures("no_grad")

VOCAB = 7  # <pad> <s> </s> <unk> a b c
BODY = [UNK, 4, 5, 6]  # tokens an output may contain before its end


def sequence_log_probs(model: Transformer, src: torch.Tensor, outputs: list[list[int]]) -> torch.Tensor:
    """log P(y EOS | x) of each output by full teacher-forced recomputation (no cache)."""
    tgt_in = pad_batch([[BOS, *y] for y in outputs])
    tgt_out = pad_batch([[*y, EOS] for y in outputs])
    logp = F.log_softmax(model(src.expand(len(outputs), -1), tgt_in).float(), dim=-1)
    tok = logp.gather(-1, tgt_out.unsqueeze(-1)).squeeze(-1)
    return tok.masked_fill(tgt_out.eq(PAD), 0.0).sum(dim=1)


def brute_force(model: Transformer, src: torch.Tensor, max_len: int,
                alpha: float) -> list[tuple[float, list[int]]]:
    """Every output of at most ``max_len`` tokens, best score first."""
    outputs = [list(y) for n in range(max_len + 1) for y in itertools.product(BODY, repeat=n)]
    logp = sequence_log_probs(model, src, outputs)
    scored = [(float(lp) / ((5 + len(y) + 1) / 6) ** alpha, y) for lp, y in zip(logp, outputs)]
    return sorted(scored, key=lambda s: -s[0])


# attention mechanisms the search must work with unchanged (options for tiny_model)
MECHANISM_OPTIONS: dict[str, dict] = {
    "scaled_dot": {},
    "memory": {"cross_attention": "memory", "memory_slots": 3, "memory_positions": True},
    "monotonic": {"cross_attention": "monotonic", "monotonic_r_init": 0.3},
    "local-p": {"cross_attention": "local", "local_window": 1},
    "additive-restricted": {"cross_attention": "additive", "decoder_attention": "restricted",
                            "restricted_radius": 1},
    "location-general-dot": {"cross_attention": "location", "encoder_attention": "general",
                             "decoder_attention": "dot", "location_max_length": 24},
    "extension": {"extension": True},
    "extension-monotonic": {"extension": True, "cross_attention": "monotonic", "monotonic_r_init": 0.3},
}
MECHANISMS = [pytest.param(options, id=name) for name, options in MECHANISM_OPTIONS.items()]


def mechanism_model(options: dict, *, seed: int, vocab: int = VOCAB) -> Transformer:
    model = tiny_model(vocab=vocab, seed=seed, **options)
    if options.get("cross_attention") == "monotonic":  # energies that move through the source
        for layer in model.decoder_layers:
            layer.cross_attn.g.data.fill_(1.0)  # type: ignore[union-attr]
    return model


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_wide_beam_returns_the_brute_force_argmax(alpha: float, seed: int) -> None:
    wide_beam_is_exact(tiny_model(vocab=VOCAB, seed=seed), alpha)


@pytest.mark.parametrize("options", MECHANISMS)
def test_wide_beam_is_exact_with_every_attention_mechanism(options: dict) -> None:
    wide_beam_is_exact(mechanism_model(options, seed=1), 0.6)


def wide_beam_is_exact(model: Transformer, alpha: float) -> None:
    src = torch.tensor([[4, 5, 6, EOS]])
    max_len = 3
    expected = brute_force(model, src, max_len, alpha)
    hyps = beam_search(model, src, beam=VOCAB**max_len, alpha=alpha, max_len=torch.tensor([max_len]),
                       nbest=5)[0]
    assert [h.tokens for h in hyps] == [y for _, y in expected[:5]]
    for h, (score, _) in zip(hyps, expected):
        assert h.score == pytest.approx(score, abs=1e-4)
        assert h.log_prob == pytest.approx(score * ((5 + len(h.tokens) + 1) / 6) ** alpha, abs=1e-4)


def test_narrow_beam_never_beats_the_optimum_and_scores_are_consistent() -> None:
    model = tiny_model(vocab=VOCAB, seed=3)
    src = torch.tensor([[4, 4, 5, EOS]])
    best_score = brute_force(model, src, 3, 0.6)[0][0]
    for beam in (1, 2, 4):
        hyp = beam_search(model, src, beam=beam, alpha=0.6, max_len=torch.tensor([3]))[0][0]
        assert hyp.score <= best_score + 1e-5
        recomputed = float(sequence_log_probs(model, src, [hyp.tokens])[0])
        assert hyp.log_prob == pytest.approx(recomputed, abs=1e-4)


def test_greedy_follows_the_argmax_of_each_step() -> None:
    model = tiny_model(vocab=VOCAB, seed=4)
    src = torch.tensor([[6, 5, 4, EOS]])
    prefix: list[int] = []
    for _ in range(6):  # step-by-step argmax by full recomputation, PAD and BOS excluded
        logits = model(src, torch.tensor([[BOS, *prefix]]))[0, -1]
        logits[[PAD, BOS]] = float("-inf")
        token = int(logits.argmax())
        if token == EOS:
            break
        prefix.append(token)
    hyp = greedy_search(model, src, max_len=torch.tensor([6]))[0][0]
    assert hyp.tokens == prefix[:6]


def test_length_penalty_matches_hand_computed_values() -> None:
    assert length_penalty(1.0, 0.0) == 1.0
    assert length_penalty(1.0, 1.0) == 1.0  # (5 + 1) / 6
    assert length_penalty(7.0, 1.0) == 2.0  # (5 + 7) / 6
    assert length_penalty(7.0, 0.6) == pytest.approx(1.515716566510398)  # 2 ** 0.6
    assert length_penalty(25.0, 0.6) == pytest.approx(2.626527804403767)  # 5 ** 0.6
    assert length_penalty(10.0, 0.3) == pytest.approx(math.pow(2.5, 0.3))


def test_outputs_respect_the_maximum_length() -> None:
    model = tiny_model(vocab=VOCAB, seed=5)
    src = torch.tensor([[4, 5, EOS], [4, 4, EOS]])
    for hyps in beam_search(model, src, beam=3, alpha=0.6, max_len=torch.tensor([0, 2]), nbest=3):
        assert all(len(h.tokens) <= 2 for h in hyps)
    out = beam_search(model, src, beam=3, alpha=0.6, max_len=torch.tensor([0, 2]))
    assert out[0][0].tokens == []  # a maximum of 0 leaves only the end symbol


class OnlyTokens:
    """Test constraint: hypotheses of source row r may only use ``allowed[r]`` and end
    after exactly ``length[r]`` tokens."""

    def __init__(self, allowed: list[list[int]], length: list[int]) -> None:
        self.allowed_tokens = allowed
        self.length = length

    def allowed(self, prefix: torch.Tensor, *, rows: torch.Tensor, remaining: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(prefix.size(0), VOCAB, dtype=torch.bool)
        for i, r in enumerate(rows.tolist()):
            if prefix.size(1) < self.length[r]:
                mask[i, self.allowed_tokens[r]] = True
            else:
                mask[i, EOS] = True
        return mask


@pytest.mark.parametrize("beam", [1, 3])
def test_search_respects_the_constraint(beam: int) -> None:
    model = tiny_model(vocab=VOCAB, seed=6)
    src = torch.tensor([[4, 5, 6, EOS], [6, 6, EOS, PAD]])
    constraint = OnlyTokens([[5], [4, 6]], [3, 2])
    out = (greedy_search(model, src, max_len=torch.tensor([8, 8]), constraint=constraint) if beam == 1
           else beam_search(model, src, beam=beam, alpha=0.6, max_len=torch.tensor([8, 8]), nbest=beam,
                            constraint=constraint))
    assert out[0][0].tokens == [5, 5, 5]
    for hyp in out[1]:
        assert len(hyp.tokens) == 2 and set(hyp.tokens) <= {4, 6}
    if beam > 1:  # the best constrained output by brute force
        outputs = [list(y) for y in itertools.product([4, 6], repeat=2)]
        logp = sequence_log_probs(model, src[1:, :3], outputs)
        assert out[1][0].tokens == outputs[int(logp.argmax())]


@pytest.mark.parametrize("beam, options", [pytest.param(1, {}, id="1-scaled_dot"), *(
    pytest.param(4, options, id=f"4-{name}") for name, options in MECHANISM_OPTIONS.items())])
def test_a_sentence_decodes_the_same_alone_or_among_longer_ones(beam: int, options: dict) -> None:
    assert_decodes_alone_as_among_longer_ones(mechanism_model(options, seed=7, vocab=11), beam)


def assert_decodes_alone_as_among_longer_ones(model: SearchModel, beam: int) -> None:
    """Each of three sentences of different lengths decodes to the same hypotheses alone
    as in one batch with the others."""
    sentences = [[4, 5, EOS], [6, 7, 8, 9, 10, 4, 5, EOS], [10, 9, 8, 7, 6, 5, 4, 4, 5, 6, EOS]]

    def decode(idx: list[int]) -> list:
        src = pad_batch([sentences[i] for i in idx])
        ml = torch.full((len(idx),), 20)
        if beam == 1:
            return greedy_search(model, src, max_len=ml)
        return beam_search(model, src, beam=beam, alpha=0.6, max_len=ml, nbest=beam)

    together = decode([0, 1, 2])
    for i in range(3):
        alone = decode([i])[0]
        assert [h.tokens for h in alone] == [h.tokens for h in together[i]]
        for a, b in zip(alone, together[i]):
            assert a.score == pytest.approx(b.score, abs=1e-4)


@pytest.mark.parametrize("seed", range(4))
def test_split_finished_keeps_the_order_of_the_candidates_that_go_on(seed: int) -> None:
    """The K best that go on are the candidates that do not end, in order, then those that
    do; where none ends (most steps) without a sort, and said so."""
    gen = torch.Generator().manual_seed(seed)
    b, c, k = 5, 8, 4
    scores = torch.randn(b, c, generator=gen).sort(dim=1, descending=True).values
    scores[0, -2:] = float("-inf")
    for p_end in (0.0, 0.3):
        tokens = torch.randint(4, 20, (b, c), generator=gen)
        tokens[torch.rand(b, c, generator=gen) < p_end] = EOS
        ends, go_on, any_end = split_finished(scores, tokens, k)
        expected_ends = tokens.eq(EOS) & torch.isfinite(scores)
        assert torch.equal(ends, expected_ends) and any_end == bool(expected_ends.any())
        for row, ended in zip(go_on.tolist(), expected_ends.tolist()):
            order = [j for j in range(c) if not ended[j]] + [j for j in range(c) if ended[j]]
            assert row == order[:k]


def test_beam_search_reads_tensor_values_twice_a_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read of a tensor's value on the host waits for a GPU: beam search reads two a
    step (whether a candidate ends, whether a sentence is done), besides what it reads once
    per search and per finished sentence. Counted on the CPU on the path a GPU takes."""
    monkeypatch.setenv("SEQTRANS_NATIVE", "0")
    model = tiny_model(vocab=VOCAB, seed=0)
    b, steps = 3, 12
    src = torch.tensor([[4, 5, 6, 5], [5, 4, 4, 6], [6, 6, 5, 4]])
    reads: list[str] = []
    def counting(name: str) -> Callable[..., object]:
        method = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *args: object, **kwargs: object) -> object:
            reads.append(name)
            return method(self, *args, **kwargs)

        return counted

    for name in ("__bool__", "__int__", "__float__", "item", "tolist", "nonzero"):
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    out = beam_search(model, src, beam=3, alpha=0.6, max_len=torch.full((b,), steps), min_len=steps)
    monkeypatch.undo()
    assert [len(h[0].tokens) for h in out] == [steps] * b
    # per sentence: its index and its n-best's tokens, scores and normalised scores; per
    # search, at most 12: the longest length, the soonest limit, the model's padding tests,
    # the last step's tests of which rows must end, and the finished sentences' positions
    assert len(reads) <= 2 * (steps + 1) + 4 * b + 12, reads
