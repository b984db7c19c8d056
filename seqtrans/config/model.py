"""The ``model`` section: the Transformer's shape and its variants (paper, section 3 and
Table 3), each option with its default and help, and what makes a model's settings
consistent (:func:`check_model`, run when a :class:`ModelConfig` is made)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from seqtrans.config.fields import check_at_least, option
from seqtrans.errors import ConfigError

# Attention mechanisms (docs/attention.md); seqtrans.attention builds them by these names.
Mechanism = Literal["scaled_dot", "dot", "general", "additive", "location", "restricted", "local",
                    "memory", "monotonic", "milk", "mocha", "mma_hard", "mma_il", "mma_chunk"]
SELF_MECHANISMS = ("scaled_dot", "dot", "general", "additive", "location", "restricted")
#: The encoder-decoder attentions whose read policy is learned: a selection probability per
#: head and source position, trained with the energy options of :func:`policy_option`.
LEARNED_POLICIES = ("monotonic", "milk", "mocha", "mma_hard", "mma_il", "mma_chunk")
CROSS_MECHANISMS = ("scaled_dot", "dot", "general", "additive", "location", "local", "memory",
                    *LEARNED_POLICIES)


def policy_option(default: float, help: str) -> Any:
    """An option of the learned read policies' energy, its help prefixed with their names."""
    return option(default, f"{', '.join(LEARNED_POLICIES)}: {help}")


