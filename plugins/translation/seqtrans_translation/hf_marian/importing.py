"""A Hugging Face Marian model directory (OPUS-MT and the like) read as a seqtrans
translation run.

Every difference of Marian's architecture from the paper's model is an ordinary model
option (docs/pretrained.md): SiLU or GELU feed-forward layers (``model.activation``),
sinusoids with the sines first (``model.sinusoid_layout=split``), the output logits
bias (``model.output_bias``), unscaled embeddings where the model has them
(``model.scale_embeddings``), post-norm residuals. What remains is a renaming of
tensors and a reordering of the vocabulary:

- seqtrans's four special symbols have fixed ids (``<pad>`` 0, ``<s>`` 1, ``</s>`` 2,
  ``<unk>`` 3). Marian's ``<pad>`` is both source padding and the decoder's start
  symbol; padding is masked in both toolkits, so only its start role matters, and its
  embedding row becomes that of ``<s>``, the start symbol of every seqtrans decoder.
  ``</s>`` and ``<unk>`` keep their names; every other symbol follows in Marian's order.
  A model whose ``decoder_start_token_id`` is a ``<s>`` of its own (as seqtrans exports)
  keeps ``<pad>`` and ``<s>`` in their roles.
- In the first case seqtrans's ``<pad>`` has no Marian counterpart: its embedding row
  is zero and its logits bias :data:`ABSENT_LOGIT`, so that it takes no probability
  (decoding never emits it in any case) and the log-probabilities of every other symbol
  are Marian's.
- Self-attention's query, key and value projections are fused into one, and
  encoder-decoder attention's key and value projections; the position table is not
  stored (both toolkits compute it).

Shapes: V vocabulary, D d_model, F d_ff.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

from seqtrans.plugin import (
    SPECIALS,
    ConfigError,
    DataError,
    ModelConfig,
    RunConfig,
    Vocab,
    from_dict,
    merge,
    to_dict,
    write_run,
)
from seqtrans_translation.config import TranslationConfig
from seqtrans_translation.hf_marian.tensors import read_weights, weights_file
from seqtrans_translation.presets import DEFAULTS
from seqtrans_translation.pretrained import PretrainedCodec
from seqtrans_translation.subwords import Subwords

log = logging.getLogger(__name__)

CONFIG = "config.json"
VOCAB = "vocab.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"
SOURCE_SPM, TARGET_SPM = "source.spm", "target.spm"

#: The logits bias of a symbol the imported model does not have: e^-100 of the mass
#: of any real symbol, nothing in float32, yet finite, so that label smoothing still
#: has a finite mean when the model is fine-tuned.
ABSENT_LOGIT = -100.0

# transformers' activation names (ACT2FN) and seqtrans's equivalents
ACTIVATIONS = {"swish": "silu", "silu": "silu", "gelu": "gelu", "relu": "relu"}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(
            path,
            None,
            "missing: a Hugging Face Marian model directory has config.json, "
            "model.safetensors (or pytorch_model.bin), source.spm, target.spm, vocab.json and "
            "tokenizer_config.json",
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(path, None, f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DataError(path, None, "not a JSON object")
    return data


def _field(config: dict[str, Any], key: str, path: Path, kind: type, default: Any = None) -> Any:
    value = config.get(key, default)
    if value is None or (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
        raise DataError(path, None, f"field '{key}': expected {kind.__name__}, got {value!r}")
    return value


def model_config(config: dict[str, Any], path: Path) -> ModelConfig:
    """The seqtrans model options of a Marian ``config.json``; a field seqtrans cannot
    follow is a :class:`DataError` naming it."""
    if config.get("model_type") != "marian":
        raise DataError(
            path,
            None,
            f"field 'model_type' is {config.get('model_type')!r}: not a Marian model "
            "(hf-marian imports model_type 'marian')",
        )
    for a, b in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if config.get(a) != config.get(b):
            raise DataError(
                path,
                None,
                f"fields '{a}' ({config.get(a)}) and '{b}' ({config.get(b)}) differ; "
                "seqtrans's encoder and decoder layers have one width and one head count",
            )
    activation = config.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise DataError(
            path,
            None,
            f"field 'activation_function' is {activation!r}; seqtrans's model.activation "
            f"has {', '.join(sorted(set(ACTIVATIONS.values())))} (Marian's "
            f"{', '.join(sorted(ACTIVATIONS))})",
        )
    if not config.get("share_encoder_decoder_embeddings", True):
        raise DataError(
            path,
            None,
            "field 'share_encoder_decoder_embeddings' is false: separate source and target "
            "vocabularies are not imported",
        )
    if config.get("decoder_vocab_size", config.get("vocab_size")) != config.get("vocab_size"):
        raise DataError(
            path,
            None,
            "field 'decoder_vocab_size' differs from 'vocab_size': separate source and "
            "target vocabularies are not imported",
        )
    for key in ("normalize_before", "add_final_layer_norm", "normalize_embedding", "layernorm_embedding"):
        if config.get(key):
            raise DataError(
                path,
                None,
                f"field '{key}' is set: Marian models are post-norm without embedding "
                "LayerNorm, and this importer reads Marian models only",
            )
    try:
        return ModelConfig(
            encoder_layers=_field(config, "encoder_layers", path, int),
            decoder_layers=_field(config, "decoder_layers", path, int),
            d_model=_field(config, "d_model", path, int),
            d_ff=_field(config, "encoder_ffn_dim", path, int),
            heads=_field(config, "encoder_attention_heads", path, int),
            dropout=float(config.get("dropout", 0.1)),
            attention_dropout=float(config.get("attention_dropout", 0.0)),
            activation_dropout=float(config.get("activation_dropout", 0.0)),
            norm="post",
            positions="sinusoidal",
            sinusoid_layout="split",
            max_positions=_field(config, "max_position_embeddings", path, int, 512),
            activation=cast(Any, ACTIVATIONS[activation]),
            scale_embeddings=bool(config.get("scale_embedding", False)),
            output_bias=True,
            share_embeddings=True,
            tie_output=bool(config.get("tie_word_embeddings", True)),
        )
    except ConfigError as exc:
        raise DataError(path, None, f"does not make a seqtrans model: {exc}") from None


def vocabulary(vocab: dict[str, Any], config: dict[str, Any], path: Path) -> tuple[Vocab, Tensor]:
    """seqtrans's vocabulary of a Marian ``vocab.json`` and, for each seqtrans id, the
    Marian id whose rows it takes (-1 for ``<pad>``, which Marian lacks).  -> (Vocab, [V+1])"""
    size = config.get("vocab_size")
    ids = sorted(vocab.values()) if all(isinstance(i, int) for i in vocab.values()) else None
    if ids != list(range(len(vocab))):
        raise DataError(path, None, "the ids are not 0 .. N-1, each once")
    if len(vocab) != size:
        raise DataError(
            path,
            None,
            f"holds {len(vocab)} symbols, but config.json's field 'vocab_size' is {size}: "
            "the tokenizer files do not belong to this model",
        )
    by_id = {i: s for s, i in vocab.items()}
    roles = {"pad_token_id": "<pad>", "eos_token_id": "</s>"}
    for key, symbol in roles.items():
        if by_id.get(config.get(key, -1)) != symbol:
            raise DataError(
                path,
                None,
                f"config.json's field '{key}' ({config.get(key)}) is not the id of "
                f"'{symbol}' here ({vocab.get(symbol)})",
            )
    if "<unk>" not in vocab:
        raise DataError(path, None, "has no '<unk>'")
    start = config.get("decoder_start_token_id", config.get("pad_token_id"))
    if start == vocab["<pad>"]:  # OPUS-MT: <pad> starts the decoder, and becomes seqtrans's <s>
        if "<s>" in vocab:
            raise DataError(
                path, None, "holds '<s>', the symbol seqtrans gives Marian's decoder start (<pad>)"
            )
        marian_of = {"<pad>": -1, "<s>": vocab["<pad>"]}
    elif by_id.get(start) == "<s>":  # a model seqtrans exported: <pad> and <s> keep their roles
        marian_of = {"<pad>": vocab["<pad>"], "<s>": start}
    else:
        raise DataError(
            path,
            None,
            f"config.json's field 'decoder_start_token_id' ({start}) is neither the id of "
            f"'<pad>' ({vocab['<pad>']}) nor of '<s>' ({vocab.get('<s>')}): seqtrans's decoder "
            "starts from one of those",
        )
    bad = [s for s in vocab if not s or any(c.isspace() for c in s)]
    if bad:
        raise DataError(path, None, f"symbols {bad[:3]!r} are empty or hold white space")
    marian_of |= {"</s>": vocab["</s>"], "<unk>": vocab["<unk>"]}
    rest = [by_id[i] for i in range(len(vocab)) if by_id[i] not in SPECIALS]
    symbols = [*SPECIALS, *rest]
    order = torch.tensor([marian_of[s] if s in marian_of else vocab[s] for s in symbols])
    return Vocab(symbols), order


def _rows(table: Tensor, order: Tensor, *, fill: float = 0.0) -> Tensor:
    """The rows of a Marian table [V_marian, ...] in seqtrans's order, ``fill`` where Marian
    has none.  -> [V, ...]"""
    out = table.new_full((order.numel(), *table.shape[1:]), fill)
    have = order >= 0
    out[have] = table[order[have]]
    return out


class _Weights:
    """The tensors of a weight file, taken by name and checked against the shapes the config implies."""

    def __init__(self, tensors: dict[str, Tensor], path: Path) -> None:
        self.tensors, self.path = tensors, path

    def take(self, name: str, shape: tuple[int, ...]) -> Tensor:
        t = self.tensors.get(name)
        if t is None:
            t = self.tensors.get(name.removeprefix("model."))  # saved from MarianModel without the head
        if t is None:
            raise DataError(self.path, None, f"tensor '{name}' is missing")
        if tuple(t.shape) != shape:
            raise DataError(
                self.path,
                None,
                f"tensor '{name}' has shape {tuple(t.shape)}, but config.json implies {shape}",
            )
        return t.float()


def weights(
    tensors: dict[str, Tensor], c: ModelConfig, order: Tensor, path: Path, *, vocab_size: int
) -> dict[str, Tensor]:
    """seqtrans's state dict of Marian's tensors (see the module docstring)."""
    w = _Weights(tensors, path)
    d, f = c.d_model, c.d_ff
    out: dict[str, Tensor] = {}
    shared = "model.shared.weight" in tensors or "shared.weight" in tensors
    name = "model.shared.weight" if shared else "model.encoder.embed_tokens.weight"
    embed = w.take(name, (vocab_size, d))  # [V_marian, D]
    out["target_embed.weight"] = out["source_embed.weight"] = _rows(embed, order)  # one shared matrix
    if not c.tie_output:
        out["output.weight"] = _rows(w.take("lm_head.weight", (vocab_size, d)), order)
    bias = tensors.get("final_logits_bias", torch.zeros(1, vocab_size))
    if tuple(bias.shape) != (1, vocab_size):
        raise DataError(
            path,
            None,
            f"tensor 'final_logits_bias' has shape {tuple(bias.shape)}, expected {(1, vocab_size)}",
        )
    out["output_bias"] = _rows(bias.float()[0], order, fill=ABSENT_LOGIT)

    def linear(ours: str, theirs: str, out_dim: int, in_dim: int) -> None:
        out[f"{ours}.weight"] = w.take(f"{theirs}.weight", (out_dim, in_dim))
        out[f"{ours}.bias"] = w.take(f"{theirs}.bias", (out_dim,))

    def norm(ours: str, theirs: str) -> None:
        out[f"{ours}.weight"] = w.take(f"{theirs}.weight", (d,))
        out[f"{ours}.bias"] = w.take(f"{theirs}.bias", (d,))

    def fused(ours: str, theirs: str, parts: tuple[str, ...]) -> None:
        out[f"{ours}.weight"] = torch.cat([w.take(f"{theirs}.{p}_proj.weight", (d, d)) for p in parts])
        out[f"{ours}.bias"] = torch.cat([w.take(f"{theirs}.{p}_proj.bias", (d,)) for p in parts])

    for side, layers in (("encoder", c.encoder_layers), ("decoder", c.decoder_layers)):
        for i in range(layers):
            ours, theirs = f"{side}.{i}", f"model.{side}.layers.{i}"
            fused(f"{ours}.self_attn.qkv", f"{theirs}.self_attn", ("q", "k", "v"))
            linear(f"{ours}.self_attn.out", f"{theirs}.self_attn.out_proj", d, d)
            norm(f"{ours}.r1.norm", f"{theirs}.self_attn_layer_norm")
            last = "r2"
            if side == "decoder":  # the encoder-decoder attention sits between the two
                linear(f"{ours}.cross_attn.q", f"{theirs}.encoder_attn.q_proj", d, d)
                fused(f"{ours}.cross_attn.kv", f"{theirs}.encoder_attn", ("k", "v"))
                linear(f"{ours}.cross_attn.out", f"{theirs}.encoder_attn.out_proj", d, d)
                norm(f"{ours}.r2.norm", f"{theirs}.encoder_attn_layer_norm")
                last = "r3"
            linear(f"{ours}.ffn.inner", f"{theirs}.fc1", f, d)
            linear(f"{ours}.ffn.outer", f"{theirs}.fc2", d, f)
            norm(f"{ours}.{last}.norm", f"{theirs}.final_layer_norm")
    return out


def tokenizer(directory: Path, vocab: Vocab) -> PretrainedCodec:
    """The codec of the model's sentencepiece models and vocabulary."""
    settings = _read_json(directory / TOKENIZER_CONFIG)
    if settings.get("separate_vocabs"):
        raise DataError(
            directory / TOKENIZER_CONFIG,
            None,
            "field 'separate_vocabs' is true: separate source and target vocabularies are not imported",
        )
    models = []
    for name in (SOURCE_SPM, TARGET_SPM):
        path = directory / name
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise DataError(
                path, None, "missing: Marian models cut text with source.spm and target.spm"
            ) from None
        models.append(Subwords(data, origin=str(path)))
    for name, model in zip((SOURCE_SPM, TARGET_SPM), models):
        pieces = model.vocab.symbols[len(SPECIALS) :]
        known = sum(p in vocab for p in pieces)
        if pieces and known < len(pieces) / 2:
            raise DataError(
                directory / name,
                None,
                f"only {known} of its {len(pieces)} pieces are in vocab.json: "
                "the sentencepiece model does not belong to this vocabulary",
            )
    return PretrainedCodec(models[0], models[1], vocab)


