"""The BART family of Hugging Face models: ``bart``, ``mbart`` (mBART-50) and ``m2m_100``
(M2M-100 and NLLB-200). One architecture with a few switches, each an ordinary
seqtrans model option:

| | BART | mBART | M2M-100, NLLB |
|---|---|---|---|
| residuals | post-norm | pre-norm, a final LayerNorm per stack | pre-norm, a final LayerNorm per stack |
| positions | learned, from row 2 | learned, from row 2 | fairseq's sinusoids, from position 2 |
| embedding LayerNorm | per stack | per stack | none |
| output bias | ``final_logits_bias`` | ``final_logits_bias`` | none |

so ``model.norm``, ``model.positions``, ``model.position_offset``,
``model.sinusoid_frequencies``, ``model.embedding_norm`` and ``model.shared_positions``
say it all; what remains is a renaming of tensors (self-attention's query, key and
value projections fused into one, encoder-decoder attention's key and value) and the
vocabulary's order (:mod:`.vocabulary`).

Shapes: V the model's vocabulary, D d_model, F d_ff, P position rows.
"""

from __future__ import annotations

from typing import Any, cast

from torch import Tensor

from seqtrans.plugin import ConfigError, DataError, ModelConfig
from seqtrans_translation.hf.directory import Entry, Settings, Weights
from seqtrans_translation.hf.vocabulary import output_tables

MODEL_TYPES = ("bart", "mbart", "m2m_100")

# transformers' activation names (ACT2FN) and seqtrans's equivalents
ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "swish": "silu", "silu": "silu"}
#: The first row BART's and mBART's learned position tables use (fairseq's padding offset).
LEARNED_OFFSET = 2