@dataclass(frozen=True)
class ModelConfig:
    """The Transformer's shape (paper, section 3 and Table 3)."""

    encoder_layers: int = option(6, "N, the number of encoder layers.")
    decoder_layers: int = option(6, "N, the number of decoder layers.")
    d_model: int = option(512, "Model width d_model; d_k = d_v = d_model / heads unless model.head_dim says.")
    d_ff: int = option(2048, "Inner width of the position-wise feed-forward layers.")
    heads: int = option(8, "h, the number of attention heads.")
    head_dim: int = option(
        0, "d_k = d_v, the width of each head's queries, keys and values; the attention projections are "
        "heads * head_dim wide. 0: d_model / heads, as in the paper. Another width lets heads * head_dim "
        "differ from d_model (not in the paper; Xue et al. 2021's smallest model has d_model 512 and 6 heads "
        "of 64). Needs scaled_dot attention at every site."
    )
    dropout: float = option(
        0.1, "P_drop: dropout on each sub-layer output and on embedding + position sums."
    )
    attention_dropout: float = option(0.0, "Dropout on attention weights (not in the paper).")
    activation_dropout: float = option(0.0, "Dropout after the feed-forward ReLU (not in the paper).")
    norm: Literal["post", "pre"] = option(
        "post", "'post': LayerNorm(x + Sublayer(x)) as in the paper; 'pre': x + Sublayer(LayerNorm(x))."
    )
    norm_kind: Literal["layer", "rms"] = option(
        "layer", "The normalisation of every residual, of the final norms of pre-norm stacks and of "
        "model.embedding_norm: 'layer', LayerNorm with a bias, as in the paper; 'rms', RMSNorm (Zhang and "
        "Sennrich 2019): x / sqrt(mean(x^2) + eps) times a learned scale, with no mean subtracted and no "
        "bias (Raffel et al. 2020)."
    )
    norm_eps: float = option(
        1e-5, "epsilon of every normalisation (model.norm_kind), added to the variance: 1e-5 is PyTorch's "
        "LayerNorm default; Raffel et al. 2020 use 1e-6 with RMSNorm."
    )
    positions: Literal["sinusoidal", "learned", "relative"] = option(
        "sinusoidal", "Positional encodings: sinusoidal, or learned (Table 3, row E); 'relative' adds none "
        "to the embeddings: instead every self-attention layer adds to its logits a learned bias per head "
        "and bucket of relative distance (Raffel et al. 2020, section 2.1), from one table "
        "per stack (model.relative_buckets, model.relative_max_distance); the encoder's buckets tell the "
        "two directions apart, the decoder's hold past positions only. Needs scaled_dot self-attention."
    )
    relative_buckets: int = option(
        32, "positions=relative: buckets of relative distance per stack. In the decoder, half of them hold "
        "one distance each and the rest log-spaced distances up to model.relative_max_distance; the "
        "encoder splits them between the two directions, each as the decoder does (Raffel et al. 2020: 32)."
    )
    relative_max_distance: int = option(
        128, "positions=relative: distances of this or more share their direction's last bucket (Raffel et "
        "al. 2020: 128). More than half of model.relative_buckets."
    )
    sinusoid_layout: Literal["interleaved", "split"] = option(
        "interleaved", "Sinusoidal encodings: 'interleaved' sin and cos of each frequency as in the paper's "
        "formula; 'split': all sines in the first half of the vector, all cosines in the second."
    )
    sinusoid_frequencies: Literal["paper", "fairseq"] = option(
        "paper", "Frequencies of the sinusoids: 'paper' 1/10000^(2i/d_model) as in section 3.5; 'fairseq' "
        "1/10000^(i/(d_model/2 - 1)), as fairseq and the models trained with it (M2M-100, NLLB) compute them."
    )
    max_positions: int = option(1024, "Longest sequence learned positions can encode.")
    position_offset: int = option(
        0, "The position of a sequence's first token (not in the paper): fairseq's models count from 2, "
        "after their padding id, and their learned tables hold that many rows more (BART, mBART, M2M-100)."
    )
    shared_positions: bool = option(
        True, "One position table and one embedding LayerNorm (model.embedding_norm) for both stacks; false: "
        "the encoder and the decoder each have their own (BART, mBART)."
    )
    activation: Literal["relu", "gelu", "gelu_tanh", "silu"] = option(
        "relu", "Feed-forward activation: relu as in the paper; gelu (exact, erf form); gelu_tanh (GELU's "
        "tanh approximation, as GPT-2 computes it); silu (swish, x * sigmoid(x))."
    )
    gated_ffn: bool = option(
        False, "Gated feed-forward layers (not in the paper; Shazeer 2020, GLU variants): "
        "FFN(x) = (act(x W1) * (x V)) W2, with a third matrix V; activation=gelu_tanh makes the gated GELU "
        "of Raffel et al. 2020's later checkpoints, silu SwiGLU."
    )
    bias: bool = option(
        True, "Biases in the attention projections and the feed-forward layers, as in the paper; false: "
        "none (Raffel et al. 2020). Needs scaled_dot attention at every site."
    )
    attention_scale: bool = option(
        True, "Divide the attention logits by sqrt(d_k) (paper, 3.2.1); false: no scaling (Raffel et al. "
        "2020, whose initialisation of the query projection makes up for it). Needs "
        "scaled_dot attention at every site."
    )
    scale_embeddings: bool = option(
        True, "Multiply token embeddings by sqrt(d_model) before the positions are added (paper, 3.4)."
    )
    embedding_norm: bool = option(
        False, "LayerNorm on the sum of token embeddings and positions, before dropout (not in the paper)."
    )
    output_bias: bool = option(
        False, "A bias vector added to the output logits (not in the paper)."
    )
    fixed_output_bias: bool = option(
        False, "Keep the output bias as it was loaded instead of training it: a model converted from a "
        "format without a bias, whose bias only shuts out symbols that format lacks, stays one that "
        "the format can hold after fine-tuning."
    )
    share_embeddings: bool = option(
        True, "Share source and target embeddings when the task's vocabulary is shared."
    )
    tie_output: bool = option(True, "Tie the pre-softmax projection to the target embeddings.")
    scale_output: bool = option(
        False, "Multiply the decoder's output by d_model^-0.5 before the pre-softmax projection (not in the "
        "paper): Raffel et al. 2020 do so, their projection being the tied embedding matrix."
    )
    encoder_attention: Mechanism = option(
        "scaled_dot", "Encoder self-attention: scaled_dot, dot, general, additive, location or "
        "restricted (docs/attention.md)."
    )
    decoder_attention: Mechanism = option(
        "scaled_dot", "Decoder self-attention (causal): scaled_dot, dot, general, additive, location "
        "or restricted."
    )
    cross_attention: Mechanism = option(
        "scaled_dot", "Encoder-decoder attention: scaled_dot, dot, general, additive, location, "
        "local, memory, monotonic, milk (monotonic infinite lookback), mocha (monotonic chunkwise attention, "
        "Chiu and Raffel 2018: a soft chunk of model.chunk_size positions ending where the monotonic head "
        "stops), mma_hard, mma_il or mma_chunk (monotonic multihead attention, Ma et al. 2020: every head a "
        "monotonic head, attending to the position it stops at, or, infinite lookback, to everything up to "
        "it, or, not in the paper, to the model.chunk_size positions ending there; a step is written once "
        "every head has stopped)."
    )
    causal_encoder: bool = option(
        False, "Unidirectional encoder: each source position attends only to itself and earlier "
        "ones, so encoding can follow a source as it arrives ('predict --stream' with a learned read "
        "policy needs it; wait-k without it encodes the source read so far again at each read)."
    )
    wait_k: int = option(
        0, "wait-k (Ma et al. 2019): target position i attends to the first i + k source positions "
        "only (all of them once i + k exceeds the source), in training and as the default decoding "
        "lag (decode.wait_k); 0: the whole source. Needs cross_attention=scaled_dot; meant with "
        "causal_encoder=true."
    )
    multi_k: bool = option(
        False, "Multi-k training (Elbayad et al. 2020): each batch draws its wait-k lag uniformly from "
        "1 to its longest source, so that one model decodes at any decode.wait_k. Needs "
        "cross_attention=scaled_dot."
    )
    location_max_length: int = option(
        0, "location: the longest sequence it can attend over (W_a has a row per position and "
        "head); required where a site uses location."
    )
    restricted_radius: int = option(
        16, "restricted: r, each position attends to those at most r away (the r before it, when causal)."
    )
    local_window: int = option(
        10, "local: D, the window is [p - D, p + D] around the aligned position p; the Gaussian of "
        "local-p has sigma = D / 2 (Luong et al.: D = 10)."
    )
    local_alignment: Literal["predictive", "monotonic"] = option(
        "predictive", "local: 'predictive' (local-p) predicts p = S * sigmoid(v_p^T tanh(W_p h)) and "
        "weights the window by a Gaussian; 'monotonic' (local-m) sets p to the target position."
    )
    memory_slots: int = option(
        32, "memory: K, the number of attention contexts computed once per source (Britz et al.: 1-64)."
    )
    memory_encoder_score: Literal["softmax", "sigmoid"] = option(
        "softmax", "memory: alpha = score(W_alpha s) over source positions: softmax, or sigmoid."
    )
    memory_decoder_score: Literal["softmax", "sigmoid", "content"] = option(
        "softmax", "memory: beta = score(W_beta h) over the K contexts: softmax, or sigmoid; 'content' "
        "(not in the paper) scores each context by what it holds, beta = softmax_k((W_q h) . (W_k C_k) "
        "/ sqrt(d_model)), as Luna's unpack attention reads its packed memory; still O(K d_model) a step."
    )
    memory_heads: int = option(
        1, "memory with content scores: H heads, each scoring the K contexts with its own slice of "
        "the query and key projections and mixing its own values (W_v C_k), as multi-head attention "
        "does over source positions; O(H K d_model) a step. 1 is one score over d_model."
    )
    memory_local_width: float = option(
        0.0, "memory (not in the paper): add to each encoder score the log of a Gaussian around the "
        "slot's point of the source, -((s - 1/2)/S - (k - 1/2)/K)^2 / (2 sigma^2) with sigma = this / K, "
        "so that slots can hold positions of their own; 0: none."
    )
    memory_positions: bool = option(
        False, "memory: multiply the encoder scores by the position encodings "
        "L_ks = (1 - k/K)(1 - s/S) + (k/K)(s/S), with S each source's own length."
    )
    monotonic_dim: int = option(
        0, "monotonic: width of the energy's hidden layer tanh(W s + V h + b); 0 means d_model."
    )
    chunk_size: int = option(
        2, "mocha, mma_chunk: w, the width of the soft chunk that ends at the position the monotonic head "
        "stops at (Chiu and Raffel 2018), at least 1: 1 attends to that position alone, and a w at least the "
        "source's length attends to everything read, as milk does."
    )
    monotonic_noise: float = policy_option(
        1.0, "standard deviation of the Gaussian noise added to the energies before the sigmoid while "
        "training (Raffel et al.: 1); never at test time."
    )
    monotonic_r_init: float = policy_option(
        -4.0, "initial value of the energy's scalar bias r; negative so that selection probabilities start "
        "low and the expected alignment is not stuck at the first position."
    )
    monotonic_temperature: float = policy_option(
        1.0, "the energy (its bias r included) is divided by this before the noise and the sigmoid. Below 1 "
        "it sharpens the selection probabilities towards 0 or 1, so that the expected alignment of training "
        "is closer to the hard decisions of decoding, which it does not change (SeamlessStreaming's "
        "monotonic decoder uses 0.2 with r = -0.5); 1 is the paper's energy. Positive."
    )

    def __post_init__(self) -> None:
        check_model(self)

    @property
    def position_limit(self) -> int | None:
        """The most positions a sequence may have (its end or start symbol included):
        ``max_positions`` with learned positions, None with sinusoidal ones (no limit)."""
        return self.max_positions if self.positions == "learned" else None

    @property
    def head_width(self) -> int:
        """d_k = d_v: ``head_dim``, or d_model / heads where it is 0."""
        return self.head_dim or self.d_model // self.heads



