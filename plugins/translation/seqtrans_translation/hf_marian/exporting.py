"""A trained seqtrans translation model written as a Hugging Face Marian model directory
that ``MarianMTModel.from_pretrained`` and ``MarianTokenizer.from_pretrained`` load.

The vocabulary keeps seqtrans's ids: ``<pad>`` 0 pads sources, ``<s>`` 1 starts the
decoder (``decoder_start_token_id``), ``</s>`` 2 ends, ``<unk>`` 3; the generation
config forbids emitting ``<pad>`` and ``<s>``, as seqtrans's search does. A model with
one shared sentencepiece model writes it as both source.spm and target.spm.

Marian computes its sinusoids with the sines first; a model whose sinusoids interleave
(the paper's layout, seqtrans's default) is written with the coordinates of its
residual stream permuted into that order, which every layer follows exactly (each
linear map reads or writes those coordinates, LayerNorm treats them alike). What the
format cannot hold is refused before anything is written, naming the setting
(:func:`unsupported`).

Shapes: V vocabulary, D d_model, F d_ff.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from seqtrans.plugin import BOS, EOS, PAD, ConfigError, ModelConfig, UsageError, new_directory
from seqtrans_translation.hf_marian.importing import (
    CONFIG,
    GENERATION_CONFIG,
    SOURCE_SPM,
    TARGET_SPM,
    TOKENIZER_CONFIG,
    VOCAB,
)
from seqtrans_translation.hf_marian.tensors import SAFETENSORS, write_safetensors
from seqtrans_translation.pretrained import PretrainedCodec
from seqtrans_translation.task import TranslationCodec

if TYPE_CHECKING:
    from seqtrans import Loaded

ACTIVATION_NAMES = {"relu": "relu", "gelu": "gelu", "silu": "swish"}


def unsupported(config: ModelConfig) -> list[tuple[str, str]]:
    """The settings of ``config`` the Marian format cannot hold, as (config key, why)."""
    problems = []
    for key in ("encoder_attention", "decoder_attention", "cross_attention"):
        name = getattr(config, key)
        if name != "scaled_dot":
            problems.append(
                (
                    f"model.{key}",
                    f"'{name}' attention: the Marian format holds scaled dot-product attention only",
                )
            )
    if config.causal_encoder:
        problems.append(("model.causal_encoder", "Marian's encoder is bidirectional"))
    if config.wait_k:
        problems.append(("model.wait_k", "Marian's encoder-decoder attention has no wait-k mask"))
    if config.norm != "post":
        problems.append(("model.norm", "Marian's layers are post-norm, without final LayerNorms"))
    if config.positions != "sinusoidal":
        problems.append(("model.positions", "Marian's positions are sinusoidal and not stored"))
    if config.embedding_norm:
        problems.append(("model.embedding_norm", "Marian has no LayerNorm on its embeddings"))
    if config.activation not in ACTIVATION_NAMES:
        problems.append(("model.activation", f"this export writes {', '.join(ACTIVATION_NAMES)} only"))
    if config.gated_ffn:
        problems.append(("model.gated_ffn", "Marian's feed-forward layers have no gate"))
    if config.norm_kind != "layer" or config.norm_eps != 1e-5:
        key = "model.norm_kind" if config.norm_kind != "layer" else "model.norm_eps"
        problems.append((key, "Marian's layers hold LayerNorms of epsilon 1e-5"))
    if not config.bias:
        problems.append(("model.bias", "Marian's attention and feed-forward layers have biases"))
    if not config.attention_scale:
        problems.append(("model.attention_scale", "Marian divides its attention logits by sqrt(d_k)"))
    if config.head_dim:
        problems.append(("model.head_dim", "Marian's heads are d_model / heads wide"))
    if config.scale_output:
        problems.append(("model.scale_output", "Marian does not scale the decoder's output"))
    return problems


def _permutation(c: ModelConfig) -> Tensor | None:
    """The order of residual coordinates that puts interleaved sinusoids' sines first;
    None when they already are.  -> [D]"""
    if c.sinusoid_layout == "split":
        return None
    return torch.cat([torch.arange(0, c.d_model, 2), torch.arange(1, c.d_model, 2)])


def weights(state: dict[str, Tensor], c: ModelConfig) -> dict[str, Tensor]:
    """Marian's tensors of a seqtrans state dict, the residual stream permuted where needed."""
    perm = _permutation(c)

    def cols(t: Tensor) -> Tensor:  # a map that reads the residual stream
        return (t if perm is None else t[:, perm]).contiguous()

    def rows(t: Tensor) -> Tensor:  # a map (or a vector) that writes it
        return (t if perm is None else t[perm]).contiguous()

    out: dict[str, Tensor] = {}
    vocab = state["target_embed.weight"].size(0)
    out["model.shared.weight"] = cols(state["target_embed.weight"])  # [V, D]
    if not c.tie_output:
        out["lm_head.weight"] = cols(state["output.weight"])
        # transformers ties the encoder's and decoder's embeddings to the shared matrix only
        # when it ties the output projection too: the copies are written out
        for side in ("encoder", "decoder"):
            out[f"model.{side}.embed_tokens.weight"] = out["model.shared.weight"].clone()
    bias = state.get("output_bias", torch.zeros(vocab))
    out["final_logits_bias"] = bias.reshape(1, vocab).contiguous()

    def attention(ours: str, theirs: str, parts: tuple[str, ...], weight: str) -> None:
        w = state[f"{ours}.{weight}.weight"].chunk(len(parts))
        b = state[f"{ours}.{weight}.bias"].chunk(len(parts))
        for part, wp, bp in zip(parts, w, b):
            out[f"{theirs}.{part}_proj.weight"] = cols(wp)
            out[f"{theirs}.{part}_proj.bias"] = bp.contiguous()

    def linear_out(ours: str, theirs: str) -> None:
        out[f"{theirs}.weight"] = rows(state[f"{ours}.weight"])
        out[f"{theirs}.bias"] = rows(state[f"{ours}.bias"])

    def norm(ours: str, theirs: str) -> None:
        out[f"{theirs}.weight"] = rows(state[f"{ours}.weight"])
        out[f"{theirs}.bias"] = rows(state[f"{ours}.bias"])

    def ffn(ours: str, theirs: str) -> None:
        out[f"{theirs}.fc1.weight"] = cols(state[f"{ours}.ffn.inner.weight"])
        out[f"{theirs}.fc1.bias"] = state[f"{ours}.ffn.inner.bias"].contiguous()
        linear_out(f"{ours}.ffn.outer", f"{theirs}.fc2")

    for side, layers in (("encoder", c.encoder_layers), ("decoder", c.decoder_layers)):
        for i in range(layers):
            ours, theirs = f"{side}.{i}", f"model.{side}.layers.{i}"
            attention(f"{ours}.self_attn", f"{theirs}.self_attn", ("q", "k", "v"), "qkv")
            linear_out(f"{ours}.self_attn.out", f"{theirs}.self_attn.out_proj")
            norm(f"{ours}.r1.norm", f"{theirs}.self_attn_layer_norm")
            last = "r2"
            if side == "decoder":  # the encoder-decoder attention sits between the two
                attention(f"{ours}.cross_attn", f"{theirs}.encoder_attn", ("q",), "q")
                attention(f"{ours}.cross_attn", f"{theirs}.encoder_attn", ("k", "v"), "kv")
                linear_out(f"{ours}.cross_attn.out", f"{theirs}.encoder_attn.out_proj")
                norm(f"{ours}.r2.norm", f"{theirs}.encoder_attn_layer_norm")
                last = "r3"
            ffn(ours, theirs)
            norm(f"{ours}.{last}.norm", f"{theirs}.final_layer_norm")
    return {name: t.detach().float().cpu() for name, t in out.items()}


