"""The T5 family of Hugging Face models: ``t5`` (T5 v1.0, v1.1, Flan-T5, ByT5) and ``mt5``.
A pre-norm Transformer with each of seqtrans's model options for it:

| T5 | seqtrans |
|---|---|
| RMSNorm without bias, ``layer_norm_epsilon`` | ``model.norm_kind=rms``, ``model.norm_eps`` |
| relative position bias, kept by each stack's first layer | ``model.positions=relative`` |
| no 1/sqrt(d_kv) on the logits | ``model.attention_scale=false`` |
| ``d_kv`` | ``model.head_dim`` |
| no biases anywhere | ``model.bias=false`` |
| ``feed_forward_proj`` ``relu`` (v1.0) or ``gated-gelu`` | ``model.activation``, ``model.gated_ffn`` |
| unscaled embeddings, shared by both stacks | ``model.scale_embeddings=false`` |
| v1.0's tied head, the decoder output times d_model^-0.5 | ``model.tie_output``, ``model.scale_output`` |

so what remains is a renaming of tensors (:func:`key_map`: self-attention's query, key
and value projections fused into one, encoder-decoder attention's key and value), which
the export reads backwards, and the vocabulary's order (:mod:`.vocabulary`): the decoder
starts from the padding id, which seqtrans's ``<s>`` copies; the output bias that keeps
``<s>`` out is not trained (``model.fixed_output_bias``), T5 having no place for one. A
source is its pieces and ``</s>``, a target too: no prefix. The export writes
``config.json`` back from the options (:func:`config_json`).

The tokenizer: ``tokenizer.json`` where the directory has one (transformers 5 saves T5
tokenizers so), else ``spiece.model`` read with sentencepiece, with the ``extra_ids``
sentinels after its pieces; ByT5 (``ByT5Tokenizer``) has neither: its ids are bytes
(:class:`~seqtrans_translation.hf.codec.ByteTokenizer`).

Whether the head is tied and scaled is read as transformers 5 reads it: the head is
``lm_head.weight`` where the weights hold one that is not the shared matrix, else the
shared matrix; T5 scales the decoder's output where ``config.json`` says
``scale_decoder_outputs`` (else where ``tie_word_embeddings`` is not false), mT5 never.

Shapes: V the model's vocabulary, D d_model, F d_ff, H heads, d d_kv.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

from seqtrans.plugin import ConfigError, DataError, ModelConfig, UsageError, to_dict
from seqtrans_translation.hf.codec import SENTENCEPIECE, TOKENIZER, ByteTokenizer
from seqtrans_translation.hf.directory import Entry, Settings, Weights
from seqtrans_translation.hf.vocabulary import output_tables

MODEL_TYPES = ("t5", "mt5")

# transformers' activation names (ACT2FN) and seqtrans's equivalents
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "silu": "silu", "swish": "silu"}
ADDED_TOKENS = "added_tokens.json"
#: Tensors the import leaves aside: copies of the shared matrix, and a bias table that old
#: checkpoints keep in the first encoder-decoder attention, which transformers ignores too.
IGNORED = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
           "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight")


def _feed_forward(s: Settings) -> tuple[str, bool]:
    """seqtrans's activation and gating of ``feed_forward_proj`` (``ACT`` or ``gated-ACT``),
    as transformers reads it: ``gated-gelu`` is the tanh approximation."""
    proj = s.get("feed_forward_proj", str, "relu")
    parts = proj.split("-")
    gated = len(parts) == 2 and parts[0] == "gated"
    act = "gelu_new" if proj == "gated-gelu" else parts[-1]
    if len(parts) > 2 or (len(parts) == 2 and not gated) or act not in ACTIVATIONS:
        known = ", ".join(sorted(ACTIVATIONS))
        raise s.fail("feed_forward_proj", f"not ACT or gated-ACT with ACT one of {known}")
    return ACTIVATIONS[act], gated


def _head(s: Settings, w: Weights, vocab_size: int) -> tuple[bool, bool]:
    """Whether the output projection is the shared matrix, and whether the decoder's
    output is scaled by d_model^-0.5 before it."""
    tied = True
    if "lm_head.weight" in w:
        d = s.get("d_model", int)
        tied = torch.equal(w.take("lm_head.weight", (vocab_size, d)), w.first_of(EMBEDDINGS, (vocab_size, d)))
    elif s.values.get("tie_word_embeddings") is False:
        raise s.fail("tie_word_embeddings", "is false, but the weights hold no 'lm_head.weight'")
    return tied, _scaled(s)


def _scaled(s: Settings) -> bool:
    """Whether the decoder's output is scaled before the head, as transformers 5 reads it."""
    if s.get("model_type", str) == "mt5":
        return False
    scale = s.values.get("scale_decoder_outputs")
    if scale is None:
        scale = s.values.get("tie_word_embeddings") is not False
    return bool(scale)


