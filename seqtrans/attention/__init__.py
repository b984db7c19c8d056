"""Attention mechanisms, one module per family.

Each engine attention site takes a module with the call signature of its family:
self-attention ``forward(x, mask=..., causal=..., cache=...)`` and encoder-decoder
attention ``prepare(memory, mask) -> state`` then ``forward(x, state)``. Per-sentence
or per-hypothesis decoding state implements ``reorder(rows, sentences)``.
"""

from seqtrans.attention.scaled_dot import CrossAttention, CrossState, KVCache, SelfAttention

__all__ = ["CrossAttention", "CrossState", "KVCache", "SelfAttention"]