def model_config(s: Settings) -> ModelConfig:
    """The seqtrans model of a BART-family ``config.json``."""
    kind = s.get("model_type", str)
    pairs = (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim"))
    for a, b in pairs:
        if s.values.get(a) != s.values.get(b):
            raise s.fail(b, f"differs from '{a}' ({s.values.get(a)}); seqtrans's encoder and decoder layers "
                            "have one width and one head count")
    activation = s.get("activation_function", str, "gelu")
    if activation not in ACTIVATIONS:
        raise s.fail("activation_function", f"not one of {', '.join(sorted(ACTIVATIONS))}")
    pre = kind != "bart"
    sinusoidal = kind == "m2m_100"
    pad = s.get("pad_token_id", int)
    try:
        return ModelConfig(
            encoder_layers=s.get("encoder_layers", int), decoder_layers=s.get("decoder_layers", int),
            d_model=s.get("d_model", int), d_ff=s.get("encoder_ffn_dim", int),
            heads=s.get("encoder_attention_heads", int),
            dropout=s.get("dropout", float, 0.1), attention_dropout=s.get("attention_dropout", float, 0.0),
            activation_dropout=s.get("activation_dropout", float, 0.0),
            norm="pre" if pre else "post",
            positions="sinusoidal" if sinusoidal else "learned",
            sinusoid_layout="split", sinusoid_frequencies="fairseq",
            position_offset=pad + 1 if sinusoidal else LEARNED_OFFSET,
            shared_positions=False,
            max_positions=s.get("max_position_embeddings", int, 1024),
            activation=cast(Any, ACTIVATIONS[activation]),
            scale_embeddings=s.get("scale_embedding", bool, False),
            embedding_norm=kind != "m2m_100",
            # the model's bias, or zeros, and the absent <s>; never trained, as transformers
            # keeps final_logits_bias as a buffer (and M2M-100 and NLLB have no place for one)
            output_bias=True, fixed_output_bias=True,
            share_embeddings=True,
            tie_output=s.get("tie_word_embeddings", bool, True),
        )
    except ConfigError as exc:
        raise DataError(s.path, None, f"does not make a seqtrans model: {exc}") from None


def key_map(c: ModelConfig) -> list[Entry]:
    """Every tensor of the stacks, by seqtrans's name and the model's (the embeddings and
    the output bias, whose rows are reordered, are not here). Import and export read it."""
    d, f = c.d_model, c.d_ff
    entries: list[Entry] = []

    def linear(ours: str, theirs: tuple[str, ...], out_dim: int, in_dim: int) -> None:
        entries.append((f"{ours}.weight", tuple((f"{t}.weight", (out_dim, in_dim)) for t in theirs)))
        entries.append((f"{ours}.bias", tuple((f"{t}.bias", (out_dim,)) for t in theirs)))

    def norm(ours: str, theirs: str) -> None:
        entries.append((f"{ours}.weight", ((f"{theirs}.weight", (d,)),)))
        entries.append((f"{ours}.bias", ((f"{theirs}.bias", (d,)),)))

    for side, own, layers in (("encoder", "", c.encoder_layers), ("decoder", "decoder_", c.decoder_layers)):
        stack = f"model.{side}"
        if c.positions == "learned":
            entries.append((f"{own}positions.table.weight",
                            ((f"{stack}.embed_positions.weight", (c.max_positions + c.position_offset, d)),)))
        if c.embedding_norm:
            norm(f"{own}embedding_norm", f"{stack}.layernorm_embedding")
        if c.norm == "pre":
            norm(f"{side}_norm", f"{stack}.layer_norm")
        for i in range(layers):
            ours, theirs = f"{side}.{i}", f"{stack}.layers.{i}"
            linear(f"{ours}.self_attn.qkv", tuple(f"{theirs}.self_attn.{p}_proj" for p in "qkv"), d, d)
            linear(f"{ours}.self_attn.out", (f"{theirs}.self_attn.out_proj",), d, d)
            norm(f"{ours}.r1.norm", f"{theirs}.self_attn_layer_norm")
            last = "r2"
            if side == "decoder":  # the encoder-decoder attention sits between the two
                linear(f"{ours}.cross_attn.q", (f"{theirs}.encoder_attn.q_proj",), d, d)
                linear(f"{ours}.cross_attn.kv", tuple(f"{theirs}.encoder_attn.{p}_proj" for p in "kv"), d, d)
                linear(f"{ours}.cross_attn.out", (f"{theirs}.encoder_attn.out_proj",), d, d)
                norm(f"{ours}.r2.norm", f"{theirs}.encoder_attn_layer_norm")
                last = "r3"
            linear(f"{ours}.ffn.inner", (f"{theirs}.fc1",), f, d)
            linear(f"{ours}.ffn.outer", (f"{theirs}.fc2",), d, f)
            norm(f"{ours}.{last}.norm", f"{theirs}.final_layer_norm")
    return entries


#: Where the model keeps its shared embedding matrix, by the name it was saved under.
EMBEDDINGS = ("model.shared.weight", "model.encoder.embed_tokens.weight", "shared.weight")


def state_dict(w: Weights, c: ModelConfig, order: Tensor, *, vocab_size: int) -> dict[str, Tensor]:
    """seqtrans's weights of a BART-family model's tensors."""
    bias = w.take("final_logits_bias", (1, vocab_size))[0] if "final_logits_bias" in w else None
    out = output_tables(w, c, order, embeddings=EMBEDDINGS, vocab_size=vocab_size, bias=bias)
    for ours, parts in key_map(c):
        out[ours] = w.joined(parts)
    return out


def layout_of(s: Settings, tokenizer_config: Settings, languages: tuple[str, ...],
              ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The tokens a BART-family model's tokenizer puts before a source's and a target's
    pieces (seqtrans adds the end symbol): language codes for the multilingual models,
    ``<s>`` for BART."""
    kind = s.get("model_type", str)
    if kind == "bart":
        # BART's tokenizer reads <s> text </s> on both sides, and its models are trained to
        # write <s> first (the Hub's configs force it, as forced_bos_token_id)
        bos = tokenizer_config.optional("bos_token", str) or "<s>"
        return (bos,), (bos,)
    if not languages:
        raise DataError(tokenizer_config.path, None, "lists no language codes (extra_special_tokens or "
                                                     "additional_special_tokens): a model of several "
                                                     "languages needs them")
    if tokenizer_config.values.get("legacy_behaviour"):
        raise tokenizer_config.fail("legacy_behaviour", "the legacy layout puts the language code after the "
                                                        "end symbol, which seqtrans's sources cannot hold")
    tokenizer_class = str(tokenizer_config.values.get("tokenizer_class", ""))
    if kind == "mbart" and not tokenizer_class.startswith("MBart50"):
        raise tokenizer_config.fail("tokenizer_class", "mBART-cc25's layout puts the language code after the "
                                                       "end symbol, which seqtrans's sources cannot hold; "
                                                       "mBART-50 models (MBart50Tokenizer) are imported")
    from seqtrans_translation.hf.codec import SOURCE_LANG, TARGET_LANG

    return (SOURCE_LANG,), (TARGET_LANG,)
