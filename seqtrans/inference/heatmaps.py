"""Pictures of a trained model's attention for one input: ``seqtrans attention RUN_DIR "input"``.
Needs matplotlib (``pip install seqtrans[plot]``).

The input is decoded (or a given target taken) and run through the model once more,
teacher-forced, asking for its attention weights (:func:`~seqtrans.model.transformer.attention_maps`).
One PNG per stack: ``encoder.png`` (self-attention), ``decoder.png`` (causal
self-attention) and ``cross.png`` (encoder-decoder attention), each a grid of layers
(rows) by heads (columns), tokens as tick labels. A row of a decoder map is the step that
writes the token it is labelled with; its columns are what that step attends to (source
tokens, or the decoder's inputs, ``<s>`` first). Memory attention's ``cross.png`` shows,
per layer, the weights of each step over the K contexts and each context's weights over
the source; monotonic attention's the expected alignment with the hard alignment marked.

Shapes: S source, T target (with the end symbol), H heads, M memory slots.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from seqtrans.attention.maps import AttentionMaps, HeadMonotonicWeights, MemoryWeights, MonotonicWeights
from seqtrans.data.batches import source_ids, too_long
from seqtrans.data.vocab import BOS, EOS, UNK
from seqtrans.errors import DataError, UsageError
from seqtrans.inference.loading import Loaded
from seqtrans.model.transformer import attention_maps
from seqtrans.runtime import atomic

#: Longest source or target drawn: beyond it the tick labels cannot be read.
MAX_TOKENS = 100


@dataclass(frozen=True)
class Attended:
    """One input's attention maps (batch of one) with the tokens to label them."""

    source: list[str]  # S source tokens, the end symbol last
    inputs: list[str]  # T decoder inputs: <s> y_1 .. y_n
    outputs: list[str]  # T tokens written: y_1 .. y_n </s>
    maps: AttentionMaps


def attend(loaded: Loaded, line: str, *, target: str | None = None) -> Attended:
    """The attention of ``loaded``'s model on the input ``line``, teacher-forced on its
    own decoding (the run's decoding settings) or on ``target``: the target's tokens
    separated by spaces, as in the model's target vocabulary (subword pieces for a subword
    task)."""
    if not line.strip():
        raise UsageError("the input is empty")
    codec, model = loaded.codec, loaded.model
    source = loaded.task.parse_source(line)
    problem = too_long(model.config, codec, source)
    if problem is not None:
        raise DataError("<input>", None, problem)
    src = source_ids(codec, source)
    if len(src) > MAX_TOKENS:
        raise UsageError(f"the input has {len(src)} tokens (with the end symbol); at most {MAX_TOKENS} "
                         "can be drawn legibly")
    vocab = codec.vocabularies.target
    if target is None:
        _, hyps = loaded.decode([source])
        out = hyps[0][0].tokens if hyps[0] else []
    else:
        pieces = target.split()
        unknown = [p for p in pieces if vocab.index(p) == UNK]
        if unknown:
            shown = ", ".join(map(repr, unknown[:10]))
            raise UsageError(f"--target: not in the model's target vocabulary: {shown}")
        out = vocab.encode(pieces)
    if len(out) + 1 > MAX_TOKENS:
        raise UsageError(f"the output has {len(out) + 1} tokens (with the end symbol); at most {MAX_TOKENS} "
                         "can be drawn legibly")
    device = loaded.device
    tgt_in = torch.tensor([[BOS, *out]], device=device)
    maps = attention_maps(model, torch.tensor([src], device=device), tgt_in)
    names, symbols = codec.vocabularies.source.symbols, vocab.symbols
    return Attended([names[i] for i in src], [symbols[i] for i in [BOS, *out]],
                    [symbols[i] for i in [*out, EOS]], _cpu(maps))


