"""The decoder step with static shapes, for CUDA graphs and ``torch.compile``, against eager.

What the GPU suite's ``step_graphs`` part measures; not the library's decoding path.

``Transformer.decode`` grows its key/value caches by one position a step, so every step
has a new shape and a graph of it would be captured anew each time. :class:`StaticStep`
computes the same next-token logits from the same weights with fixed shapes instead:
keys and values written into buffers of ``capacity`` positions at a position held in a
tensor, and attention over a bucket of them (the smallest of :data:`BUCKETS` that holds
the positions so far, the rest masked). One graph per bucket then serves every step.

:func:`compare` decodes greedily, exactly ``out_len`` tokens, three ways: the library's
eager ``decode`` with its caches (the reference), the static step run eagerly, and the
static step under a runner (a CUDA graph per bucket, or ``torch.compile``), and reports
whether the tokens agree, how far the logits are apart and the time per step of each.

Shapes: N rows (sentences), H heads, C capacity, L a bucket's positions, d = D/H, V vocabulary.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor
from torch._dynamo.utils import counters

from seqtrans.attention.scaled_dot import CrossAttention, CrossState, SelfAttention, merge_heads, split_heads
from seqtrans.data.vocab import BOS
from seqtrans.model.transformer import Transformer

BUCKETS = (16, 32, 64, 128, 256, 512)

Step = Callable[[Tensor, Tensor, int], Tensor]  # (tokens [N, 1], position [1], bucket) -> logits [N, V]


def bucket_of(position: int) -> int:
    """The smallest bucket that holds positions 0 .. ``position``."""
    for size in BUCKETS:
        if position < size:
            return size
    raise ValueError(f"position {position} is beyond the largest bucket, {BUCKETS[-1]}")


class StaticStep:
    """One decoding step of ``model`` over ``src`` with every tensor's shape fixed by the
    bucket alone. Only plain scaled dot-product attention, without extensions."""

    def __init__(self, model: Transformer, src: Tensor, *, capacity: int) -> None:
        self.attns: list[SelfAttention] = []
        for layer in model.decoder_layers:
            attn = layer.self_attn
            if type(attn) is not SelfAttention or type(layer.cross_attn) is not CrossAttention:
                raise ValueError("the static step has plain scaled dot-product attention only")
            self.attns.append(attn)
        if model.named_extensions():
            raise ValueError("the static step has no model extensions")
        self.model = model
        encoded = model.encode(src)
        # CrossAttention's states (checked above)
        self.cross = [cast(CrossState, layer.cross_attn.prepare(encoded.memory, encoded.mask))
                      for layer in model.decoder_layers]
        rows, like = src.size(0), encoded.memory
        attn = self.attns[0]
        shape = (rows, attn.heads, capacity, attn.out.in_features // attn.heads)  # [N, H, C, d]
        # zeros, not empty: a masked position's value still meets a zero weight, and 0 * NaN is NaN
        self.keys = [like.new_zeros(shape) for _ in model.decoder_layers]
        self.values = [like.new_zeros(shape) for _ in model.decoder_layers]
        self.positions = model.positions(capacity, offset=0, device=like.device).to(like.dtype)  # [C, D]
        self.slots = torch.arange(capacity, device=like.device)  # [C]

    def tensors(self) -> list[Tensor]:
        """The tensors every step reads at the same addresses (besides the model's own)."""
        cross = [t for state in self.cross for t in (state.k, state.v, state.mask) if t is not None]
        return [*self.keys, *self.values, *cross, self.positions, self.slots]

    def __call__(self, tokens: Tensor, position: Tensor, bucket: int) -> Tensor:
        """tokens [N, 1], position [1] (a tensor, so that a graph serves every step) -> logits [N, V]"""
        model = self.model
        x = model.target_embed(tokens) * model.scale + self.positions.index_select(0, position)  # [N, 1, D]
        if model.embedding_norm is not None:
            x = model.embedding_norm(x)
        visible = (self.slots[:bucket] <= position).view(1, 1, 1, bucket)  # [1, 1, 1, L]
        for layer, attn, cross, keys, values in zip(model.decoder_layers, self.attns, self.cross, self.keys,
                                                    self.values):
            h = layer.r1.input(x)
            q, k, v = (split_heads(t, attn.heads) for t in attn.qkv(h).chunk(3, dim=-1))  # [N, H, 1, d]
            keys.index_copy_(2, position, k)
            values.index_copy_(2, position, v)
            out = F.scaled_dot_product_attention(q, keys[:, :, :bucket], values[:, :, :bucket],
                                                 attn_mask=visible)  # [N, H, 1, d]
            x = layer.r1(x, attn.out(merge_heads(out)))
            x = layer.r2(x, layer.cross_attn(layer.r2.input(x), cross))
            x = layer.r3(x, layer.ffn(layer.r3.input(x)))
        logits = F.linear(model.decoder_norm(x)[:, 0], model.output_weight)  # [N, V]
        return logits if model.output_bias is None else logits + model.output_bias


class CudaGraphs:
    """The step captured as one CUDA graph per bucket, at the bucket's first step; inputs
    are copied into the graph's own tensors before each replay."""

    def __init__(self, step: StaticStep, rows: int, device: torch.device) -> None:
        self.step = step
        self.tokens = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, Tensor]] = {}

    def __call__(self, tokens: Tensor, position: Tensor, bucket: int) -> Tensor:
        self.tokens.copy_(tokens)
        self.position.copy_(position)
        if bucket not in self.graphs:
            # warm up on a side stream, as capture requires; it writes the position the replay rewrites
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    self.step(self.tokens, self.position, bucket)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # a pool of its own: graphs sharing one must replay in order
                out = self.step(self.tokens, self.position, bucket)
            self.graphs[bucket] = (graph, out)
        graph, out = self.graphs[bucket]
        graph.replay()
        return out.clone()  # the next replay overwrites the graph's output