def run_config(model: ModelConfig, directory: Path) -> RunConfig:
    """The run config of an imported model: the model's options, the task's decoding
    defaults (the beam of generation_config.json where it has one), no data."""
    tree = merge({}, DEFAULTS)
    generation = directory / GENERATION_CONFIG
    if generation.is_file():
        beams = _read_json(generation).get("num_beams")
        if isinstance(beams, int) and not isinstance(beams, bool) and beams >= 1:
            tree = merge(tree, {"decode": {"beam": beams}})
    tree = merge(tree, {"task": "translation", "model": to_dict(model), "data": {"dataset": "none"}})
    return from_dict(RunConfig, tree, data_cls=TranslationConfig)


def import_marian(directory: Path, *, out: Path, allow_pickle: bool = False) -> Path:
    """Write the Marian model of ``directory`` as the seqtrans run directory ``out``, whole
    or not at all (written beside it, then renamed)."""
    directory, out = Path(directory), Path(out)
    if not directory.is_dir():
        raise DataError(directory, None, "not a directory")
    if out.exists():
        raise DataError(out, None, "exists; remove it or choose another run directory")
    marian = _read_json(directory / CONFIG)
    model = model_config(marian, directory / CONFIG)
    vocab, order = vocabulary(_read_json(directory / VOCAB), marian, directory / VOCAB)
    codec = tokenizer(directory, vocab)
    path = weights_file(directory, allow_pickle=allow_pickle)
    state = weights(read_weights(path), model, order, path, vocab_size=marian["vocab_size"])
    config = run_config(model, directory)
    write_run(out, config, codec.files(), state, imported=f"hf-marian {directory.name}")
    log.info(
        "imported %s (%d symbols, %d+%d layers of width %d) as %s",
        directory,
        len(vocab),
        model.encoder_layers,
        model.decoder_layers,
        model.d_model,
        out,
    )
    return out