def draw(attended: Attended, out_dir: str | Path, *, layers: Sequence[int] | None = None) -> list[Path]:
    """Write ``encoder.png``, ``decoder.png`` and ``cross.png`` under ``out_dir`` for the
    layers numbered ``layers`` (from 1, in each stack that has them; default all). A stack
    with none of them is not drawn."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError("seqtrans attention needs matplotlib: pip install 'seqtrans[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    maps, out = attended.maps, Path(out_dir)
    deepest = max(len(maps.encoder), len(maps.decoder))
    if layers is not None and not all(1 <= n <= deepest for n in layers):
        raise UsageError(f"--layers: the model has {len(maps.encoder)} encoder and {len(maps.decoder)} "
                         f"decoder layers, not {', '.join(str(n) for n in layers if not 1 <= n <= deepest)}")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, stack, rows, cols in (("encoder", maps.encoder, attended.source, attended.source),
                                    ("decoder", maps.decoder, attended.outputs, attended.inputs)):
        chosen = _layers(layers, len(stack))
        if chosen:
            fig = _grid(plt, [(i, stack[i][0]) for i in chosen], rows, cols, f"{name} self-attention")
            written.append(_save(plt, fig, out / f"{name}.png"))
    # monotonic multihead attention: the attention each head pays, as other multi-head mechanisms
    cross = [(i, w.attention if isinstance(w, HeadMonotonicWeights) else w)
             for i, w in ((i, maps.cross[i]) for i in _layers(layers, len(maps.cross)))]
    if not cross:
        return written
    first = cross[0][1]
    if isinstance(first, MemoryWeights):
        fig = _memory(plt, cross, attended)
    elif isinstance(first, MonotonicWeights):
        fig = _monotonic(plt, cross, attended)
    else:
        fig = _grid(plt, [(i, w[0]) for i, w in cross if isinstance(w, Tensor)], attended.outputs,
                    attended.source, "encoder-decoder attention")
    written.append(_save(plt, fig, out / "cross.png"))
    return written


def _layers(layers: Sequence[int] | None, count: int) -> list[int]:
    """The indices of the layers numbered ``layers`` that a stack of ``count`` has."""
    if layers is None:
        return list(range(count))
    return sorted({n - 1 for n in layers if n <= count})


def _cpu(maps: AttentionMaps) -> AttentionMaps:
    def move(w: Any) -> Any:
        if isinstance(w, MemoryWeights):
            return MemoryWeights(w.contexts.float().cpu(), w.source.float().cpu())
        if isinstance(w, MonotonicWeights):
            return MonotonicWeights(w.positions.cpu(), w.expected.float().cpu())
        if isinstance(w, HeadMonotonicWeights):
            return HeadMonotonicWeights(w.positions.cpu(), w.expected.float().cpu(),
                                        w.probabilities.float().cpu(), w.attention.float().cpu())
        return w.float().cpu()

    return AttentionMaps([move(w) for w in maps.encoder], [move(w) for w in maps.decoder],
                         [move(w) for w in maps.cross])


def _size(tokens: int) -> float:
    """Inches per panel side, so that tick labels stay readable."""
    return max(2.2, 0.16 * tokens + 0.8)


def _heatmap(ax: Any, weights: Tensor, rows: Sequence[str] | None, cols: Sequence[str] | None,
             title: str) -> Any:
    # each panel's own scale, as in the papers' figures: its largest weight is black
    top = float(weights.max()) if weights.numel() else 1.0
    image = ax.imshow(weights.numpy(), cmap="Greys", vmin=0.0, vmax=top if top > 0 else 1.0,
                      aspect="auto", interpolation="nearest")
    ax.set_title(title, fontsize=8)
    for labels, ticks, set_labels in ((rows, ax.set_yticks, ax.set_yticklabels),
                                      (cols, ax.set_xticks, ax.set_xticklabels)):
        if labels is None:
            ticks([])
            continue
        ticks(range(len(labels)))
        set_labels(labels, fontsize=6, rotation=90 if set_labels == ax.set_xticklabels else 0)
    return image


def _grid(plt: Any, layers: list[tuple[int, Tensor]], rows: Sequence[str], cols: Sequence[str],
          title: str) -> Any:
    """layers: (index, weights [H, rows, cols]) -> a figure of layers x heads."""
    heads = max((w.size(0) for _, w in layers), default=1)
    width, height = _size(len(cols)), _size(len(rows))
    count = max(len(layers), 1)
    fig, axes = plt.subplots(count, heads, figsize=(width * heads, height * count), squeeze=False,
                             constrained_layout=True)
    for r, (layer, weights) in enumerate(layers):
        for h in range(heads):
            _heatmap(axes[r][h], weights[h], rows if h == 0 else None, cols,
                     f"layer {layer + 1}, head {h + 1}")
    fig.suptitle(title, fontsize=10)
    return fig


def _memory(plt: Any, layers: list[tuple[int, Any]], attended: Attended) -> Any:
    """Per layer: beta [T, M] (each step over the contexts) and alpha [M, S] (each context
    over the source), as in Britz et al.'s figure 8."""
    slots = layers[0][1].contexts.size(-1)
    fig, axes = plt.subplots(len(layers), 2, squeeze=False, constrained_layout=True,
                             figsize=(_size(slots) + _size(len(attended.source)) + 1,
                                      max(_size(len(attended.outputs)), _size(slots)) * len(layers)))
    contexts = [str(k + 1) for k in range(slots)]
    for r, (layer, w) in enumerate(layers):
        _heatmap(axes[r][0], w.contexts[0], attended.outputs, contexts,
                 f"layer {layer + 1}: step over context")
        _heatmap(axes[r][1], w.source[0], contexts, attended.source,
                 f"layer {layer + 1}: context over source")
    fig.suptitle("memory attention", fontsize=10)
    return fig


def _monotonic(plt: Any, layers: list[tuple[int, Any]], attended: Attended) -> Any:
    """Per layer: the expected alignment [T, S], the hard alignment marked (a step that
    attends to nothing is not marked)."""
    s, t = len(attended.source), len(attended.outputs)
    fig, axes = plt.subplots(1, len(layers), squeeze=False, constrained_layout=True,
                             figsize=(_size(s) * len(layers), _size(t) + 0.4))
    for c, (layer, w) in enumerate(layers):
        ax = axes[0][c]
        positions = w.positions[0].tolist()
        steps = [i for i, p in enumerate(positions) if p < s]
        title = f"layer {layer + 1}" + ("" if steps else " (hard: attends to nothing)")
        _heatmap(ax, w.expected[0], attended.outputs, attended.source, title)
        ax.scatter([positions[i] for i in steps], steps, marker="o", s=14, facecolors="none",
                   edgecolors="tab:red", linewidths=1.0)
    fig.suptitle("monotonic attention: expected alignment,\nhard alignment circled", fontsize=9)
    return fig


def _save(plt: Any, fig: Any, path: Path) -> Path:
    with atomic.replacing(path) as f:
        fig.savefig(f, format="png", dpi=80)
    plt.close(fig)
    return path
