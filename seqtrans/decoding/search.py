"""The pure math of beam search, apart from the loop that calls the model.

Shapes: B sentences, K beam, V vocabulary, C candidates (2K), M kept finished
hypotheses (n-best), L longest output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from seqtrans import native
from seqtrans.data.vocab import BOS, EOS, PAD

NEG_INF = float("-inf")


@dataclass(frozen=True)
class Hypothesis:
    """One output: target ids without the end symbol, its total log-probability and
    its score (what the search ranks by: length-normalised in beam search, the
    log-probability itself in greedy search and sampling). ``token_log_probs``, filled
    only when asked for (:func:`seqtrans.inference.details.with_token_log_probs`): the
    log-probability of each token and of the end symbol, which sum to ``log_prob``.
    ``text``, filled by a loaded model's ``decode`` (None from the search functions, which
    know no task): the output as the task writes it, what ``seqtrans predict`` prints."""

    tokens: list[int]
    log_prob: float
    score: float
    token_log_probs: tuple[float, ...] | None = None
    text: str | None = field(default=None, compare=False)  # a rendering of the search result, not part of it


def length_penalty(length: Tensor | float, alpha: float, *, kind: str = "gnmt") -> Tensor | float:
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016), or (``kind="power"``)
    |Y|^alpha; |Y| counts the end symbol."""
    if kind == "power":
        return length**alpha
    return ((5.0 + length) / 6.0) ** alpha


class Columns:
    """The target ids that the columns of a step's scores stand for: the whole vocabulary
    in order (``ids`` None), or the ids ``ids`` [V'] of a vocabulary of ``size`` (a
    vocabulary shortlist's, :mod:`seqtrans.shortlist.search`), which must include the end
    symbol. The search then ranks those columns only, and maps the columns it picks back
    to target ids; the rules, which speak of target ids, are read at those columns.
    ``normalized``: the model's scores over them are log-probabilities already (a
    shortlist's, normalised over each source's own tokens)."""

    def __init__(self, ids: Tensor | None = None, *, size: int | None = None,
                 normalized: bool = False) -> None:
        self.ids = ids
        self.size = size
        self.normalized = normalized  # the scores are log-probabilities already
        self.eos = EOS
        self.never: Tensor | list[int] = [PAD, BOS]
        if ids is not None:
            if size is None:
                raise ValueError("columns of a part of the vocabulary need the vocabulary's size")
            found = ids.eq(EOS).nonzero().flatten()
            if found.numel() == 0:
                raise ValueError("the columns must include the end symbol")
            self.eos = int(found[0])
            self.never = ids.eq(PAD) | ids.eq(BOS)  # [V']

    def vocabulary(self, scores: Tensor) -> int:
        """The size of the whole vocabulary, of which ``scores`` [N, V'] hold these columns."""
        return scores.size(-1) if self.size is None else self.size

    def select(self, mask: Tensor) -> Tensor:
        """A mask over the whole vocabulary, at these columns.  [N, V] -> [N, V']"""
        return mask if self.ids is None else mask.index_select(1, self.ids.to(mask.device))

    def tokens(self, columns: Tensor) -> Tensor:
        """The target ids of ``columns`` (any shape)."""
        return columns if self.ids is None else self.ids[columns]


#: The columns of scores over the whole vocabulary.
ALL = Columns()


def mask_log_probs(log_probs: Tensor, *, force_eos: Tensor | None, forbid_eos: bool = False,
                   columns: Columns = ALL) -> Tensor:
    """Never emit padding or the start symbol; rows in ``force_eos`` [N] (None: no row) may
    only end; with ``forbid_eos`` (shorter than the minimum length) no row may end.

    [N, V] -> [N, V] (or over ``columns``' ids [N, V'])
    """
    if isinstance(columns.never, list):  # column by column: an index list would be copied to a GPU
        for column in columns.never:
            log_probs[:, column] = NEG_INF
    else:
        log_probs.masked_fill_(columns.never, NEG_INF)  # [V'] over every row
    eos = columns.eos
    if forbid_eos:
        log_probs[:, eos] = NEG_INF
    if force_eos is not None and bool(force_eos.any()):
        kept = log_probs[:, eos].clone()
        log_probs[force_eos] = NEG_INF
        log_probs[:, eos] = kept
    return log_probs


