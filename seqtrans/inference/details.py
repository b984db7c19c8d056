"""What decoded outputs are made of, computed after decoding and only when asked for:
the log-probability of each token, and source-target word alignments from the
encoder-decoder attention. Both come from one teacher-forced pass over the outputs, so
decoding itself does no extra work when they are not asked for.

Shapes: B pairs, S source tokens (the end symbol last), T target tokens (the end symbol
last), V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from seqtrans.config import DecodeConfig
from seqtrans.data.batches import pad_batch
from seqtrans.data.vocab import BOS
from seqtrans.decoding.alignment import layer_weights, word_alignment
from seqtrans.decoding.ensemble import Ensemble, members
from seqtrans.decoding.generate import length_batches
from seqtrans.decoding.search import Hypothesis
from seqtrans.inference.scoring import token_log_probs
from seqtrans.model.transformer import Transformer, attention_maps
from seqtrans.tasks.protocol import Codec, TokenWords


def with_token_log_probs(model: Transformer | Ensemble, sources: Sequence[list[int]],
                         hyps: Sequence[list[Hypothesis]], *, decode: DecodeConfig,
                         device: torch.device, given: int = 0) -> list[list[Hypothesis]]:
    """``hyps`` (of the sources' ids, ending in EOS) with ``token_log_probs`` filled in:
    each token's log-probability and the end symbol's, by teacher forcing under the same
    model (an ensemble's combined distribution) at ``decode.precision``; the first ``given``
    tokens 0, as the search counts them (a family's forced first token)."""
    pairs = [(i, h) for i, nbest in enumerate(hyps) for h in nbest]
    scores = token_log_probs(model, [sources[i] for i, _ in pairs], [h.tokens for _, h in pairs],
                             batch_tokens=decode.batch_tokens, device=device, precision=decode.precision,
                             given=given)
    out: list[list[Hypothesis]] = [[] for _ in hyps]
    for (i, h), row in zip(pairs, scores):
        out[i].append(replace(h, token_log_probs=tuple(row)))
    return out


@torch.inference_mode()
def attention_weights(model: Transformer | Ensemble, sources: Sequence[list[int]],
                      targets: Sequence[list[int]], *, layer: int | None, device: torch.device,
                      batch_tokens: int) -> list[Tensor]:
    """For each pair (source ids ending in EOS, target ids without BOS or EOS), the
    weight each target token and the end symbol gives each source token: decoder layer
    ``layer`` (from 1) or the mean of all layers, heads averaged, and for an ensemble
    the mean of its members.  -> [T, S] per pair, on the CPU"""
    out: list[Tensor] = [torch.empty(0, 0) for _ in sources]
    lengths = [max(len(s), len(t) + 1) for s, t in zip(sources, targets)]
    for idx in length_batches(lengths, batch_tokens):
        src = pad_batch([sources[i] for i in idx]).to(device)  # [B, S]
        tgt_in = pad_batch([targets[i] for i in idx], before=BOS).to(device)  # [B, T]
        weights = torch.stack([layer_weights(attention_maps(m.eval(), src, tgt_in).cross, layer=layer)
                               for m in members(model)]).mean(dim=0).cpu()  # [M, B, T, S] -> [B, T, S]
        for b, i in enumerate(idx):
            out[i] = weights[b, : len(targets[i]) + 1, : len(sources[i])]  # [T, S] without padding
    return out


def word_alignments(codec: Codec[Any, Any, Any], source: Any, tokens: list[int],
                    weights: Tensor) -> list[tuple[int, int]]:
    """The (source word, target word) pairs of one output (target ids ``tokens``) from its
    ``weights`` [T, S], words as the codec groups tokens (:class:`TokenWords`; else each
    token is a word)."""
    source_tokens = codec.source_tokens(source)
    target_tokens = codec.vocabularies.target.decode(tokens)
    if isinstance(codec, TokenWords):
        source_words, target_words = codec.source_words(source_tokens), codec.target_words(target_tokens)
    else:
        source_words, target_words = list(range(len(source_tokens))), list(range(len(target_tokens)))
    return word_alignment(weights, source_words=source_words, target_words=target_words)
