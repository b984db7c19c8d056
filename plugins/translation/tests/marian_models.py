"""Tiny random Hugging Face Marian models, built here with transformers (a test
dependency) and sentencepiece models trained on a few generated sentences, laid out as
a model directory of the Hub is: config.json, model.safetensors, source.spm,
target.spm, vocab.json, tokenizer_config.json."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch

SOURCE_WORDS = (
    "the a small big dog cat house tree runs sees green old man woman child walks near under".split()
)
TARGET_WORDS = (
    "der die das ein eine kleine grosse Hund Katze Haus Baum läuft sieht grüne alte Mann Frau".split()
)


def sentences(words: list[str], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(2, 9))) for _ in range(n)]


def sentencepiece_model(texts: list[str], vocab_size: int) -> bytes:
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=buffer,
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return buffer.getvalue()


def pieces(model: bytes) -> list[str]:
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(model)
    return [
        sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))
    ]


def _pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    """Sources and their word-by-word translations: something a model learns in a few steps."""
    words = dict(zip(SOURCE_WORDS, TARGET_WORDS))
    sources = sentences(list(words), n, seed)
    return sources, [" ".join(words[w] for w in s.split()) for s in sources]


def marian_directory(
    directory: Path,
    *,
    activation: str = "swish",
    scale_embedding: bool = True,
    seed: int = 0,
    d_model: int = 32,
    layers: int = 2,
    train_steps: int = 30,
    **config: Any,
) -> Path:
    """Write a Marian model with its tokenizer files into ``directory``: random weights and a
    random logits bias, trained for ``train_steps`` updates on word-by-word pairs so that its
    outputs follow the input and end by themselves."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    directory.mkdir(parents=True, exist_ok=True)
    source = sentencepiece_model(sentences(SOURCE_WORDS, 200, 1), 60)
    target = sentencepiece_model(sentences(TARGET_WORDS, 200, 2), 60)
    symbols = ["</s>", "<unk>", *sorted(set(pieces(source)) | set(pieces(target))), "<pad>"]
    vocab = {s: i for i, s in enumerate(symbols)}
    pad = vocab["<pad>"]
    (directory / "source.spm").write_bytes(source)
    (directory / "target.spm").write_bytes(target)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "source_lang": "en",
                "target_lang": "de",
                "separate_vocabs": False,
                "model_max_length": 512,
                "tokenizer_class": "MarianTokenizer",
            }
        ),
        encoding="utf-8",
    )
    options: dict[str, Any] = {
        "vocab_size": len(symbols),
        "decoder_vocab_size": len(symbols),
        "d_model": d_model,
        "encoder_layers": layers,
        "decoder_layers": layers,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 2 * d_model,
        "decoder_ffn_dim": 2 * d_model,
        "max_position_embeddings": 128,
        "pad_token_id": pad,
        "eos_token_id": 0,
        "decoder_start_token_id": pad,
        "forced_eos_token_id": 0,
        "activation_function": activation,
        "scale_embedding": scale_embedding,
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        **config,
    }
    torch.manual_seed(seed)
    model = MarianMTModel(MarianConfig(**options))
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.5)  # a buffer, not trained
    if train_steps:
        tokenizer = MarianTokenizer(*(str(directory / n) for n in ("source.spm", "target.spm", "vocab.json")))
        sources, targets = _pairs(32, seed + 3)
        batch = tokenizer(sources, text_target=targets, return_tensors="pt", padding=True)
        batch["labels"] = batch["labels"].masked_fill(batch["labels"].eq(pad), -100)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        model.train()
        for _ in range(train_steps):
            optimizer.zero_grad()
            model(**batch).loss.backward()
            optimizer.step()
        model.eval()
    model.save_pretrained(directory)
    return directory


SOURCES = [
    "the small dog runs near the old house",
    "a cat",
    "the green tree sees a woman walks under the man",
    "child",
    "the big big dog walks near the small cat under a tree",
    "old old old",
    "a woman sees the tree",
    "dog",
]
TARGETS = [
    "der kleine Hund läuft",
    "eine Katze",
    "die grüne Baum sieht eine Frau",
    "das Kind",
    "der grosse Hund läuft die kleine Katze",
    "alte",
    "eine Frau sieht",
    "Hund",
]
