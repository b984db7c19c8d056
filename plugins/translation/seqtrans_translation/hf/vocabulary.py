"""A Hugging Face model's ids as seqtrans symbols.

seqtrans's four special symbols have fixed ids (``<pad>`` 0, ``<s>`` 1, ``</s>`` 2,
``<unk>`` 3), and every seqtrans decoder starts from ``<s>``. A Hugging Face model has
its own ids for padding, the end and unknown words, and starts its decoder from a
token of its own (``</s>`` for BART, mBART, M2M-100 and NLLB, ``<pad>`` for T5). So:

- ``<pad>``, ``</s>`` and ``<unk>`` take the rows of the model's padding, end and
  unknown tokens;
- ``<s>`` takes the row of the model's decoder start token: a second copy of that row,
  whose output logit is :data:`ABSENT_LOGIT`, so that decoding never emits it and the
  log-probabilities of every other symbol are the model's;
- every other id of the model, in its order, follows as a symbol of its own: its token
  string, or ``<hf:ID>`` where that string is a seqtrans special, empty, holds white
  space or names two ids (the model's own ``<s>``, byte tokens); ids of the embedding
  matrix that no token has (its padding to a round size) are kept as ``<hf:ID>`` too,
  so that the softmax spans what the model's spans.

Shapes: V the model's vocabulary (rows of its embedding matrix).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from seqtrans.plugin import BOS, SPECIALS, Vocab

if TYPE_CHECKING:  # torch is imported where tensors are made: listing the tasks loads no torch
    from torch import Tensor

    from seqtrans.plugin import ModelConfig
    from seqtrans_translation.hf.directory import Weights

#: The logits bias of a symbol the model does not have as an output: e^-100 of the mass
#: of any real symbol, nothing in float32, yet finite, so that label smoothing still has
#: a finite mean when the model is fine-tuned.
ABSENT_LOGIT = -100.0


@dataclass(frozen=True)
class IdMap:
    """seqtrans's vocabulary of a model and, for each seqtrans id, the model's id whose
    rows it takes (``hf_ids``); the model's id of each of its tokens' symbols (``by_symbol``)."""

    vocab: Vocab
    hf_ids: tuple[int, ...]  # [V + 1]: seqtrans id -> model id
    # the two lookups, made once: a model's vocabulary may hold 256,206 symbols
    _symbol: dict[int, str] = field(init=False, repr=False, compare=False)
    _hf_id: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        symbol: dict[int, str] = {}
        for ours, theirs in enumerate(self.hf_ids):
            if ours != BOS:  # <s> repeats the decoder start's row; the id's own symbol names it
                symbol.setdefault(theirs, self.vocab.symbols[ours])
        object.__setattr__(self, "_symbol", symbol)
        object.__setattr__(self, "_hf_id", {s: self.hf_ids[i] for i, s in enumerate(self.vocab.symbols)})

    @property
    def order(self) -> Tensor:
        """The model's row for each seqtrans id.  -> [V + 1]"""
        import torch

        return torch.tensor(self.hf_ids)

    def symbols_of(self, ids: Sequence[int]) -> list[str]:
        """The seqtrans symbols of model ids."""
        return [self._symbol[i] for i in ids]

    def ids_of(self, symbols: Sequence[str]) -> list[int]:
        """The model ids of seqtrans symbols (``<s>`` gives the decoder start's id)."""
        return [self._hf_id[s] for s in symbols]


def id_map(tokens: Mapping[int, str], *, size: int, pad: int, eos: int, unk: int, start: int) -> IdMap:
    """The :class:`IdMap` of a model with ``size`` embedding rows whose tokens are
    ``tokens`` (id -> string) and whose padding, end, unknown and decoder start ids are
    given."""
    roles = {pad: "<pad>", eos: "</s>", unk: "<unk>"}
    symbols = list(SPECIALS)
    hf_ids = [pad, start, eos, unk]
    seen = set(SPECIALS)
    counts: dict[str, int] = {}
    for text in tokens.values():
        counts[text] = counts.get(text, 0) + 1
    for i in range(size):
        if i in roles:
            continue
        token = tokens.get(i)
        if (token is None or token in seen or counts.get(token, 0) > 1 or not token
                or any(c.isspace() for c in token)):
            symbol = f"<hf:{i}>"
        else:
            symbol = token
        seen.add(symbol)
        symbols.append(symbol)
        hf_ids.append(i)
    return IdMap(Vocab(symbols), tuple(hf_ids))


def rows(table: Tensor, order: Tensor) -> Tensor:
    """The rows of a model's table [V, ...] in seqtrans's order.  -> [V + 1, ...]"""
    return table.index_select(0, order)


def logits_bias(bias: Tensor | None, order: Tensor) -> Tensor:
    """The output bias in seqtrans's order: the model's (zeros where it has none), with
    :data:`ABSENT_LOGIT` for ``<s>``, which the model never emits.  [V] -> [V + 1]"""
    import torch

    out = torch.zeros(order.numel()) if bias is None else rows(bias.float(), order).clone()
    out[BOS] = ABSENT_LOGIT
    return out


def output_tables(w: Weights, c: ModelConfig, order: Tensor, *, embeddings: Sequence[str], vocab_size: int,
                  bias: Tensor | None) -> dict[str, Tensor]:
    """seqtrans's shared embedding table, its untied output rows (``lm_head``) and its
    output bias, in seqtrans's order, from the model's tensors: ``embeddings`` the names
    the shared matrix may be saved under, ``bias`` [V] the model's or None."""
    out: dict[str, Tensor] = {}
    table = (vocab_size, c.d_model)  # [V, D], in seqtrans's order [V + 1, D]
    out["source_embed.weight"] = out["target_embed.weight"] = w.rows(tuple(embeddings), table, order)
    if not c.tie_output:
        out["output.weight"] = w.rows(("lm_head.weight",), table, order)
    out["output_bias"] = logits_bias(bias, order)
    return out
