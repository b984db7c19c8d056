"""The self-attention caches of decoding: the keys and values of the target tokens decoded
so far, which the search reorders as it keeps and drops hypotheses.

:class:`KVCache` copies the keys and values of the rows kept; :class:`BeamKVCache`
never copies them and keeps, per position, which row wrote it, read by the native
kernel (:func:`seqtrans.native.beam_attention`). :func:`new_cache` chooses.

Shapes: N rows (hypotheses), H heads, L cached target positions, T new ones, d = D/H.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Self-attention keys and values of the tokens decoded so far, preallocated.

    Each step appends the new tokens' keys and values in place; :meth:`reorder`
    follows the search when it reorders or drops hypotheses. Reordering gathers into a
    second buffer of the same size, kept for the next step, and swaps the two: one copy
    of the positions in use, and no fresh allocation (whose page faults cost more than
    the copy) per step.
    """

    def __init__(self, rows: int, heads: int, head_dim: int, capacity: int, *,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (rows, heads, capacity, head_dim)  # [N, H, L_max, d]
        self._k = torch.empty(shape, dtype=dtype, device=device)
        self._v = torch.empty(shape, dtype=dtype, device=device)
        self._spare: tuple[Tensor, Tensor] | None = None  # the other buffers, made at the first reorder
        self.rows = rows  # hypotheses in use: the first rows of the buffers
        self.length = 0
        self.beam = 1  # hypotheses per sentence, in consecutive rows (set by Transformer.start)

    @property
    def k(self) -> Tensor:
        """[N, H, L_max, d]: the keys of the rows in use (positions past ``length`` unset)."""
        return self._k[: self.rows]

    @property
    def v(self) -> Tensor:
        return self._v[: self.rows]

    def _reserve(self, end: int) -> None:
        """Room for ``end`` positions: grown when a caller planned fewer (rare; callers size it right)."""
        if end <= self._k.size(2):
            return
        n, h, capacity, d = self._k.shape
        grow = max(end, 2 * capacity) - capacity
        self._k = torch.cat([self._k, self._k.new_empty(n, h, grow, d)], dim=2)
        self._v = torch.cat([self._v, self._v.new_empty(n, h, grow, d)], dim=2)
        self._spare = None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store [N, H, T, d] keys and values; return all of them so far, [N, H, L+T, d]."""
        start, end = self.length, self.length + k.size(2)
        self._reserve(end)
        keys, values = self.k, self.v
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        self.length = end
        return keys[:, :, :end], values[:, :, :end]

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep hypotheses ``rows`` [N'] (indices into the current rows), in that order."""
        if self._spare is None:
            self._spare = (torch.empty_like(self._k), torch.empty_like(self._v))
        used, n = self.length, rows.numel()
        spare_k, spare_v = self._spare
        # only the positions in use are copied; N' <= N rows fit in the spare's first rows
        torch.index_select(self.k[:, :, :used], 0, rows, out=spare_k[:n, :, :used])
        torch.index_select(self.v[:, :, :used], 0, rows, out=spare_v[:n, :, :used])
        self._spare = (self._k, self._v)
        self._k, self._v = spare_k, spare_v
        self.rows = n


class BeamKVCache(KVCache):
    """A :class:`KVCache` that the search never copies: the keys and values of position s
    stay in the buffer row that wrote them at step s, and each hypothesis keeps, per
    position, which row that was (``sources`` [N, L_max]). Following the beam copies
    these indices (8 bytes a position) instead of the keys and values (4 bytes x 2 x
    d_model a position). Every step writes hypothesis i's new position to row i: that
    position is unused in every row, so a finished sentence's rows need no compacting.
    Attention reads through the indices: :meth:`attend` with the native kernel
    (:func:`seqtrans.native.beam_attention`) for one new query per hypothesis, else
    :meth:`append`, which gathers them. For float32 decoding on the CPU
    (:meth:`SelfAttention.new_cache`).
    """

    def __init__(self, rows: int, heads: int, head_dim: int, capacity: int, *,
                 dtype: torch.dtype, device: torch.device) -> None:
        super().__init__(rows, heads, head_dim, capacity, dtype=dtype, device=device)
        self.sources = torch.empty(rows, capacity, dtype=torch.long, device=device)  # [N, L_max]
        self._spare_sources: Tensor | None = None
        self._own = torch.arange(rows, device=device).unsqueeze(1)  # [N, 1] row i writes to row i

    def _reserve(self, end: int) -> None:
        super()._reserve(end)
        grow = self._k.size(2) - self.sources.size(1)
        if grow > 0:
            more = self.sources.new_empty(self.sources.size(0), grow)
            self.sources = torch.cat([self.sources, more], dim=1)
            self._spare_sources = None

    def store(self, k: Tensor, v: Tensor) -> None:
        """Store [N, H, T, d] keys and values of the next T positions."""
        start, end = self.length, self.length + k.size(2)
        self._reserve(end)
        n = self.rows
        self._k[:n, :, start:end] = k
        self._v[:n, :, start:end] = v
        self.sources[:n, start:end] = self._own[:n]
        self.length = end

    def gathered(self) -> tuple[Tensor, Tensor]:
        """Every hypothesis's keys and values so far, [N, H, L, d] each (a copy)."""
        positions = torch.arange(self.length, device=self._k.device)
        rows = self.sources[: self.rows, : self.length]  # [N, L]
        # [N, L] rows and [L] positions around the head axis -> [N, L, H, d]
        return (self._k[rows, :, positions].transpose(1, 2), self._v[rows, :, positions].transpose(1, 2))

    @property
    def k(self) -> Tensor:
        """[N, H, L, d]: every hypothesis's keys so far (gathered: a copy)."""
        return self.gathered()[0]

    @property
    def v(self) -> Tensor:
        return self.gathered()[1]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.store(k, v)
        return self.gathered()

    def attend(self, q: Tensor, *, scale: float | None = None, bias: Tensor | None = None) -> Tensor:
        """Softmax attention of one new query per hypothesis, q [N, H, 1, d], over all
        positions stored so far (:meth:`store` them first), its logits multiplied by
        ``scale`` (None: 1/sqrt(d)) and ``bias`` [H, L] added (the same for every
        hypothesis: a relative position bias) -> [N, H, 1, d]."""
        from seqtrans.native import beam_attention_unchecked

        # the rows are the cache's own, each a row it wrote: no need to check them at every step
        out = beam_attention_unchecked(q.squeeze(2).contiguous(), self._k, self._v, self.sources[: self.rows],
                                       self.length, group=self.beam, scale=scale,
                                       bias=None if bias is None else bias.contiguous())
        return out.unsqueeze(2)

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep hypotheses ``rows`` [N'] (indices into the current ones), in that order."""
        n = rows.numel()
        if self._spare_sources is None:
            self._spare_sources = torch.empty_like(self.sources)
        spare = self._spare_sources
        torch.index_select(self.sources[: self.rows, : self.length], 0, rows, out=spare[:n, : self.length])
        self._spare_sources, self.sources = self.sources, spare
        self.rows = n


def new_cache(rows: int, heads: int, head_dim: int, capacity: int, *, like: Tensor) -> KVCache:
    """A cache for ``rows`` hypotheses: one the beam never copies where its attention
    has a native kernel (float32 on a CPU), else a :class:`KVCache`. One row too, so
    that a sentence alone goes through the kernel that sums it in a batch."""
    kind = KVCache
    if like.device.type == "cpu" and like.dtype == torch.float32:
        from seqtrans import native

        if native.available():
            kind = BeamKVCache
    return kind(rows, heads, head_dim, capacity, dtype=like.dtype, device=like.device)