# What makes a model's settings consistent, checked when a ModelConfig is made: each
# problem is a ConfigError naming the key.


def check_model(c: ModelConfig) -> None:
    """Refuse settings of ``c`` that no model can have, naming the key."""
    _check_ranges(c)
    _check_mechanisms(c)
    _check_variants(c)
    _check_numbers(c)


def _check_ranges(c: ModelConfig) -> None:
    """Counts and sizes at least 1; lags, offsets and widths not negative."""
    check_at_least(c, "model", ("encoder_layers", "decoder_layers", "d_model", "d_ff", "heads",
                                "max_positions", "restricted_radius", "local_window", "memory_slots",
                                "memory_heads", "chunk_size"), 1)
    check_at_least(c, "model", ("location_max_length", "monotonic_dim", "monotonic_noise", "wait_k",
                                "position_offset", "head_dim"), 0)


def _check_mechanisms(c: ModelConfig) -> None:
    """Each site's mechanism is one it can have, and what it needs is set."""
    for key in ("encoder_attention", "decoder_attention"):
        name = getattr(c, key)
        if name not in SELF_MECHANISMS:
            raise ConfigError(
                f"model.{key}", f"'{name}' is not a self-attention mechanism"
                + (" (it attends from the target to the source: use it as model.cross_attention)"
                   if name in CROSS_MECHANISMS else "")
                + f"; choose one of {', '.join(SELF_MECHANISMS)}")
    if c.cross_attention not in CROSS_MECHANISMS:
        raise ConfigError(
            "model.cross_attention", f"'{c.cross_attention}' is a self-attention mechanism; "
            f"choose one of {', '.join(CROSS_MECHANISMS)} (local is restricted attention's "
            "encoder-decoder counterpart)")
    if (c.wait_k or c.multi_k) and c.cross_attention != "scaled_dot":
        raise ConfigError("model.wait_k" if c.wait_k else "model.multi_k",
                          "wait-k masks scaled-dot encoder-decoder attention; this model has "
                          f"model.cross_attention={c.cross_attention}")
    using_location = [key for key in ("encoder_attention", "decoder_attention", "cross_attention")
                      if getattr(c, key) == "location"]
    if using_location and c.location_max_length < 1:
        raise ConfigError(
            "model.location_max_length",
            f"model.{using_location[0]}=location needs the longest sequence it attends over; "
            "set it to at least the longest source (and target, at self-attention sites) plus one")
    if c.d_model % c.heads and not c.head_dim:
        raise ConfigError(
            "model.heads", f"d_model {c.d_model} is not divisible by {c.heads} heads "
            "(model.head_dim sets another width)"
        )