def marian_config(c: ModelConfig, vocab_size: int) -> dict[str, Any]:
    return {
        "model_type": "marian",
        "architectures": ["MarianMTModel"],
        "dtype": "float32",
        "vocab_size": vocab_size,
        "decoder_vocab_size": vocab_size,
        "d_model": c.d_model,
        "encoder_layers": c.encoder_layers,
        "decoder_layers": c.decoder_layers,
        "encoder_attention_heads": c.heads,
        "decoder_attention_heads": c.heads,
        "encoder_ffn_dim": c.d_ff,
        "decoder_ffn_dim": c.d_ff,
        "activation_function": ACTIVATION_NAMES[c.activation],
        "scale_embedding": c.scale_embeddings,
        "max_position_embeddings": c.max_positions,
        "dropout": c.dropout,
        "attention_dropout": c.attention_dropout,
        "activation_dropout": c.activation_dropout,
        "pad_token_id": PAD,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "decoder_start_token_id": BOS,
        "forced_eos_token_id": EOS,
        "share_encoder_decoder_embeddings": True,
        "tie_word_embeddings": c.tie_output,
        "is_encoder_decoder": True,
    }


def export_marian(loaded: Loaded, *, out: Path) -> Path:
    """Write ``loaded`` (a translation run) as the Marian model directory ``out``, whole or
    not at all; what the format cannot hold is a :class:`ConfigError` naming the setting."""
    if loaded.config.task != "translation":
        raise UsageError(f"hf-marian holds translation models; this run is of task '{loaded.config.task}'")
    c = loaded.model.config
    problems = unsupported(c)
    if problems:
        key, why = problems[0]
        raise ConfigError(key, f"cannot export to hf-marian: {why}")
    loaded.model.check_supported("export")
    codec = loaded.codec
    if isinstance(codec, PretrainedCodec):
        source, target = codec.source.model, codec.target.model
    elif isinstance(codec, TranslationCodec):
        source = target = codec.subwords.model
    else:
        raise UsageError(f"hf-marian cannot write the vocabulary of a {type(codec).__name__}")
    symbols = codec.vocabularies.target.symbols
    data = loaded.config.data
    tensors = weights(loaded.model.state_dict(), c)
    with new_directory(out) as scratch:
        write_safetensors(scratch / SAFETENSORS, tensors)
        (scratch / CONFIG).write_text(json.dumps(marian_config(c, len(symbols)), indent=2), encoding="utf-8")
        generation = {
            "decoder_start_token_id": BOS,
            "bos_token_id": BOS,
            "eos_token_id": EOS,
            "pad_token_id": PAD,
            "forced_eos_token_id": EOS,
            "bad_words_ids": [[PAD], [BOS]],
            "num_beams": loaded.config.decode.beam,
            "max_length": c.max_positions,
        }
        (scratch / GENERATION_CONFIG).write_text(json.dumps(generation, indent=2), encoding="utf-8")
        (scratch / SOURCE_SPM).write_bytes(source)
        (scratch / TARGET_SPM).write_bytes(target)
        (scratch / VOCAB).write_text(
            json.dumps({s: i for i, s in enumerate(symbols)}, ensure_ascii=False), encoding="utf-8"
        )
        tokenizer = {
            "tokenizer_class": "MarianTokenizer",
            "source_lang": data.source_lang,
            "target_lang": data.target_lang,
            "separate_vocabs": False,
            "model_max_length": c.max_positions,
            "unk_token": "<unk>",
            "eos_token": "</s>",
            "pad_token": "<pad>",
        }
        (scratch / TOKENIZER_CONFIG).write_text(json.dumps(tokenizer, indent=2), encoding="utf-8")
    return out
