"""The one mask convention: bool tensors, True where a query may attend to a key.

Every mask in seqtrans is built here. Shapes: B batch, S source, T target.
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(tokens: Tensor, pad: int) -> Tensor:
    """True at real tokens.  [B, S] -> [B, S]"""
    return tokens.ne(pad)


def causal_mask(queries: int, keys: int, *, device: torch.device | None = None) -> Tensor:
    """True where query i may see key j: j <= i + (keys - queries).  -> [T_q, T_k]

    With ``keys > queries`` the queries are the last ``queries`` positions of a longer
    sequence (incremental decoding with a cache).
    """
    offset = keys - queries
    q = torch.arange(queries, device=device).unsqueeze(1)  # [T_q, 1]
    k = torch.arange(keys, device=device).unsqueeze(0)  # [1, T_k]
    return k <= q + offset


def key_mask(mask: Tensor) -> Tensor:
    """A key padding mask shaped for attention over heads and queries.  [B, S] -> [B, 1, 1, S]"""
    return mask[:, None, None, :]


def additive_mask(bias: Tensor, allowed: Tensor | None) -> Tensor:
    """An additive float mask for attention logits: ``bias`` where ``allowed`` (a bool
    mask as above), -inf elsewhere; ``bias`` itself where every key is allowed.
    bias [1|N, H, T, L], allowed broadcastable to it -> [N|1, H, T, L]"""
    if allowed is None:
        return bias
    return torch.where(allowed, bias, torch.tensor(float("-inf"), dtype=bias.dtype, device=bias.device))
