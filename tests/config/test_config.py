"""Config resolution: layers, casting, and errors that name the key."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from seqtrans import config as cfg
from seqtrans.config import ModelConfig, RunConfig, option
from seqtrans.errors import ConfigError, UsageError


@dataclasses.dataclass(frozen=True)
class DataOptions:
    path: str = option("x.txt", "A file.")
    limit: int | None = option(None, "An optional limit.")
    lowercase: bool = option(False, "Lowercase.")


def resolve(**kw: object) -> RunConfig:
    return cfg.resolve("t", data_cls=DataOptions, **kw)  # type: ignore[arg-type]


def test_defaults_are_the_papers() -> None:
    c = resolve()
    assert (c.model.encoder_layers, c.model.d_model, c.model.d_ff, c.model.heads) == (6, 512, 2048, 8)
    assert c.model.dropout == 0.1 and c.train.label_smoothing == 0.1
    assert c.train.adam_betas == (0.9, 0.98) and c.train.adam_eps == 1e-9 and c.train.warmup == 4000
    assert (c.decode.beam, c.decode.alpha, c.decode.max_len_b) == (4, 0.6, 50)
    assert c.data == DataOptions()


def test_layers_override_in_order(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text('[model]\nd_model = 64\nheads = 4\n[data]\nlimit = 5\n')
    c = resolve(task_defaults={"decode": {"beam": 21}, "model": {"d_model": 1024}},
                task_presets={"default": {"model": {"d_model": 256, "d_ff": 99}}},
                config_file=file, overrides=["model.d_ff=128", "data.lowercase=yes"])
    assert c.decode.beam == 21  # task default
    assert c.model.d_model == 64 and c.model.heads == 4  # file beats preset
    assert c.model.d_ff == 128  # --set beats all
    assert c.data.limit == 5 and c.data.lowercase is True


def test_set_values_are_cast_to_the_field_type() -> None:
    c = resolve(overrides=["train.adam_betas=0.8,0.9", "model.positions=learned", "data.limit=none",
                           "train.max_minutes=2", "model.share_embeddings=false"])
    assert c.train.adam_betas == (0.8, 0.9)
    assert c.model.positions == "learned" and c.data.limit is None
    assert c.train.max_minutes == 2.0 and isinstance(c.train.max_minutes, float)
    assert c.model.share_embeddings is False


@pytest.mark.parametrize("pair, key, words", [
    ("model.d_modle=3", "model.d_modle", "did you mean 'd_model'"),
    ("train.max_steps=abc", "train.max_steps", "expected an integer"),
    ("model.norm=middle", "model.norm", "must be one of"),
    ("model.dropout=1.5", "model.dropout", "must be in [0, 1)"),
    ("model.heads=7", "model.heads", "not divisible"),
    ("data.lowercase=maybe", "data.lowercase", "true or false"),
    ("model=3", "model", "is a section"),
    ("nosection.x=1", "nosection", "unknown key"),
    ("model.encoder_attention=memory", "model.encoder_attention", "use it as model.cross_attention"),
    ("model.decoder_attention=monotonic", "model.decoder_attention", "not a self-attention mechanism"),
    ("model.cross_attention=restricted", "model.cross_attention", "is a self-attention mechanism"),
    ("model.cross_attention=fancy", "model.cross_attention", "must be one of"),
    ("model.cross_attention=location", "model.location_max_length", "needs the longest sequence"),
    ("model.memory_slots=0", "model.memory_slots", "at least 1"),
    ("model.monotonic_noise=-1", "model.monotonic_noise", "must not be negative"),
    ("train.warmup=0", "train.warmup", "must be at least 1, got 0"),
    ("train.patience=-2", "train.patience", "must not be negative, got -2"),
    ("decode.beam=0", "decode.beam", "must be at least 1, got 0"),
    ("decode.top_k=-1", "decode.top_k", "must not be negative, got -1"),
])
def test_bad_overrides_name_the_key(pair: str, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(overrides=[pair])
    assert err.value.key == key
    assert words in str(err.value)


def test_unknown_keys_and_wrong_types_in_a_file_name_the_key(tmp_path: Path) -> None:
    file = tmp_path / "c.json"
    file.write_text(json.dumps({"train": {"warmpu": 10}}))
    with pytest.raises(ConfigError, match="train.warmpu"):
        resolve(config_file=file)
    file.write_text(json.dumps({"model": {"d_model": "big"}}))
    with pytest.raises(ConfigError, match="model.d_model.*integer"):
        resolve(config_file=file)
    file.write_text("{not json")
    with pytest.raises(UsageError, match="c.json: not valid JSON"):
        resolve(config_file=file)


def test_presets_from_the_task_or_the_core() -> None:
    assert resolve(preset="big").model.d_model == 1024
    assert resolve(preset="base").train.average_last == 5
    with pytest.raises(UsageError, match="available: base, big"):
        resolve(preset="huge")


def test_a_resolved_config_round_trips_through_json() -> None:
    c = resolve(overrides=["model.d_model=64", "model.heads=4", "data.limit=3"])
    again = cfg.from_dict(RunConfig, json.loads(json.dumps(cfg.to_dict(c))), data_cls=DataOptions)
    assert again == c


def test_every_option_has_help() -> None:
    rows = cfg.describe(resolve())
    keys = [r[0] for r in rows]
    assert "model.d_model" in keys and "data.limit" in keys and "decode.alpha" in keys
    assert all(r[3] for r in rows), [r[0] for r in rows if not r[3]]
    assert len(keys) == len(set(keys))


def test_model_config_validates_directly() -> None:
    with pytest.raises(ConfigError, match="model.encoder_layers"):
        ModelConfig(encoder_layers=0)
    with pytest.raises(ConfigError, match="model.encoder_attention"):
        ModelConfig(encoder_attention="local")


def test_attention_mechanisms_are_chosen_per_site() -> None:
    c = resolve(overrides=["model.cross_attention=memory", "model.memory_slots=16",
                           "model.decoder_attention=location", "model.location_max_length=64"])
    assert (c.model.encoder_attention, c.model.decoder_attention, c.model.cross_attention) == (
        "scaled_dot", "location", "memory")
    assert c.model.memory_slots == 16
