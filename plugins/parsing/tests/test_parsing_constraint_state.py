"""The bracket constraint's incremental state against recomputation from the prefix, and
constrained beam search: the same with the state as with whole prefixes, and the same
for a sentence alone as in a batch."""

from __future__ import annotations

import random

import pytest
import torch
from torch import Tensor

from seqtrans import Transformer
from seqtrans.data.batches import pad_batch  # internal: the search itself, with and without the state
from seqtrans.decoding import beam_search  # internal: (as above)
from seqtrans.plugin import EOS, PAD, IncrementalConstraint, ModelConfig, Vocab
from seqtrans_parsing.constraint import BracketConstraint
from seqtrans_parsing.linearize import ORDERS, Order, to_tree

SYMBOLS = ["XX", "NN", "(A", ")A", "(B", ")B", "(C"]  # "(C" has no closing in the vocabulary
PRETERMINALS = ("XX", "NN")


def _vocab() -> Vocab:
    return Vocab(SYMBOLS)


def _random_prefixes(rng: random.Random, n: int, t: int, valid: bool, c: BracketConstraint,
                     rows: Tensor) -> Tensor:
    """``n`` prefixes of ``t`` tokens: drawn among the allowed tokens (valid), or among
    all target tokens, the end symbol and padding included (mostly invalid)."""
    v = len(c.kind)
    out = torch.zeros(n, t, dtype=torch.long)
    for step in range(t):
        if valid:
            mask = c.allowed(out[:, :step], rows=rows, remaining=torch.full((n,), 10 * t))
            for i in range(n):
                choices = mask[i].nonzero().flatten().tolist() or [EOS]
                out[i, step] = rng.choice(choices)
        else:
            out[:, step] = torch.tensor([rng.randrange(v) for _ in range(n)])
    return out


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("valid", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_state_allows_what_recomputation_from_the_prefix_allows(valid: bool, seed: int,
                                                                    order: Order) -> None:
    rng = random.Random(seed)
    vocab = _vocab()
    lengths = [1, 3, 6, 40]
    c = BracketConstraint(lengths, vocab, preterminals=PRETERMINALS, order=order)
    assert isinstance(c, IncrementalConstraint)
    n, t = 12, 42  # deeper than the state's first capacity: it must grow
    rows = torch.tensor([rng.randrange(len(lengths)) for _ in range(n)])
    prefixes = _random_prefixes(rng, n, t, valid, c, rows)
    if seed == 0:  # one row nests 40 deep
        prefixes[0, :40] = vocab.index("(A")
    state = c.start(rows)
    order = torch.arange(n)  # which original row each state row holds
    for step in range(t + 1):
        remaining = torch.tensor([rng.randrange(0, 2 * t) for _ in range(order.numel())])
        expected = c.allowed(prefixes[order, :step], rows=rows[order], remaining=remaining)
        assert torch.equal(state.allowed(remaining=remaining), expected), step
        if step == t:
            break
        # follow a beam: rows reordered, repeated and dropped
        keep = torch.tensor([rng.randrange(order.numel()) for _ in range(max(1, order.numel() - step % 2))])
        state.reorder(keep)
        order = order[keep]
        state.advance(prefixes[order, step])


class _PrefixOnly:
    """The same constraint through the prefix-reading form only."""

    def __init__(self, c: BracketConstraint) -> None:
        self.c = c

    def allowed(self, prefix: Tensor, *, rows: Tensor, remaining: Tensor) -> Tensor:
        return self.c.allowed(prefix, rows=rows, remaining=remaining)


def _model(vocab: Vocab, seed: int) -> Transformer:
    torch.manual_seed(seed)
    config = ModelConfig(encoder_layers=1, decoder_layers=2, d_model=16, d_ff=32, heads=2, dropout=0.0)
    return Transformer(config, source_vocab_size=12, target_vocab_size=len(vocab), shared_vocab=False).eval()


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("seed", [0])
def test_constrained_beam_search_is_the_same_batched_alone_and_from_prefixes(seed: int, order: Order) -> None:
    vocab = _vocab()
    model = _model(vocab, seed)
    sources = [[5, 6, EOS], [7, 8, 9, 10, 4, EOS], [11, EOS], [4, 5, 6, 7, EOS]]
    words = [len(s) - 1 for s in sources]
    max_len = torch.tensor([3 * n + 3 for n in words])

    def decode(idx: list[int], prefix_only: bool = False) -> list:
        c = BracketConstraint([words[i] for i in idx], vocab, preterminals=PRETERMINALS, order=order)
        with torch.inference_mode():
            return beam_search(model, pad_batch([sources[i] for i in idx]), beam=5, alpha=0.3,
                               max_len=max_len[idx], nbest=3, constraint=_PrefixOnly(c) if prefix_only else c)

    def flat(hyps: list) -> list:
        return [(h.tokens, h.log_prob, h.score) for h in hyps]

    together = decode([0, 1, 2, 3])
    assert [flat(h) for h in together] == [flat(h) for h in decode([0, 1, 2, 3], prefix_only=True)]
    for i in range(len(sources)):
        alone = decode([i])[0]
        # batching may change float sums in the last bits, never the outputs
        assert [h.tokens for h in alone] == [h.tokens for h in together[i]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in together[i]], abs=1e-4)
        for h in together[i]:  # well formed, one preterminal per word
            symbols = [vocab.symbols[t] for t in h.tokens]
            assert sum(s in PRETERMINALS for s in symbols) == words[i]
            assert PAD not in h.tokens and symbols.count("(A") == symbols.count(")A")
            ws = [f"w{j}" for j in range(words[i])]
            assert to_tree(symbols, ws, preterminals=PRETERMINALS, order=order).repairs == 0