def repeated_ngram_pairs(generated: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """The (row, token) pairs where the row's last ``size - 1`` tokens followed by the
    token already occur in the row (for size 1, every token it holds); a pair may repeat.

    generated [N, t] (target ids so far, the start symbol excluded) -> rows, tokens [P]
    """
    n, t = generated.shape
    if t < size:
        none = generated.new_empty(0)
        return none, none
    windows = generated.unfold(1, size, 1)  # [N, W, size] every n-gram, W = t - size + 1
    last = generated[:, t - size + 1 :].unsqueeze(1)  # [N, 1, size-1]
    match = windows[:, :, :-1].eq(last).all(dim=2)  # [N, W] n-grams that the next token would repeat
    rows, at = match.nonzero(as_tuple=True)  # [P]
    return rows, windows[rows, at, -1]


def repeated_ngrams(generated: Tensor, size: int, vocab: int) -> Tensor:
    """The tokens that would repeat an n-gram of ``size`` tokens (:func:`repeated_ngram_pairs`)
    as a mask.  generated [N, t] -> [N, V] bool"""
    return _as_mask(repeated_ngram_pairs(generated, size), generated.size(0), vocab, generated.device)


def banned_phrase_pairs(generated: Tensor,
                        phrases: Sequence[Sequence[Sequence[int]]]) -> tuple[Tensor, Tensor]:
    """The (row, token) pairs where the row ends with all but the last token of one of
    ``phrases[row]`` and the token is its last.

    generated [N, t] (target ids so far, the start symbol excluded), phrases: per row
    -> rows, tokens [P]
    """
    t = generated.size(1)
    longest = max((len(p) for own in phrases for p in own), default=1)
    tails = generated[:, max(0, t - longest + 1) :].tolist()  # [N, <= longest-1]: only the end matters
    pairs = [(i, phrase[-1]) for i, (tail, own) in enumerate(zip(tails, phrases)) for phrase in own
             if len(phrase) == 1 or (len(phrase) - 1 <= len(tail)
                                     and tail[len(tail) - len(phrase) + 1 :] == list(phrase[:-1]))]
    found = torch.tensor(pairs, dtype=torch.long, device=generated.device).view(-1, 2)  # [P, 2]
    return found[:, 0], found[:, 1]


def banned_phrase_tokens(generated: Tensor, phrases: Sequence[Sequence[Sequence[int]]], vocab: int) -> Tensor:
    """The tokens that would complete a banned phrase (:func:`banned_phrase_pairs`) as a
    mask.  generated [N, t], phrases: per row -> [N, V] bool"""
    return _as_mask(banned_phrase_pairs(generated, phrases), generated.size(0), vocab, generated.device)


def _as_mask(pairs: tuple[Tensor, Tensor], rows: int, vocab: int, device: torch.device) -> Tensor:
    """(row, token) pairs [P] -> [N, V] bool, True at each"""
    mask = torch.zeros(rows, vocab, dtype=torch.bool, device=device)
    mask[pairs[0], pairs[1]] = True
    return mask


def force_tokens(log_probs: Tensor, forced: Tensor, *, columns: Columns = ALL) -> Tensor:
    """Rows with a forced token (a target prefix) keep only that token's score; rows
    whose ``forced`` entry is PAD are left as they are.

    log_probs [N, V] (or over ``columns``' ids [N, V']), forced [N] target ids -> the same shape
    """
    if columns.ids is not None:
        allowed = forced.eq(PAD).unsqueeze(1) | columns.ids.unsqueeze(0).eq(forced.unsqueeze(1))  # [N, V']
        return log_probs.masked_fill(~allowed, NEG_INF)
    allowed = forced.eq(PAD).unsqueeze(1).expand_as(log_probs).clone()  # [N, V]: free rows allow all
    allowed.scatter_(1, forced.unsqueeze(1), True)  # [N, 1] -> [N, V]
    return log_probs.masked_fill(~allowed, NEG_INF)


def extend(logits: Tensor, prefix: Tensor) -> Tensor:
    """The log-probability of every hypothesis extended by every token:
    ``prefix + log_softmax(logits)``. The fused log-softmax, then the prefix added in place:
    on the CPU ``logsumexp`` takes five passes over the logits (3.4 times the time at 128
    rows of 8,000 on an AMD EPYC).

    logits [N, V] (any layout), prefix [N] (-inf for an empty slot) -> [N, V] float32, contiguous
    """
    out = torch.log_softmax(logits.float(), dim=-1)  # contiguous
    return out.add_(prefix.unsqueeze(1))


def top_candidates(total: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The best extensions of every sentence's hypotheses.

    total [B, K, V] (log-probability of each hypothesis extended by each token) ->
    (candidate scores, source beam, token), each [B, C] with C = min(2K, K*V), best first.
    Twice the beam is enough: at most K candidates end, so at least K go on.
    """
    b, k, v = total.shape
    best, index = largest(total.view(b, k * v), min(2 * k, k * v))  # [B, C]
    return best, torch.div(index, v, rounding_mode="floor"), index % v


@dataclass(frozen=True)
class Exclusions:
    """The next tokens hypotheses may not take, held as indices rather than as [N, V] masks,
    each of which costs a large vocabulary's batch a pass to build and one to apply:
    ``never`` [E] columns no row may take, ``only`` [N] the one column each row may take (-1:
    any; V or more: none) or None, and ``banned`` (rows, columns) [P] pairs."""

    never: Tensor
    only: Tensor | None = None
    banned: tuple[Tensor, Tensor] | None = None

    def by_row(self, rows: int) -> tuple[Tensor, Tensor] | tuple[None, None]:
        """``banned`` as each row's columns in turn: (start [N+1], columns [P]), row r's
        being ``columns[start[r]:start[r+1]]``."""
        if self.banned is None or self.banned[0].numel() == 0:
            return None, None
        row, column = self.banned
        order = row.argsort(stable=True)
        start = torch.zeros(rows + 1, dtype=torch.long, device=row.device)
        start[1:] = torch.bincount(row, minlength=rows).cumsum(0)
        return start, column[order].contiguous()


def fused_candidates(logits: Tensor, prefix: Tensor, beam: int, exclusions: Exclusions, *,
                     rows: int | None = None) -> tuple[Tensor, Tensor, Tensor] | None:
    """:func:`top_candidates` of ``extend(logits, prefix)`` with ``exclusions`` at -inf,
    without those [N, V] scores: each row's own 2K best straight from its logits (the
    native kernel's log-softmax and top-k while the row is in the cache), then the best
    2K of a sentence's K rows, which hold all of them. The same candidates in the same order;
    the scores differ only in the rounding of each row's log-sum-exp. None where the native
    kernels are not built or a row's logits are not finite: the caller takes the long way.

    logits [N, V] with N = B*K, prefix [N] -> (scores, source beam, column), each [B, C];
    with ``rows`` (1: a search's first step, where a sentence's other rows are -inf), N =
    B*rows, and a row must hold C candidates (V >= 2K).
    """
    if logits.device.type != "cpu" or not native.available():
        return None
    n, v = logits.shape
    c = min(2 * beam, beam * v)
    per_row = min(c, v)  # a candidate is among its own row's C best
    start, columns = exclusions.by_row(n)
    rows = beam if rows is None else rows
    if rows * per_row < c:
        raise ValueError(f"{rows} rows of {v} columns cannot hold {c} candidates")
    found = native.beam_candidates(logits.float().contiguous(), prefix.float().contiguous(), per_row,
                                   never=exclusions.never, only=exclusions.only, banned_start=start,
                                   banned=columns)
    if found is None:
        return None
    values, column, _ = found  # [N, per_row]
    # a sentence's rows in turn, each best first: ties keep the lower row, then the lower column
    best, at = largest(values.view(n // rows, rows * per_row), c)  # [B, C]
    return best, torch.div(at, per_row, rounding_mode="floor"), column.view(n // rows, -1).gather(1, at)


def largest(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``x.topk(k, dim=1)``; on the CPU, in one pass over each row with the native kernel
    where it is built (torch.topk took a fifth of a small model's beam search in a one-off profile),
    ties to the lower index.  x [R, M] -> values, indices [R, k]"""
    if x.device.type == "cpu" and x.dtype == torch.float32 and x.stride(-1) == 1 and native.available():
        found = native.topk_rows(x, k)
        if found is not None:  # None: a NaN, which torch.topk ranks
            return found
    return x.topk(k, dim=1)


def split_finished(cand_scores: Tensor, cand_tokens: Tensor, beam: int) -> tuple[Tensor, Tensor, bool]:
    """Which candidates end here, and the K best that go on.

    -> (ends [B, C] bool, continuing [B, K] indices into C, best first, whether any
    candidate ends). Where fewer than K candidates go on, the rest of the K slots point at
    candidates the caller must treat as empty (their ``ends`` is True or their score -inf).
    """
    b, c = cand_scores.shape
    ends = cand_tokens.eq(EOS) & torch.isfinite(cand_scores)
    if not bool(ends.any()):  # most steps: the first K go on, without a sort
        return ends, torch.arange(min(beam, c), device=cand_scores.device).expand(b, -1), False
    rank = torch.arange(c, device=cand_scores.device).expand_as(cand_scores)
    # candidates that go on keep their order; ending ones move behind them
    rank = rank + ends.long() * c
    continuing = rank.argsort(dim=1)[:, :beam]  # [B, K]
    return ends, continuing, True


def merge_finished(kept_scores: Tensor, new_scores: Tensor) -> tuple[Tensor, Tensor]:
    """The M best of the kept finished hypotheses and the new ones.

    kept_scores [B, M], new_scores [B, C] (-inf where no hypothesis ended) ->
    (scores [B, M], index [B, M] into the concatenation [kept; new]).
    """
    m = kept_scores.size(1)
    return torch.cat([kept_scores, new_scores], dim=1).topk(m, dim=1)


def longest_penalty(max_length: Tensor, alpha: float, *, kind: str) -> Tensor | float:
    """The length penalty of each sentence's longest output, ``max_length`` [B], in float32
    (the searches' scores)."""
    return length_penalty(max_length.to(torch.float32), alpha, kind=kind)


def beyond_reach(best_live: Tensor, worst_kept: Tensor, penalty: Tensor | float) -> Tensor:
    """True where no live hypothesis can still beat the M-th best finished one.

    A live hypothesis's log-probability can only fall, and for alpha >= 0 its score
    is highest if it ends at the longest length allowed; so ``best_live / penalty``
    (:func:`longest_penalty`, which a search computes again only when its sentences
    change) bounds every score it may reach. [B] -> [B] bool.
    """
    return torch.isfinite(worst_kept) & (best_live / penalty <= worst_kept)