def _check_variants(c: ModelConfig) -> None:
    """Variants of scaled dot-product attention only at its sites; the relative buckets."""
    # options only scaled dot-product attention implements
    changed = (("head_dim", 0), ("bias", True), ("attention_scale", True))
    scaled_dot_only = [key for key, default in changed if getattr(c, key) != default]
    if c.positions == "relative":
        scaled_dot_only.append("positions")
    self_sites = ("encoder_attention", "decoder_attention")
    for key in scaled_dot_only:
        for site in self_sites if key == "positions" else (*self_sites, "cross_attention"):
            if getattr(c, site) != "scaled_dot":
                raise ConfigError(f"model.{key}", f"{key}={getattr(c, key)!r} is a variant of scaled "
                                  "dot-product attention; this model has "
                                  f"model.{site}={getattr(c, site)}")
    if c.relative_buckets < 4:
        raise ConfigError("model.relative_buckets", f"must be at least 4, got {c.relative_buckets}")
    if c.relative_max_distance <= c.relative_buckets // 2:
        raise ConfigError("model.relative_max_distance",
                          f"must be more than half of model.relative_buckets ({c.relative_buckets}), "
                          f"got {c.relative_max_distance}")


def _check_numbers(c: ModelConfig) -> None:
    """Epsilons, widths, temperatures and dropouts in their ranges."""
    if not (math.isfinite(c.norm_eps) and c.norm_eps > 0):
        raise ConfigError("model.norm_eps", f"must be positive, got {c.norm_eps}")
    content = c.memory_decoder_score == "content"
    if c.memory_heads > 1 and (c.d_model % c.memory_heads or not content):
        raise ConfigError("model.memory_heads",
                          f"{c.memory_heads} heads need model.memory_decoder_score=content (got "
                          f"{c.memory_decoder_score}) and must divide d_model {c.d_model}")
    if not (math.isfinite(c.memory_local_width) and c.memory_local_width >= 0):
        raise ConfigError("model.memory_local_width", f"must be finite and not negative, "
                          f"got {c.memory_local_width}")
    if not (math.isfinite(c.monotonic_temperature) and c.monotonic_temperature > 0):
        raise ConfigError("model.monotonic_temperature",
                          f"must be positive, got {c.monotonic_temperature}")
    for key in ("dropout", "attention_dropout", "activation_dropout"):
        if not 0.0 <= getattr(c, key) < 1.0:
            raise ConfigError(f"model.{key}", f"must be in [0, 1), got {getattr(c, key)}")