def model_config(s: Settings, w: Weights) -> ModelConfig:
    """The seqtrans model of a T5-family ``config.json`` and its weights (which say
    whether the head is tied)."""
    tied, scaled = _head(s, w, s.get("vocab_size", int))
    return _options(s, tied=tied, scaled=scaled)


def _options(s: Settings, *, tied: bool, scaled: bool) -> ModelConfig:
    activation, gated = _feed_forward(s)
    dropout = s.get("dropout_rate", float, 0.1)
    layers = s.get("num_layers", int)
    decoder_layers = s.values.get("num_decoder_layers")
    if s.get("d_kv", int) < 1:  # 0 would be seqtrans's d_model / heads
        raise s.fail("d_kv", "must be at least 1")
    try:
        return ModelConfig(
            encoder_layers=layers,
            decoder_layers=layers if decoder_layers is None else s.get("num_decoder_layers", int),
            d_model=s.get("d_model", int), d_ff=s.get("d_ff", int), heads=s.get("num_heads", int),
            head_dim=s.get("d_kv", int),
            # T5 drops out attention weights and the feed-forward activations at the same rate
            dropout=dropout, attention_dropout=dropout, activation_dropout=dropout,
            norm="pre", norm_kind="rms", norm_eps=s.get("layer_norm_epsilon", float, 1e-6),
            positions="relative", relative_buckets=s.get("relative_attention_num_buckets", int, 32),
            relative_max_distance=s.get("relative_attention_max_distance", int, 128),
            bias=False, attention_scale=False, activation=cast(Any, activation), gated_ffn=gated,
            scale_embeddings=False, embedding_norm=False,
            # zeros, and the absent <s>; kept as they are in fine-tuning, since T5 has no place for a bias
            output_bias=True, fixed_output_bias=True,
            share_embeddings=True, tie_output=tied, scale_output=scaled,
        )
    except ConfigError as exc:
        raise DataError(s.path, None, f"does not make a seqtrans model: {exc}") from None


#: Where the model keeps its shared embedding matrix, by the name it was saved under.
EMBEDDINGS = ("shared.weight", "encoder.embed_tokens.weight")


