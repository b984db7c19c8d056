"""Batched beam search, greedy search and sampling: thin loops around :mod:`seqtrans.decoding.search`.

A sentence leaves the batch as soon as it is finished, so the remaining ones decode
on a smaller batch; nothing a sentence computes depends on its batch-mates.

Shapes: B sentences still decoding, K beam, N = B*K hypotheses, V vocabulary,
L longest output allowed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from seqtrans.data.vocab import BOS, EOS, PAD
from seqtrans.decoding import teams
from seqtrans.decoding.constraints import Constraint, ConstraintState, mask_disallowed, start_constraint
from seqtrans.decoding.lexical import (
    Phrases,
    RequiredState,
    constrained_candidates,
    dynamic_beam,
    required_problem,
)
from seqtrans.decoding.protocol import SearchModel, SearchState, advance, decode_rows
from seqtrans.decoding.sampling import Truncation, sample
from seqtrans.decoding.search import (
    ALL,
    NEG_INF,
    Columns,
    Exclusions,
    Hypothesis,
    banned_phrase_pairs,
    banned_phrase_tokens,
    beyond_reach,
    extend,
    force_tokens,
    fused_candidates,
    length_penalty,
    longest_penalty,
    mask_log_probs,
    merge_finished,
    repeated_ngram_pairs,
    repeated_ngrams,
    split_finished,
    top_candidates,
)

#: ``cancelled(b)``: whether the output of source b (a row of ``src``) is no longer wanted,
#: asked between steps (a server's request past its deadline). A cancelled source leaves
#: the batch at once with the hypotheses it has finished (perhaps none); the others decode
#: as they would have.
Cancelled = Callable[[int], bool]


def _cancelled(cancelled: Cancelled | None, sources: Tensor) -> Tensor | bool:
    """[B] whether each of the ``sources`` [B] (original rows) still decoding is cancelled."""
    if cancelled is None:
        return False
    return torch.tensor([cancelled(b) for b in sources.tolist()], dtype=torch.bool, device=sources.device)


@dataclass(frozen=True)
class Rules:
    """What every hypothesis must respect, whatever the search: at least ``min_len``
    tokens (where the maximum allows it), no n-gram of ``no_repeat_ngram_size`` tokens
    twice (0: no such rule), and none of the phrases ``banned[b]`` (target ids) of its
    source b (empty: none)."""

    min_len: int = 0
    no_repeat_ngram_size: int = 0
    banned: Sequence[Sequence[Sequence[int]]] = ()


def _extended_scores(logits: Tensor, generated: Tensor, step: int, *,
                     prefix: Tensor, limit: Tensor, rules: Rules, constraint: ConstraintState | None,
                     forced: Tensor | None, sources: Tensor | None,
                     required: RequiredState | None = None, columns: Columns = ALL,
                     soonest: int | None = None) -> Tensor:
    """``prefix`` [N] plus the log-probability of each next token of each hypothesis
    (the model's ``logits`` [N, V], or over ``columns``' ids [N, V'])
    after its ``generated`` tokens [N, t] (the start symbol first), -inf where the token
    is not allowed; ``limit`` [N]: the most tokens each may have before its end symbol;
    ``forced`` [N]: the token each must take (a target prefix), PAD where free;
    ``sources`` [N]: the source of each (an index into ``rules.banned``; None without banned phrases);
    ``required``: the hypotheses' progress on their required phrases, which must all be met
    before the end symbol (only over the whole vocabulary); ``soonest`` as :func:`_exclusions`
    takes it. -> [N, V] (float32), or over the target ids ``columns`` [N, V'] where the
    model's scores cover those only"""
    log_probs = logits.float() + prefix.unsqueeze(1) if columns.normalized else extend(logits, prefix)
    remaining = limit - step  # tokens still allowed before the end symbol
    must_end = None if soonest is not None and step < soonest else remaining <= 0  # None: no row yet
    log_probs = mask_log_probs(log_probs, force_eos=must_end, forbid_eos=step < rules.min_len,
                               columns=columns)
    vocab = columns.vocabulary(log_probs)
    if rules.no_repeat_ngram_size:
        banned = repeated_ngrams(generated[:, 1:], rules.no_repeat_ngram_size, vocab)  # [N, V]
        log_probs = log_probs.masked_fill(columns.select(banned), NEG_INF)
    if rules.banned and sources is not None:
        own = [rules.banned[b] for b in sources.tolist()]
        banned = banned_phrase_tokens(generated[:, 1:], own, vocab)  # [N, V]
        log_probs = log_probs.masked_fill(columns.select(banned), NEG_INF)
    if constraint is not None:
        allowed = constraint.allowed(remaining=remaining + 1)  # [N, V]
        if columns.ids is not None and allowed.shape == (log_probs.size(0), vocab):
            allowed = columns.select(allowed)
        log_probs = mask_disallowed(log_probs, allowed, by=constraint)
    if required is not None:
        if columns.ids is not None:
            raise ValueError("required phrases are searched over the whole vocabulary")
        log_probs[:, EOS] = log_probs[:, EOS].masked_fill(~required.can_end(), NEG_INF)
    return log_probs if forced is None else force_tokens(log_probs, forced, columns=columns)


#: A step's candidates: their scores, the hypotheses they extend, their tokens, which end
#: (None where none does) and the K that go on (see :func:`_candidates`).
StepCandidates = tuple[Tensor, Tensor, Tensor, "Tensor | None", Tensor]


def _next_logits(model: SearchModel, generated: Tensor, state: SearchState) -> Tensor:
    """The model's scores of each hypothesis's next token.  generated [N, t] -> [N, V] (or V')"""
    return model.decode(generated[:, -1:], state=state)[:, -1]


def _never(device: torch.device, *, may_end: bool) -> Tensor:
    """The tokens no hypothesis may take next (the end symbol too where it may not end yet),
    made once per device: a new tensor at every step costs a copy to a GPU."""
    key = (device, may_end)
    if key not in _NEVER:
        with torch.inference_mode(False):  # usable outside a search's inference mode too
            _NEVER[key] = torch.tensor([PAD, BOS] if may_end else [PAD, BOS, EOS], device=device)
    return _NEVER[key]


_NEVER: dict[tuple[torch.device, bool], Tensor] = {}


def _exclusions(generated: Tensor, step: int, *, limit: Tensor, rules: Rules, forced: Tensor | None,
                sources: Tensor | None, vocab: int, soonest: int | None = None) -> Exclusions:
    """What :func:`_extended_scores` sets to -inf without a constraint or required phrases,
    over the whole vocabulary of ``vocab``, as indices: the same tokens, in the same order of
    precedence (a row that must end and is forced to another token may take none).
    ``soonest``: no row's ``limit`` [N] is below it, so that before it no row must end."""
    never = _never(generated.device, may_end=step >= rules.min_len)
    only = None
    if forced is not None or soonest is None or step >= soonest:
        must_end = limit - step <= 0  # [N]
        if forced is not None or bool(must_end.any()):
            only = torch.where(must_end, EOS, -1)  # [N]
            if forced is not None:
                pinned = forced.ne(PAD)
                only = torch.where(pinned, forced, only)
                only = only.masked_fill(pinned & must_end & forced.ne(EOS), vocab)  # none
    pairs = []
    if rules.no_repeat_ngram_size:
        pairs.append(repeated_ngram_pairs(generated[:, 1:], rules.no_repeat_ngram_size))
    if rules.banned and sources is not None:
        pairs.append(banned_phrase_pairs(generated[:, 1:], [rules.banned[b] for b in sources.tolist()]))
    banned = (torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])) if pairs else None
    return Exclusions(never, only, banned)


def _beam_candidates(logits: Tensor, generated: Tensor, step: int, *, beam: int, prefix: Tensor,
                     limit: Tensor, rules: Rules, constraint: ConstraintState | None, forced: Tensor | None,
                     sources: Tensor | None, required: RequiredState | None,
                     columns: Columns, soonest: int | None = None) -> StepCandidates:
    """:func:`_candidates` of :func:`_extended_scores` (the same arguments): where the rules
    can be held as indices (no constraint, no required phrases, the whole vocabulary), by
    :func:`~seqtrans.decoding.search.fused_candidates`, which never writes the [N, V] scores
    that cost a large vocabulary's batch more than the model's step (``soonest`` as
    :func:`_exclusions` takes it)."""
    if constraint is None and required is None and columns.ids is None:
        exclusions = _exclusions(generated, step, limit=limit, rules=rules, forced=forced, sources=sources,
                                 vocab=logits.size(-1), soonest=soonest)
        picked = fused_candidates(logits, prefix, beam, exclusions)
        if picked is not None:
            cand, src_beam, token = picked  # [B, C] each
            ends, go_on = _finished(cand, token, beam)
            sentence = torch.arange(0, cand.size(0) * beam, beam, device=cand.device).unsqueeze(1)  # [B, 1]
            return cand, sentence + src_beam, token, ends, go_on
    total = _extended_scores(logits, generated, step, prefix=prefix, limit=limit, rules=rules,
                             constraint=constraint, forced=forced, sources=sources, required=required,
                             columns=columns, soonest=soonest)
    return _candidates(total.view(-1, beam, total.size(-1)), beam, required, columns)


def _step_candidates(model: SearchModel, history: Tensor, state: SearchState, step: int, *, first: bool,
                     beam: int, prefix: Tensor, limit: Tensor, rules: Rules,
                     constraint: ConstraintState | None, forced: Tensor | None, sources: Tensor | None,
                     required: RequiredState | None,
                     columns: Columns, soonest: int | None = None) -> StepCandidates:
    """:func:`_beam_candidates` of the model's next scores (the other arguments as it takes
    them). On a search's ``first`` step each sentence's K rows hold one hypothesis (the
    others' scores -inf): the output product of that row alone (CTranslate2 starts a beam
    on one row per sentence too), whose scores are those it gets among all K rows, so the
    candidates are the same."""
    if first and beam > 1 and constraint is None and required is None and columns.ids is None:
        live = torch.arange(0, history.size(0), beam, device=history.device)  # [B]: each sentence's first row
        logits = decode_rows(model, history[:, -1:], live, state)[:, -1]  # [B, V]
        if logits.size(-1) >= 2 * beam:  # a row holds all of its sentence's candidates
            exclusions = _exclusions(history[live], step, limit=limit[live], rules=rules, soonest=soonest,
                                     vocab=logits.size(-1), forced=None if forced is None else forced[live],
                                     sources=None if sources is None else sources[live])
            picked = fused_candidates(logits, prefix[live], beam, exclusions, rows=1)
            if picked is not None:
                cand, _, token = picked  # [B, C] each, all from the first row
                ends, go_on = _finished(cand, token, beam)
                return cand, live.unsqueeze(1).expand_as(token), token, ends, go_on
        logits = logits.repeat_interleave(beam, dim=0)  # the long way: every row's (the first's) scores
    else:
        logits = _next_logits(model, history, state)
    return _beam_candidates(logits, history, step, beam=beam, prefix=prefix, limit=limit, rules=rules,
                            constraint=constraint, forced=forced, sources=sources, required=required,
                            columns=columns, soonest=soonest)


def _forced_at(prefixes: Tensor | None, step: int, sentences: Tensor, per_sentence: int) -> Tensor | None:
    """The tokens ``prefixes`` [B0, P] (PAD-padded) force at ``step`` on the hypotheses of
    the ``sentences`` [B] still decoding, ``per_sentence`` each; None once none is forced."""
    if prefixes is None or step >= prefixes.size(1):
        return None
    return prefixes[sentences, step].repeat_interleave(per_sentence)  # [B] -> [B*K]


@dataclass
class _Kept:
    """The ``nbest`` best finished hypotheses of each sentence still decoding, best first."""

    norm: Tensor  # [B, M] length-normalised scores, -inf where none
    raw: Tensor  # [B, M] log-probabilities
    tokens: Tensor  # [B, M, t'] ending in EOS, PAD after a shorter one's EOS (t' <= the step)

    @staticmethod
    def empty(b: int, nbest: int, device: torch.device) -> _Kept:
        return _Kept(torch.full((b, nbest), NEG_INF, device=device),
                     torch.full((b, nbest), NEG_INF, device=device),
                     torch.full((b, nbest, 0), PAD, dtype=torch.long, device=device))

    def merged(self, cand: Tensor, ends: Tensor | None, rows: Tensor, history: Tensor, step: int,
               alpha: float, kind: str) -> _Kept:
        """These and the candidates that end at ``step`` (``ends``), normalised (lp of
        ``kind``), the best ``nbest`` kept. cand, ends, rows [B, C] (rows into history [N, step+1]).
        These themselves where none ends (most steps): their tokens are padded when one does."""
        if ends is None or not bool(ends.any()):
            return self
        b, nbest = self.norm.shape
        new_norm = torch.where(ends, cand / length_penalty(float(step + 1), alpha, kind=kind), NEG_INF)
        norm, pick = merge_finished(self.norm, new_norm)  # [B, M]
        from_new = pick >= nbest
        new_idx = (pick - nbest).clamp(min=0)
        old_idx = pick.clamp(max=nbest - 1)
        raw = torch.where(from_new, cand.gather(1, new_idx), self.raw.gather(1, old_idx))
        new_tok = history[rows.gather(1, new_idx).flatten(), 1:].view(b, nbest, step)  # [B, M, t] no BOS
        new_tok = F.pad(new_tok, (0, 1), value=EOS)  # [B, M, t+1]
        old_tok = F.pad(self.tokens, (0, step + 1 - self.tokens.size(2)), value=PAD)  # [B, M, t+1]
        old_tok = old_tok.gather(1, old_idx.unsqueeze(-1).expand_as(old_tok))
        return _Kept(norm, raw, torch.where(from_new.unsqueeze(-1), new_tok, old_tok))

    def select(self, keep: Tensor) -> _Kept:
        """The sentences ``keep`` [B'] only."""
        return _Kept(self.norm[keep], self.raw[keep], self.tokens[keep])

    def hypotheses(self, i: int) -> list[Hypothesis]:
        """Sentence ``i``'s hypotheses, best first."""
        out = []
        for toks, lp, score in zip(self.tokens[i].tolist(), self.raw[i].tolist(), self.norm[i].tolist()):
            if score == NEG_INF:
                continue
            out.append(Hypothesis(toks[: toks.index(EOS)], lp, score))
        return out


def _going_on(go_on: Tensor, cand: Tensor, ends: Tensor | None, rows: Tensor,
              token: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The live hypotheses: the candidates ``go_on`` [B, K] picks of cand, ends (None:
    none ends), rows and token [B, C], as their scores (-inf where one ends), rows and tokens [B, K]."""
    scores = cand.gather(1, go_on)
    if ends is not None:
        scores = scores.masked_fill(ends.gather(1, go_on), NEG_INF)
    return scores, rows.gather(1, go_on), token.gather(1, go_on)


def _candidates(total: Tensor, k: int, required: RequiredState | None, columns: Columns = ALL
                ) -> StepCandidates:
    """The candidates of a step, best first: their scores, the hypotheses they extend (rows
    of total's first two dimensions flattened), their tokens (target ids: total's last
    dimension holds ``columns``), which end (None where none does), and the K that go on
    (indices into them); with required phrases, chosen by dynamic beam allocation
    (:mod:`seqtrans.decoding.lexical`).
    total [B, K, V] -> [B, C] x 4, [B, K]"""
    sentence = torch.arange(total.size(0), device=total.device).unsqueeze(1) * k  # [B, 1]
    if required is None:
        cand, src_beam, column = top_candidates(total)
        token = columns.tokens(column)
        ends, go_on = _finished(cand, token, k)
        return cand, sentence + src_beam, token, ends, go_on
    constrained = torch.tensor([banks > 1 for banks in required.banks], device=total.device)  # [B]
    cand, src_beam, token, met = constrained_candidates(total, required, constrained=constrained)
    ends = token.eq(EOS) & torch.isfinite(cand)
    return cand, sentence + src_beam, token, ends, dynamic_beam(cand, ends, met, required.banks, k)


def _start_required(required: Sequence[Phrases], rows: Tensor, *, beam: int,
                    max_len: Tensor) -> RequiredState | None:
    """The progress state of the hypotheses ``rows`` [N] (their sources) on the required
    phrases of their sources; None when no source has any. ValueError naming the source
    whose phrases the search cannot take."""
    if not any(required):
        return None
    if len(required) != max_len.numel():
        raise ValueError(f"required phrases for {len(required)} sources, but {max_len.numel()} sources")
    for b, phrases in enumerate(required):
        problem = required_problem(phrases, beam=beam, max_len=int(max_len[b]))
        if problem is not None:
            raise ValueError(f"source {b}: {problem}")
    return RequiredState(required, rows)


def _finished(cand: Tensor, token: Tensor, beam: int) -> tuple[Tensor | None, Tensor]:
    """:func:`split_finished`, with ``ends`` None where no candidate ends (most steps):
    then nothing is merged into the finished hypotheses or masked among the live ones."""
    ends, go_on, any_end = split_finished(cand, token, beam)
    return (ends if any_end else None), go_on


def _within_beam(ends: Tensor, k: int) -> Tensor:
    """``ends`` [B, C] only where the candidate ranks among the K best of its step."""
    return ends & (torch.arange(ends.size(1), device=ends.device) < k)


@torch.inference_mode()
def beam_search(model: SearchModel, src: Tensor, *, beam: int, alpha: float, max_len: Tensor,
                min_len: int = 0, nbest: int = 1, length_penalty: str = "gnmt", end_in_beam: bool = False,
                constraint: Constraint | None = None, no_repeat_ngram_size: int = 0,
                prefixes: Tensor | None = None, banned: Sequence[Phrases] = (),
                required: Sequence[Phrases] = (), given: int = 0,
                cancelled: Cancelled | None = None) -> list[list[Hypothesis]]:
    """The ``nbest`` best outputs of each source by ``log P(Y|X) / lp(Y)`` (lp of the
    form ``length_penalty``, :func:`~seqtrans.decoding.search.length_penalty`). With
    ``end_in_beam``, only an end symbol among the K best candidates of a step ends a
    hypothesis (as fairseq and transformers do).

    src [B, S] (PAD-padded, each ending in EOS); max_len [B]: the most tokens each output may have
    before its end symbol (``min_len``: the fewest, where the maximum allows; ``no_repeat_ngram_size``:
    no n-gram of that many tokens twice). ``prefixes`` [B, P] (PAD-padded target ids) are forced: each
    output starts with its source's, scored by the model, not searched, but for the first ``given``,
    read and not scored (:func:`_read_given`); ``max_len`` must leave room for them. No output of
    source b contains a phrase of ``banned[b]`` (target ids; empty: no such rule), and every output of
    source b contains each phrase of ``required[b]`` (as many times as it is given there;
    :mod:`seqtrans.decoding.lexical`), searched with dynamic beam allocation: ValueError where the
    beam or ``max_len`` is smaller than the phrases' tokens. A sentence stops as soon as no live
    hypothesis can beat its n-th finished one, which never changes the result, or once ``cancelled``
    says so (:data:`Cancelled`).
    """
    rules = Rules(min_len=min_len, no_repeat_ngram_size=no_repeat_ngram_size, banned=banned)
    model.eval()
    b0, k, device = src.size(0), beam, src.device
    max_len, prefixes = max_len.to(device), (None if prefixes is None else prefixes.to(device))
    longest = int(max_len.max())
    state = model.start(model.encode(src), beam=k, capacity=longest + 1)
    columns = columns_of(state)
    sent_of_row = torch.arange(b0, device=device).repeat_interleave(k)  # [N]
    limit = max_len[sent_of_row]  # [N]
    soonest, penalty = int(limit.min()), longest_penalty(max_len + 1, alpha, kind=length_penalty)  # renewed
    constrained = start_constraint(constraint, sent_of_row) if constraint is not None else None
    lexical = _start_required(required, sent_of_row, beam=k, max_len=max_len)
    followers = [f for f in (constrained, lexical) if f is not None]  # they follow the beam as the state does
    history, scores, kept, active = _start_beams(b0, k, nbest, device)
    history = _read_given(model, state, history, prefixes, given, sent_of_row, followers)
    results: list[list[Hypothesis]] = [[] for _ in range(b0)]
    for step in range(given, longest + 1):
        with teams.step(model, len(active) * k, device):  # a small step's team: speed only
            cand, rows_c, token, ends, go_on = _step_candidates(
                model, history, state, step, first=step == given, beam=k, prefix=scores.view(-1),
                limit=limit, soonest=soonest, rules=rules, constraint=constrained, required=lexical,
                columns=columns, forced=_forced_at(prefixes, step, active, k),
                sources=active.repeat_interleave(k) if rules.banned else None)
            finished = _within_beam(ends, k) if end_in_beam and ends is not None else ends
            kept = kept.merged(cand, finished, rows_c, history, step, alpha, length_penalty)
            scores, rows, next_tok = _going_on(go_on, cand, ends, rows_c, token)  # [B, K] each
            keep = _retire(_done(scores, kept, penalty, cancelled, active), active, kept, results)
            if keep is not None:
                if keep.numel() == 0:
                    break
                active, scores, rows, next_tok = (t[keep] for t in (active, scores, rows, next_tok))
                kept = kept.select(keep)
                limit = max_len[active].repeat_interleave(k)
                soonest, penalty = int(limit.min()), longest_penalty(max_len[active] + 1, alpha,
                                                                     kind=length_penalty)
            history = _follow(history, rows, next_tok, keep, state, followers)
    return results


def columns_of(state: SearchState) -> Columns:
    """Which target ids the columns of the model's scores are: a state may cover only some
    (``columns``, ``vocabulary_size``: a vocabulary shortlist), else the whole vocabulary."""
    ids = getattr(state, "columns", None)
    if ids is None:
        return ALL
    return Columns(ids, size=state.vocabulary_size, normalized=state.normalized)  # type: ignore[attr-defined]


def _start_beams(b: int, k: int, nbest: int, device: torch.device) -> tuple[Tensor, Tensor, _Kept, Tensor]:
    """A new search: the tokens so far (BOS) [B*K, 1], the scores [B, K] (one live
    hypothesis per sentence), no finished hypotheses, and the original index of each
    sentence still decoding [B]. The tokens grow by one column a step, so that following
    the beam copies only the prefixes, not room for the longest output."""
    history = torch.full((b * k, 1), BOS, dtype=torch.long, device=device)
    scores = torch.full((b, k), NEG_INF, device=device)
    scores[:, 0] = 0.0
    return history, scores, _Kept.empty(b, nbest, device), torch.arange(b, device=device)


def _read_given(model: SearchModel, state: SearchState, history: Tensor, prefixes: Tensor | None, given: int,
               sentence_of_row: Tensor, followers: Sequence[ConstraintState | RequiredState]) -> Tensor:
    """The first ``given`` tokens of every source's prefix ``prefixes`` [B, P] read into the
    decoder ``state`` and the ``followers`` and appended to ``history`` [N, t] (each row's
    source in ``sentence_of_row`` [N]): tokens given, not chosen, so unscored, and the model
    is not asked for the scores that would follow them (a 256,206-word product for NLLB).
    This is how transformers forces a family's first token (``forced_bos_token_id``): every
    other token's score -inf, so its own log-probability counts 0. The new history [N, t+given]."""
    if given == 0:
        return history
    if prefixes is None or prefixes.size(1) < given or bool(prefixes[:, :given].eq(PAD).any()):
        raise ValueError(f"{given} given tokens, but not every source has a prefix of that many")
    for step in range(given):
        advance(model, history[:, -1:], state)  # what the given token follows
        token = prefixes[sentence_of_row, step]  # [N]
        history = torch.cat([history, token.unsqueeze(1)], dim=1)
        for follower in followers:
            follower.advance(token)
    return history


def _done(scores: Tensor, kept: _Kept, penalty: Tensor | float, cancelled: Cancelled | None,
          active: Tensor) -> Tensor:
    """[B] the sentences whose live hypotheses (``scores`` [B, K]) cannot beat their kept
    n-th best (``penalty``: of each one's longest output), that have none live, or that
    ``cancelled`` stops."""
    best = scores.max(dim=1).values  # [B]
    return (beyond_reach(best, kept.norm[:, -1], penalty) | ~torch.isfinite(scores).any(dim=1)
            | _cancelled(cancelled, active))


def _retire(done: Tensor, active: Tensor, kept: _Kept, results: list[list[Hypothesis]]) -> Tensor | None:
    """Record the results of the sentences ``done`` [B] (of the original indices
    ``active``); the positions of those still decoding, or None when none is done."""
    if not bool(done.any()):
        return None
    for i in done.nonzero().flatten().tolist():
        results[int(active[i])] = kept.hypotheses(i)
    return (~done).nonzero().flatten()


def _follow(history: Tensor, rows: Tensor, next_tok: Tensor, keep: Tensor | None, state: SearchState,
            followers: Sequence[ConstraintState | RequiredState]) -> Tensor:
    """Everything per hypothesis follows the beam: ``rows`` [B', K] index the previous
    step's hypotheses (of the sentences ``keep`` still decoding); the decoder state
    reorders, the followers (constraint states) also take the new tokens. The new
    history [N', t+2]."""
    flat_rows = rows.flatten()  # [N']
    history = torch.cat([history.index_select(0, flat_rows), next_tok.view(-1, 1)], dim=1)
    state.reorder(flat_rows, keep)
    for follower in followers:
        follower.reorder(flat_rows, keep)
        follower.advance(next_tok.flatten())
    return history


Choose = Callable[[Tensor, int, Tensor], "tuple[Tensor, Tensor]"]


@torch.inference_mode()
def greedy_search(model: SearchModel, src: Tensor, *, max_len: Tensor, min_len: int = 0,
                  constraint: Constraint | None = None, no_repeat_ngram_size: int = 0,
                  prefixes: Tensor | None = None, banned: Sequence[Sequence[Sequence[int]]] = (),
                  given: int = 0, cancelled: Cancelled | None = None) -> list[list[Hypothesis]]:
    """The most probable next token at every step, until the end symbol or ``max_len``;
    ``prefixes``, ``banned``, ``given`` and ``cancelled`` as in :func:`beam_search` (a
    cancelled source gets no output)."""

    def most_probable(log_probs: Tensor, step: int, rows: Tensor) -> tuple[Tensor, Tensor]:
        return log_probs.max(dim=1)

    return _one_path(model, src, max_len=max_len, constraint=constraint, choose=most_probable,
                     rules=Rules(min_len=min_len, no_repeat_ngram_size=no_repeat_ngram_size, banned=banned),
                     prefixes=prefixes, given=given, cancelled=cancelled)


@torch.inference_mode()
def sample_search(model: SearchModel, src: Tensor, *, max_len: Tensor, uniforms: Tensor,
                  truncation: Truncation, min_len: int = 0, constraint: Constraint | None = None,
                  no_repeat_ngram_size: int = 0, prefixes: Tensor | None = None,
                  banned: Sequence[Sequence[Sequence[int]]] = (), given: int = 0,
                  cancelled: Cancelled | None = None) -> list[list[Hypothesis]]:
    """One sample per source: at every step a token drawn from the model's distribution,
    reshaped by ``truncation``, with the source's own uniform numbers ``uniforms``
    [B, L+1] (one per step; :func:`~seqtrans.decoding.sampling.input_uniforms`). The
    log-probability reported is the model's, before truncation. ``prefixes``, ``banned``,
    ``given`` and ``cancelled`` as in :func:`beam_search` (a cancelled source gets no output)."""

    uniforms = uniforms.to(src.device)

    def sampled(log_probs: Tensor, step: int, rows: Tensor) -> tuple[Tensor, Tensor]:
        token = sample(log_probs, truncation, uniforms[rows, step])  # [B']
        return log_probs.gather(1, token.unsqueeze(1)).squeeze(1), token  # [B', 1] -> [B']

    return _one_path(model, src, max_len=max_len, constraint=constraint, choose=sampled,
                     rules=Rules(min_len=min_len, no_repeat_ngram_size=no_repeat_ngram_size, banned=banned),
                     prefixes=prefixes, given=given, cancelled=cancelled)


def _one_path(model: SearchModel, src: Tensor, *, max_len: Tensor, rules: Rules,
              constraint: Constraint | None, choose: Choose, prefixes: Tensor | None, given: int,
              cancelled: Cancelled | None) -> list[list[Hypothesis]]:
    """One hypothesis per source, extended at every step by the token ``choose``
    (log_probs [B', V] or over the model's columns, step, rows [B']: each row's source in
    ``src``) picks: its log-probability and its column, each [B']."""
    model.eval()
    b0, device = src.size(0), src.device
    max_len, prefixes = max_len.to(device), (None if prefixes is None else prefixes.to(device))
    longest = int(max_len.max())
    state = model.start(model.encode(src), beam=1, capacity=longest + 1)
    columns = columns_of(state)
    history = torch.full((b0, longest + 2), PAD, dtype=torch.long, device=device)  # [B, L+2]
    history[:, 0] = BOS
    total = torch.zeros(b0, device=device)
    zeros = torch.zeros(b0, device=device)
    active = torch.arange(b0, device=device)
    limit = max_len
    constrained = start_constraint(constraint, active) if constraint is not None else None
    read = _read_given(model, state, history[:, :1], prefixes, given, active,
                       [] if constrained is None else [constrained])
    history[:, : given + 1] = read
    results: list[list[Hypothesis]] = [[] for _ in range(b0)]
    for step in range(given, longest + 1):
        with teams.step(model, active.numel(), device):
            log_probs = _extended_scores(_next_logits(model, history[:, : step + 1], state),
                                         history[:, : step + 1], step,
                                         prefix=zeros[: active.numel()], limit=limit, rules=rules,
                                         constraint=constrained, forced=_forced_at(prefixes, step, active, 1),
                                         sources=active, columns=columns)
            best, column = choose(log_probs, step, active)  # [B]
            token = columns.tokens(column)
            total = total + best
            history[:, step + 1] = token
            if constrained is not None:
                constrained.advance(token)
            done = token.eq(EOS) | ~torch.isfinite(best) | _cancelled(cancelled, active)
            if not bool(done.any()):
                continue
            for i in done.nonzero().flatten().tolist():
                toks = history[i, 1 : step + 2].tolist()
                ended = toks[-1] == EOS
                score = float(total[i])
                results[int(active[i])] = [Hypothesis(toks[:-1], score, score)] if ended else []
            keep = (~done).nonzero().flatten()
            if keep.numel() == 0:
                break
            active, history, total, limit = active[keep], history[keep], total[keep], limit[keep]
            state.reorder(keep, keep)
            if constrained is not None:
                constrained.reorder(keep, keep)
    return results
