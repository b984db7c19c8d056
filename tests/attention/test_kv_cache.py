"""The self-attention cache against a plain list of each hypothesis's keys and values."""

from __future__ import annotations

import torch

from seqtrans.attention.cache import KVCache


def test_appends_reorders_drops_and_grows_like_per_row_lists() -> None:
    gen = torch.Generator().manual_seed(0)
    rows, heads, dim = 6, 2, 3
    cache = KVCache(rows, heads, dim, capacity=4, dtype=torch.float32, device=torch.device("cpu"))
    ref: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(rows)]  # per row: (k, v) a step
    # reorders that permute, repeat a row, drop rows (sentences finished), and run past the capacity
    plans = [torch.tensor([5, 4, 3, 2, 1, 0]), torch.tensor([0, 0, 2, 2, 4, 1]), torch.tensor([3, 1, 0]),
             torch.tensor([2, 2, 0]), torch.tensor([1]), torch.tensor([0])]
    for plan in plans:
        n = len(ref)
        k = torch.randn(n, heads, 1, dim, generator=gen)
        v = torch.randn(n, heads, 1, dim, generator=gen)
        keys, values = cache.append(k, v)
        for i in range(n):
            ref[i].append((k[i], v[i]))
        want_k = torch.stack([torch.cat([kk for kk, _ in r], dim=1) for r in ref])
        want_v = torch.stack([torch.cat([vv for _, vv in r], dim=1) for r in ref])
        assert torch.equal(keys, want_k) and torch.equal(values, want_v)
        cache.reorder(plan)
        ref = [list(ref[int(i)]) for i in plan]
        assert cache.k.size(0) == len(ref) == cache.rows
    keys, values = cache.k[:, :, : cache.length], cache.v[:, :, : cache.length]
    assert torch.equal(keys, torch.stack([torch.cat([kk for kk, _ in r], dim=1) for r in ref]))
    assert torch.equal(values, torch.stack([torch.cat([vv for _, vv in r], dim=1) for r in ref]))