def compiled(step: StaticStep, device: torch.device, *, backend: str = "inductor") -> Step:
    """``torch.compile`` of the step; on CUDA with inductor, ``mode="reduce-overhead"`` (CUDA
    graphs made by the compiler). One graph per bucket: the bucket is a Python integer,
    the position a tensor."""
    graphs = device.type == "cuda" and backend == "inductor"
    # each call compiles afresh: earlier steps' graphs would count against the recompile limit,
    # past which the step silently runs eagerly
    torch._dynamo.reset()
    if graphs:  # else the caches, updated in place, stop the graphs, and the rest is copied every step
        for tensor in step.tensors():
            torch._dynamo.mark_static_address(tensor)
    fn: Step = torch.compile(step.__call__, backend=backend, mode="reduce-overhead" if graphs else None,
                             dynamic=False)
    if not graphs:
        return fn

    def call(tokens: Tensor, position: Tensor, bucket: int) -> Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return fn(tokens, position, bucket).clone()  # the next replay overwrites the output

    return call


def greedy(step: Step, rows: int, out_len: int, device: torch.device) -> tuple[Tensor, Tensor, float]:
    """``out_len`` greedy steps from BOS: tokens [N, out_len], logits [N, out_len, V] and the
    median seconds of a step (not counting the first step of each bucket, which captures or
    compiles; the median, as torch.compile records its CUDA graphs a step or two later)."""
    tokens = torch.full((rows, 1), BOS, dtype=torch.long, device=device)
    out, logits, seconds = [], [], []
    seen: set[int] = set()
    for t in range(out_len):
        bucket = bucket_of(t)
        position = torch.tensor([t], device=device)
        _sync(device)
        start = time.perf_counter()
        step_logits = step(tokens, position, bucket)
        _sync(device)
        if bucket in seen:
            seconds.append(time.perf_counter() - start)
        seen.add(bucket)
        tokens = step_logits.argmax(-1, keepdim=True)  # [N, 1]
        out.append(tokens)
        logits.append(step_logits)
    return torch.cat(out, 1), torch.stack(logits, 1), statistics.median(seconds) if seconds else 0.0


def reference(model: Transformer, src: Tensor, out_len: int) -> tuple[Tensor, Tensor, float]:
    """The same greedy decoding through ``Transformer.decode`` and its growing caches."""
    encoded = model.encode(src)
    state = model.start(encoded, capacity=out_len)
    cache_step: Step = lambda tokens, position, bucket: model.decode(tokens, state=state)[:, 0]  # noqa: E731
    return greedy(cache_step, src.size(0), out_len, src.device)


def compare(model: Transformer, src: Tensor, *, out_len: int, runner: str,
            backend: str = "inductor") -> dict[str, Any]:
    """Greedy decoding of ``src`` [N, S] by the reference, the eager static step and the
    static step under ``runner`` ("cuda_graph" or "compile" with ``backend``), exactly
    ``out_len`` tokens."""
    device = src.device
    capacity = bucket_of(out_len - 1)
    with torch.no_grad():
        ref_tokens, ref_logits, ref_s = reference(model, src, out_len)
        eager_tokens, eager_logits, eager_s = greedy(StaticStep(model, src, capacity=capacity),
                                                     src.size(0), out_len, device)
        step = StaticStep(model, src, capacity=capacity)
        graphs_before = counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"]
        run: Step = (CudaGraphs(step, src.size(0), device) if runner == "cuda_graph"
                     else compiled(step, device, backend=backend))
        started = time.perf_counter()
        graph_tokens, graph_logits, graph_s = greedy(run, src.size(0), out_len, device)
        total = time.perf_counter() - started
    compiler: dict[str, int] = {}
    if runner == "compile":  # how many graphs it made (one per bucket, unless it fell back to eager)
        compiler = {"compiled_graphs": counters["stats"]["unique_graphs"] - graphs_before[0],
                    "cudagraph_skips": counters["inductor"]["cudagraph_skips"] - graphs_before[1]}
    return {
        **compiler,
        "runner": runner, "backend": backend if runner == "compile" else None,
        "rows": src.size(0), "out_len": out_len,
        "buckets": sorted({bucket_of(t) for t in range(out_len)}),
        "tokens_equal": bool(torch.equal(graph_tokens, eager_tokens)
                             and torch.equal(eager_tokens, ref_tokens)),
        "static_eager_tokens_equal_reference": bool(torch.equal(eager_tokens, ref_tokens)),
        "max_abs_logit_diff": float((graph_logits - eager_logits).abs().max()),
        "static_eager_max_abs_logit_diff": float((eager_logits - ref_logits).abs().max()),
        "reference_step_ms": 1e3 * ref_s, "static_eager_step_ms": 1e3 * eager_s,
        f"{runner}_step_ms": 1e3 * graph_s,
        "speedup_over_reference": ref_s / graph_s if graph_s else None,
        "speedup_over_static_eager": eager_s / graph_s if graph_s else None,
        "seconds_with_capture": total,
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
