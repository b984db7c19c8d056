"""Positive lexical constraints: phrases every output must contain, searched with dynamic
beam allocation (Post and Vilar 2018).

Each hypothesis keeps its progress on each required phrase: how many times the phrase
already occurs in it (non-overlapping occurrences, counted left to right) and the longest
start of the phrase its tokens end with (a Knuth-Morris-Pratt state, so a partial phrase
that the next token does not continue is abandoned, or falls back to a shorter start
that it does continue). A hypothesis may end only once every phrase occurs as often as
it was given. Its *met tokens* (the tokens of its phrases met so far, a partial phrase's
included) pick its bank; each step the beam is shared out across banks
(:func:`bank_sizes`), so that hypotheses that met more of their constraints are not
pushed out by freer ones that score better.

Shapes: B sentences, K beam, V vocabulary, N = B*K hypotheses, C candidates.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from seqtrans.data.vocab import BOS, EOS, PAD

Phrases = Sequence[Sequence[int]]  # target ids, one list per phrase


@dataclass(frozen=True)
class Phrase:
    """One required phrase: its tokens, how many times an output must contain it, and its
    KMP failure function (``fail[i]``: the longest proper start of the phrase that
    ``tokens[: i + 1]`` ends with)."""

    tokens: tuple[int, ...]
    times: int
    fail: tuple[int, ...]

    @staticmethod
    def of(tokens: Sequence[int], times: int = 1) -> Phrase:
        fail = [0] * len(tokens)
        k = 0
        for i in range(1, len(tokens)):
            while k and tokens[i] != tokens[k]:
                k = fail[k - 1]
            if tokens[i] == tokens[k]:
                k += 1
            fail[i] = k
        return Phrase(tuple(tokens), times, tuple(fail))

    def step(self, matched: int, token: int) -> int:
        """The longest start of the phrase that a prefix ending with ``tokens[:matched]``
        followed by ``token`` ends with (the whole phrase: ``len(tokens)``)."""
        while matched and self.tokens[matched] != token:
            matched = self.fail[matched - 1]
        return matched + 1 if self.tokens[matched] == token else 0


# per phrase: (occurrences counted, tokens of a partial occurrence matched)
Progress = tuple[tuple[int, int], ...]


def phrase_set(phrases: Phrases) -> tuple[Phrase, ...]:
    """The distinct phrases of ``phrases``, each with the number of times it was given."""
    counts = Counter(tuple(p) for p in phrases)
    return tuple(Phrase.of(tokens, times) for tokens, times in counts.items())


def advance(phrases: tuple[Phrase, ...], progress: Progress, token: int) -> Progress:
    """The progress after one more token; a phrase met as often as required stays met."""
    out = []
    for phrase, (count, matched) in zip(phrases, progress):
        if count < phrase.times:
            matched = phrase.step(matched, token)
            if matched == len(phrase.tokens):  # an occurrence: the next must start after it
                count, matched = count + 1, 0
        out.append((count, matched))
    return tuple(out)


def met_tokens(phrases: tuple[Phrase, ...], progress: Progress) -> int:
    """The constraint tokens met: those of each occurrence counted, and of a partial one."""
    return sum(count * len(p.tokens) + (matched if count < p.times else 0)
               for p, (count, matched) in zip(phrases, progress))


def total_tokens(phrases: Phrases) -> int:
    """The constraint tokens of ``phrases`` (those of a repeated phrase counted each time)."""
    return sum(len(p) for p in phrases)


def required_problem(phrases: Phrases, *, beam: int, max_len: int) -> str | None:
    """Why a search of beam ``beam`` and outputs of at most ``max_len`` tokens cannot
    take the required ``phrases`` (target ids), or None when it can."""
    for phrase in phrases:
        if not phrase:
            return "a required phrase is empty"
        bad = [t for t in phrase if t < 0 or t in (PAD, BOS, EOS)]
        if bad:
            return f"required phrase {list(phrase)} holds ids {bad} that are not target tokens"
    n = total_tokens(phrases)
    if n > beam:
        return (f"{n} required tokens need a beam of at least {n} (a slot for each number of them met), "
                f"got beam {beam}")
    if n > max_len:
        return f"{n} required tokens do not fit the maximum output length of {max_len} tokens"
    return None


def bank_sizes(available: Sequence[int], beam: int) -> list[int]:
    """How many of the ``beam`` slots go to each bank (``available[j]`` candidates have j
    tokens met): an even share each, the remainder to the banks with the most tokens met;
    slots a bank cannot fill go to the banks with more candidates, most tokens met first."""
    n = len(available)
    sizes = [beam // n] * n
    for j in range(beam % n):
        sizes[n - 1 - j] += 1
    spare = sum(max(0, s - a) for s, a in zip(sizes, available))
    sizes = [min(s, a) for s, a in zip(sizes, available)]
    for j in reversed(range(n)):
        extra = min(spare, available[j] - sizes[j])
        sizes[j] += extra
        spare -= extra
    return sizes


def allocate(banks: Sequence[int], usable: Sequence[bool], beam: int, num_banks: int) -> list[int]:
    """The candidates that go on, in the order given (best first): per bank, its best
    ``bank_sizes`` ones. ``banks[c]``: candidate c's tokens met; ``usable[c]``: whether it
    may go on (finite and not ending)."""
    by_bank: list[list[int]] = [[] for _ in range(num_banks)]
    for c, (bank, ok) in enumerate(zip(banks, usable)):
        if ok:
            by_bank[bank].append(c)
    sizes = bank_sizes([len(b) for b in by_bank], beam)
    return sorted(c for members, size in zip(by_bank, sizes) for c in members[:size])


class RequiredState:
    """The progress of every live hypothesis on its source's required phrases; reordered
    with the beam as the decoder state is (rows hold their sentence's phrases)."""

    def __init__(self, required: Sequence[Phrases], rows: Tensor) -> None:
        sets = [phrase_set(p) for p in required]
        self.phrases = [sets[r] for r in rows.tolist()]  # per hypothesis
        self.progress: list[Progress] = [tuple((0, 0) for _ in p) for p in self.phrases]
        self.banks = [total_tokens(p) + 1 for p in required]  # per sentence still decoding
        self.device = rows.device

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        index = rows.tolist()
        self.phrases = [self.phrases[i] for i in index]
        self.progress = [self.progress[i] for i in index]
        if sentences is not None:
            self.banks = [self.banks[i] for i in sentences.tolist()]

    def advance(self, tokens: Tensor) -> None:
        self.progress = [advance(p, g, t) for p, g, t in zip(self.phrases, self.progress, tokens.tolist())]

    def can_end(self) -> Tensor:
        """[N] bool: every phrase met as often as required."""
        done = [all(c >= p.times for p, (c, _) in zip(ps, g)) for ps, g in zip(self.phrases, self.progress)]
        return torch.tensor(done, dtype=torch.bool, device=self.device)

    def next_tokens(self, vocab: int) -> Tensor:
        """[N, V] bool: the tokens that continue (or start) a phrase still unmet."""
        mask = torch.zeros(len(self.phrases), vocab, dtype=torch.bool)
        for i, (ps, g) in enumerate(zip(self.phrases, self.progress)):
            for p, (count, matched) in zip(ps, g):
                if count < p.times:
                    if p.tokens[matched] >= vocab:
                        raise ValueError(f"required phrase {list(p.tokens)}: id {p.tokens[matched]} is "
                                         f"outside the target vocabulary of {vocab}")
                    mask[i, p.tokens[matched]] = True
        return mask.to(self.device)

    def met_after(self, rows: Tensor, tokens: Tensor) -> Tensor:
        """The tokens met by hypotheses ``rows`` extended by ``tokens``.  [B, C] -> [B, C]"""
        met = [met_tokens(self.phrases[r], advance(self.phrases[r], self.progress[r], t))
               for r, t in zip(rows.flatten().tolist(), tokens.flatten().tolist())]
        return torch.tensor(met, dtype=torch.long).view(rows.shape)


def constrained_candidates(total: Tensor, state: RequiredState, *, constrained: Tensor
                           ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The candidates of dynamic beam allocation: the 2K best extensions of each sentence,
    and, for sentences with required phrases (``constrained`` [B] bool), each hypothesis's
    best token and every token that continues one of its unmet phrases. Sentences without
    phrases get exactly :func:`~seqtrans.decoding.search.top_candidates`' 2K.

    total [B, K, V] -> (scores, source beam, token, tokens met), each [B, C], best first,
    with C at least 2K and a last candidate of score -inf that pads the beam.
    """
    b, k, v = total.shape
    flat = total.view(b, k * v)  # [B, K*V]
    wanted = torch.zeros_like(flat, dtype=torch.bool)
    wanted.scatter_(1, flat.topk(min(2 * k, k * v), dim=1).indices, True)
    extra = state.next_tokens(v).view(b, k, v)  # [N, V] -> [B, K, V]
    extra.scatter_(2, total.argmax(dim=2, keepdim=True), True)  # [B, K, 1] the best token of each
    wanted |= (extra & constrained.view(b, 1, 1)).view(b, k * v)
    wanted &= torch.isfinite(flat)
    n = max(int(wanted.sum(dim=1).max()), min(2 * k, k * v))
    scores, index = flat.masked_fill(~wanted, float("-inf")).topk(n, dim=1)  # [B, C]
    scores = torch.cat([scores, scores.new_full((b, 1), float("-inf"))], dim=1)  # [B, C+1]
    index = torch.cat([index, index.new_zeros(b, 1)], dim=1)
    src_beam, token = torch.div(index, v, rounding_mode="floor"), index % v
    rows = torch.arange(b, device=total.device).unsqueeze(1) * k + src_beam  # [B, C] row of each
    return scores, src_beam, token, state.met_after(rows, token)


def dynamic_beam(scores: Tensor, ends: Tensor, met: Tensor, banks: Sequence[int], beam: int) -> Tensor:
    """The K candidates that go on (:func:`allocate` per sentence), best first; slots left
    empty point at the last candidate, the padding of :func:`constrained_candidates`.

    scores, ends, met [B, C] -> [B, K] indices into C
    """
    usable = (torch.isfinite(scores) & ~ends).tolist()
    pad = scores.size(1) - 1
    picked = []
    for sentence_met, ok, num_banks in zip(met.tolist(), usable, banks):
        chosen = allocate(sentence_met, ok, beam, num_banks)
        picked.append(chosen + [pad] * (beam - len(chosen)))
    return torch.tensor(picked, dtype=torch.long, device=scores.device)
