"""The ``decode`` section: search settings (paper, section 6.1), each option with its
default and help; a task sets its own defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from seqtrans.config.fields import PRECISIONS, check_at_least, check_precision, option
from seqtrans.config.model import LEARNED_POLICIES
from seqtrans.errors import ConfigError

#: Values of ``decode.precision``: int8 is for decoding only.
DECODE_PRECISIONS = (*PRECISIONS, "int8")


@dataclass(frozen=True)
class DecodeConfig:
    """Search settings (paper, section 6.1); tasks set their own defaults."""

    beam: int = option(4, "Beam size; 1 decodes greedily.")
    alpha: float = option(0.6, "Length penalty alpha of lp(Y) = ((5 + |Y|) / 6)^alpha; 0 disables.")
    length_penalty: Literal["gnmt", "power"] = option(
        "gnmt", "The form of lp(Y) that beam search divides log P(Y|X) by: 'gnmt' ((5 + |Y|) / 6)^alpha "
        "(Wu et al. 2016); 'power' |Y|^alpha (the length_penalty of fairseq and transformers). |Y| counts "
        "the end symbol.")
    end_in_beam: bool = option(
        False, "Beam search: a hypothesis may end only where its end symbol ranks among the beam's K best "
        "candidates of the step (as fairseq and transformers search); false: any of the 2K candidates "
        "kept at each step may end, which never gives a worse result.")
    max_len_a: float = option(1.0, "Maximum output length a * |x| + b: the a.")
    max_len_b: int = option(50, "Maximum output length a * |x| + b: the b.")
    min_len: int = option(0, "Minimum output length in tokens, where the maximum allows it.")
    no_repeat_ngram_size: int = option(
        0, "No output contains an n-gram of this many target tokens twice (a token that would repeat "
        "one is not allowed); 0: no such rule."
    )
    banned: tuple[str, ...] = option(
        (), "Phrases no output contains (negative lexical constraints), each read as the task reads a "
        "target (text for translation) and kept out by predict, evaluate and run's test decoding; "
        "--set takes them comma-separated. A phrase with a token the target vocabulary lacks is an error."
    )
    nbest: int = option(1, "Hypotheses returned per input (at most the beam size).")
    batch_tokens: int = option(8000, "Source tokens (padding included) per decoding batch.")
    constrained: bool = option(True, "Apply the task's constraint on next tokens, where it has one.")
    compare_unconstrained: bool = option(
        False, "Also decode the test split without the task's constraint and report those metrics "
        "with the prefix 'unconstrained_'."
    )
    wait_k: int = option(
        0, "Decode wait-k at this lag (Ma et al. 2019): each target position sees the first i + k "
        "source positions; 0: the model's own model.wait_k (the whole source if it has none). A "
        "model with scaled_dot encoder-decoder attention decodes at any lag."
    )
    monotonic_threshold: float = option(
        0.5, f"Decoding with learned read/write policies ({', '.join(LEARNED_POLICIES)} attention): a head "
        "stops reading once its selection probability reaches this, in (0, 1). 0.5 is how they are trained; "
        "lower writes sooner (less latency), higher reads further first."
    )
    sample: int = option(
        0, "Draw this many outputs per input from the model's distribution (reshaped by "
        "decode.temperature, top_k, top_p and epsilon) instead of searching; decode.beam and "
        "decode.nbest are then unused. 0 searches."
    )
    temperature: float = option(
        1.0, "Sampling: divide the log-probabilities by this before drawing; below 1 sharpens, above "
        "1 flattens. Must be positive."
    )
    top_k: int = option(0, "Sampling: draw from the k most probable tokens only; 0 keeps all.")
    top_p: float = option(
        1.0, "Sampling (nucleus, Holtzman et al. 2020): draw from the smallest set of most probable "
        "tokens whose probability reaches p, in (0, 1]; 1 keeps all."
    )
    epsilon: float = option(
        0.0, "Sampling (Hewitt et al. 2022): never draw a token whose probability is below this, in "
        "[0, 1); the most probable token is always allowed. 0 keeps all."
    )
    seed: int = option(
        1, "Sampling: the seed of the random streams. Each input has its own stream, seeded by this and "
        "its position in the input (line number), so its samples do not depend on the other inputs "
        "decoded with it."
    )
    shortlist: bool = option(
        False, "Compute the output projection, and search, only over the run's vocabulary shortlist (RUN_DIR/"
        "shortlist.npz: the likely target tokens of each source token, from the training data, and the "
        "most frequent ones; built by 'seqtrans shortlist RUN_DIR', or by run when this is set): each "
        "output keeps to its source's tokens. Faster where the projection is a large part of a step "
        "(small decoders, large vocabularies). For predict, evaluate and run's test decoding of one "
        "model; not for ensembles or streaming."
    )
    precision: str = option(
        "fp32", "fp32; bf16: decode under bfloat16 autocast (for CUDA and CPUs with AMX); int8 (CPU "
        "only): int8 weights in every linear layer, the embeddings and the output projection, "
        "activations quantized per row as they come, integer products (fastest on CPUs with AVX-512 "
        "VNNI or AMX). Scores are accumulated in fp32. A run loaded with int8 keeps no float weights "
        "(a quarter of the memory) and decodes in int8 only."
    )
    source_lang: str = option(
        "", "The language of the sources, for a model of several languages (a code the model knows, such "
        "as eng_Latn or en_XX); empty: the one its tokenizer was saved with. An error lists the model's "
        "codes."
    )
    target_lang: str = option(
        "", "The language to translate into, for a model of several languages: its code is forced as the "
        "first output token, as the model's own generation forces it; empty: the one its tokenizer was "
        "saved with."
    )

    def __post_init__(self) -> None:
        check_at_least(self, "decode", ("beam", "nbest", "batch_tokens"), 1)
        if self.nbest > self.beam:
            raise ConfigError("decode.nbest", f"nbest {self.nbest} exceeds the beam size {self.beam}")
        if not 0.0 < self.monotonic_threshold < 1.0:
            raise ConfigError("decode.monotonic_threshold",
                              f"must lie strictly between 0 and 1, got {self.monotonic_threshold}")
        check_at_least(self, "decode", ("alpha", "max_len_a", "max_len_b", "min_len", "wait_k",
                                        "no_repeat_ngram_size", "sample", "top_k"), 0)
        check_precision("decode.precision", self.precision, DECODE_PRECISIONS)
        if not self.temperature > 0:
            raise ConfigError("decode.temperature", f"must be positive, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError("decode.top_p", f"must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.epsilon < 1.0:
            raise ConfigError("decode.epsilon", f"must be in [0, 1), got {self.epsilon}")
        if self.sample and self.nbest > 1:
            raise ConfigError("decode.nbest", f"sampling returns decode.sample ({self.sample}) outputs per "
                              f"input; nbest must be 1, got {self.nbest}")

    @property
    def outputs_per_input(self) -> int:
        """How many hypotheses decoding returns per input: the samples, or the n-best."""
        return self.sample or self.nbest
