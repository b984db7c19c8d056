"""Tiny Hugging Face models of the T5 family, built here with transformers (a test
dependency): T5 v1.0 (ReLU, the head tied to the embeddings and its input scaled), v1.1
(gated GELU, a head of its own), mT5 (heads of another width than d_model / heads) and
ByT5 (bytes, more encoder than decoder layers). Each has a tokenizer made here and saved
as transformers saves it: a sentencepiece unigram model trained on a few generated
sentences, turned into a ``T5Tokenizer`` (``tokenizer.json``), or ByT5's, which has no
model. Random weights are trained for a few updates on word-by-word pairs, the test
sources among them: a model this small trained this briefly loops on sources it has not
seen, and the tests need outputs that end by themselves and differ by source."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch
from hf_models import train_briefly
from marian_models import SOURCE_WORDS, SOURCES, TARGET_WORDS, _pairs, sentences

VARIANTS = ("t5", "t5v11", "mt5", "byt5")
#: the longest output generate writes (the start and end symbols included), per variant
MAX_LENGTH = {"t5": 40, "t5v11": 40, "mt5": 40, "byt5": 96}
EXTRA_IDS = 8  # sentinels after the pieces (real models have 100; ByT5 125)


def _texts() -> list[str]:
    return sentences(SOURCE_WORDS, 200, 1) + sentences(TARGET_WORDS, 200, 2)


def sentencepiece_unigram() -> bytes:
    """A unigram model with T5's ids: <pad> 0, </s> 1, <unk> 2, no <s>."""
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_texts()), model_writer=buffer, vocab_size=90,
                                   model_type="unigram", character_coverage=1.0, hard_vocab_limit=False,
                                   pad_id=0, eos_id=1, unk_id=2, bos_id=-1, num_threads=1, minloglevel=2)
    return buffer.getvalue()


def tokenizer(variant: str, directory: Path, spiece: bytes) -> Any:
    """The variant's transformers tokenizer, made here from the sentencepiece model
    ``spiece`` (ByT5's has none) and saved into ``directory``."""
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    if variant == "byt5":
        tok = transformers.ByT5Tokenizer(extra_ids=EXTRA_IDS)
    else:
        scratch = directory / "spm"
        scratch.mkdir(exist_ok=True)
        (scratch / "spiece.model").write_bytes(spiece)
        tok = transformers.T5Tokenizer.from_pretrained(scratch, extra_ids=EXTRA_IDS)
        (scratch / "spiece.model").unlink()
        scratch.rmdir()
    tok.save_pretrained(directory)
    return tok


def t5_directory(variant: str, directory: Path, *, seed: int = 0, d_model: int = 32, train_steps: int = 100,
                 spiece_only: bool = False) -> Path:
    """Write a tiny model of ``variant`` (one of :data:`VARIANTS`) with its tokenizer into
    ``directory``; ``spiece_only``: the tokenizer as older directories hold it, the
    sentencepiece model alone (``spiece.model``, no ``tokenizer.json``)."""
    import transformers

    spiece = sentencepiece_unigram()
    tok = tokenizer(variant, directory, spiece)
    common: dict[str, Any] = {
        "vocab_size": len(tok) + 3,  # rows no token has, as real models pad their matrices
        "d_model": d_model, "d_ff": 2 * d_model, "num_heads": 4, "d_kv": d_model // 4, "num_layers": 2,
        "relative_attention_num_buckets": 8, "relative_attention_max_distance": 20, "dropout_rate": 0.0,
        "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0,
    }
    if variant == "t5":
        hf_config = transformers.T5Config(**common, feed_forward_proj="relu")
    elif variant == "t5v11":
        hf_config = transformers.T5Config(**common, feed_forward_proj="gated-gelu")
    elif variant == "mt5":  # heads of 12, 48 wide together, in a model 32 wide
        hf_config = transformers.MT5Config(**{**common, "d_kv": 12}, feed_forward_proj="gated-gelu")
    else:  # ByT5: a deeper encoder than decoder
        hf_config = transformers.T5Config(**{**common, "vocab_size": len(tok), "num_layers": 3},
                                          num_decoder_layers=2, feed_forward_proj="gated-gelu")
    torch.manual_seed(seed)
    model_class = transformers.MT5ForConditionalGeneration if variant == "mt5" else \
        transformers.T5ForConditionalGeneration
    model = model_class(hf_config)
    untied = variant != "t5"
    if untied:  # transformers 5 ties a new model's head whatever the config says: a head of its own
        model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is fastest, and kind to a busy machine
    try:
        train_briefly(model, tok, train_steps, training_pairs(seed))
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(directory)
    if untied:  # config.json as the Hub's v1.1, mT5 and ByT5 directories have it
        path = directory / "config.json"
        saved = json.loads(path.read_text(encoding="utf-8"))
        saved.pop("scale_decoder_outputs", None)
        path.write_text(json.dumps({**saved, "tie_word_embeddings": False}, indent=2), encoding="utf-8")
    if spiece_only:
        (directory / "tokenizer.json").unlink()
        (directory / "spiece.model").write_bytes(spiece)
    return directory


def training_pairs(seed: int) -> tuple[list[str], list[str]]:
    """Random sources and :data:`SOURCES`, each with its word-by-word translation (a
    word without one left out)."""
    sources, targets = _pairs(32, seed + 3)
    words = dict(zip(SOURCE_WORDS, TARGET_WORDS))
    return sources + SOURCES, targets + [" ".join(words[w] for w in s.split() if w in words) for s in SOURCES]