def key_map(c: ModelConfig) -> list[Entry]:
    """Every tensor of the stacks, by seqtrans's name and the model's (the embeddings and
    the head, whose rows are reordered, are not here). Import and export read it."""
    d, f, h = c.d_model, c.d_ff, c.heads
    inner = h * c.head_width  # H*d
    entries: list[Entry] = []

    def one(ours: str, theirs: str, shape: tuple[int, ...]) -> None:
        entries.append((ours, ((theirs, shape),)))

    def fused(ours: str, theirs: str, parts: str) -> None:
        entries.append((f"{ours}.weight", tuple((f"{theirs}.{p}.weight", (inner, d)) for p in parts)))

    for side, layers in (("encoder", c.encoder_layers), ("decoder", c.decoder_layers)):
        own = "" if side == "encoder" else "decoder_"
        one(f"{own}relative_bias.table.weight",
            f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight", (c.relative_buckets, h))
        one(f"{side}_norm.weight", f"{side}.final_layer_norm.weight", (d,))
        for i in range(layers):
            ours, theirs = f"{side}.{i}", f"{side}.block.{i}.layer"
            fused(f"{ours}.self_attn.qkv", f"{theirs}.0.SelfAttention", "qkv")
            one(f"{ours}.self_attn.out.weight", f"{theirs}.0.SelfAttention.o.weight", (d, inner))
            one(f"{ours}.r1.norm.weight", f"{theirs}.0.layer_norm.weight", (d,))
            last = 1
            if side == "decoder":  # the encoder-decoder attention sits between the two
                one(f"{ours}.cross_attn.q.weight", f"{theirs}.1.EncDecAttention.q.weight", (inner, d))
                fused(f"{ours}.cross_attn.kv", f"{theirs}.1.EncDecAttention", "kv")
                one(f"{ours}.cross_attn.out.weight", f"{theirs}.1.EncDecAttention.o.weight", (d, inner))
                one(f"{ours}.r2.norm.weight", f"{theirs}.1.layer_norm.weight", (d,))
                last = 2
            ffn, dense = f"{ours}.ffn", f"{theirs}.{last}.DenseReluDense"
            if c.gated_ffn:  # wo(act(wi_0 x) * wi_1 x)
                one(f"{ffn}.inner.weight", f"{dense}.wi_0.weight", (f, d))
                one(f"{ffn}.gate.weight", f"{dense}.wi_1.weight", (f, d))
            else:
                one(f"{ffn}.inner.weight", f"{dense}.wi.weight", (f, d))
            one(f"{ffn}.outer.weight", f"{dense}.wo.weight", (d, f))
            one(f"{ours}.r{last + 1}.norm.weight", f"{theirs}.{last}.layer_norm.weight", (d,))
    return entries


def state_dict(w: Weights, c: ModelConfig, order: Tensor, *, vocab_size: int) -> dict[str, Tensor]:
    """seqtrans's weights of a T5-family model's tensors."""
    out = output_tables(w, c, order, embeddings=EMBEDDINGS, vocab_size=vocab_size, bias=None)
    w.taken.update(name for name in IGNORED if name in w)
    for ours, parts in key_map(c):
        out[ours] = w.joined(parts)
    return out


#: Model options that only training reads: a difference in them changes no output.
_TRAINING_ONLY = ("dropout", "attention_dropout", "activation_dropout", "fixed_output_bias")


def config_json(c: ModelConfig, original: dict[str, Any], path: Path) -> dict[str, Any]:
    """The ``config.json`` of a T5-family model with the options ``c``: the one it was
    imported with, its architecture fields written from ``c``. An option that field
    cannot hold is a :class:`UsageError` naming it, found by reading the fields back as
    the import does."""
    kind = original.get("model_type")
    names = {act: name for name, act in ACTIVATIONS.items() if name not in ("gelu_pytorch_tanh", "swish")}
    if c.activation not in names:
        raise UsageError(f"model.activation={c.activation}: the T5 format has no feed_forward_proj for it")
    act = names[c.activation]
    # "gated-gelu" is the tanh approximation: a gated exact GELU reads back otherwise, refused below
    proj = ("gated-gelu" if act in ("gelu", "gelu_new") else f"gated-{act}") if c.gated_ffn else act
    out = {**original, "d_model": c.d_model, "d_kv": c.head_width, "d_ff": c.d_ff, "num_heads": c.heads,
           "num_layers": c.encoder_layers, "num_decoder_layers": c.decoder_layers,
           "relative_attention_num_buckets": c.relative_buckets,
           "relative_attention_max_distance": c.relative_max_distance, "dropout_rate": c.dropout,
           "layer_norm_epsilon": c.norm_eps, "feed_forward_proj": proj}
    out.pop("scale_decoder_outputs", None)
    # transformers 5 reads T5's scaling from tie_word_embeddings (v1.1's false); mT5's never scales
    out["tie_word_embeddings"] = c.scale_output if kind == "t5" else c.tie_output
    read = _options(Settings(out, path), tied=c.tie_output, scaled=_scaled(Settings(out, path)))
    differ = [k for k in to_dict(c) if k not in _TRAINING_ONLY and getattr(read, k) != getattr(c, k)]
    if differ:
        shown = ", ".join(f"model.{k}={getattr(c, k)!r}" for k in differ)
        raise UsageError(f"{shown}: the {kind} format has no place for this (it would read back as "
                         f"{', '.join(f'{k}={getattr(read, k)!r}' for k in differ)})")
    return out


def layout_of(s: Settings, tokenizer_config: Settings, languages: tuple[str, ...],
              ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """No tokens before a source's or a target's pieces (seqtrans adds the end symbol)."""
    return (), ()


def _added_tokens(directory: Path, tokenizer_config: Settings) -> dict[str, int] | None:
    """The tokens a tokenizer adds after its own (content -> id), from
    ``tokenizer_config.json``'s ``added_tokens_decoder`` or ``added_tokens.json``; None
    where neither lists them."""
    listed = tokenizer_config.values.get("added_tokens_decoder")
    if isinstance(listed, dict):
        out = {}
        for key, token in listed.items():
            content = token.get("content") if isinstance(token, dict) else None
            if not (isinstance(content, str) and str(key).isdigit()):
                raise tokenizer_config.fail("added_tokens_decoder", f"entry {key!r} is not an id and a token")
            out[content] = int(key)
        return out
    path = directory / ADDED_TOKENS
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DataError(path, None, f"not JSON: {exc}") from None
        if not isinstance(data, dict) or not all(isinstance(i, int) for i in data.values()):
            raise DataError(path, None, "not a map of tokens to ids")
        return {str(t): int(i) for t, i in data.items()}
    return None


def _sentinels(directory: Path, tokenizer_config: Settings) -> dict[str, int]:
    """T5's ``extra_ids`` sentinels after a sentencepiece model's pieces, ``<extra_id_0>``
    last, as transformers numbers them."""
    added = _added_tokens(directory, tokenizer_config)
    if added is not None:
        return added
    import sentencepiece as spm

    model = spm.SentencePieceProcessor()
    model.LoadFromSerializedProto((directory / SENTENCEPIECE).read_bytes())
    size, extra = model.get_piece_size(), tokenizer_config.get("extra_ids", int, 100)
    return {f"<extra_id_{i}>": size + extra - 1 - i for i in range(extra)}


def _byte_sentinels(directory: Path, tokenizer_config: Settings) -> dict[str, int]:
    """ByT5's ``extra_ids`` sentinels after the 256 bytes, ``<extra_id_0>`` first, as
    transformers numbers them."""
    added = _added_tokens(directory, tokenizer_config)
    if added is None:
        first = ByteTokenizer.OFFSET + 256
        added = {f"<extra_id_{i}>": first + i for i in range(tokenizer_config.get("extra_ids", int, 125))}
    return {t: i for t, i in added.items() if t not in ByteTokenizer.SPECIALS}


def tokenizer_of(directory: Path, s: Settings, tokenizer_config: Settings,
                 ) -> tuple[str, bytes, dict[str, int]]:
    """The kind of a T5-family directory's tokenizer, its file's bytes and the tokens it
    adds after its own: ``tokenizer.json``, else ``spiece.model``, else ByT5's bytes
    (``tokenizer_class`` ``ByT5Tokenizer`` in ``tokenizer_config.json`` or ``config.json``)."""
    if (directory / TOKENIZER).is_file():
        return "tokenizers", (directory / TOKENIZER).read_bytes(), {}
    if (directory / SENTENCEPIECE).is_file():
        data = (directory / SENTENCEPIECE).read_bytes()
        return "sentencepiece", data, _sentinels(directory, tokenizer_config)
    if "ByT5Tokenizer" in (tokenizer_config.values.get("tokenizer_class"), s.values.get("tokenizer_class")):
        return "bytes", b"", _byte_sentinels(directory, tokenizer_config)
    raise DataError(directory / TOKENIZER, None,
                    f"missing: a T5 model's tokenizer is read from its {TOKENIZER} or {SENTENCEPIECE} "
                    "(ByT5's config names ByT5Tokenizer, which has no file)")
