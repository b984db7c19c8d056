"""Bad config input, drawn by hypothesis: whatever the ``--set`` pairs or the file, the
result is a valid config or a ConfigError naming the key (UsageError naming the file for
a file that does not parse); a config that resolves survives its own JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import seqtrans
from seqtrans import config as cfg
from seqtrans import tasks
from seqtrans.config import RunConfig
from seqtrans.errors import ConfigError, UsageError

TASKS = ("copy", "parsing", "translation")
KEYS = {task: [row[0] for row in cfg.describe(seqtrans.resolve_config(task))] for task in TASKS}
SECTIONS = ("model", "train", "decode", "data")



def _key(task: str) -> st.SearchStrategy[str]:
    """Keys as typed: the task's own most often, near misses, sections, and anything else."""
    other = st.text(max_size=8) | st.sampled_from(
        ["model", "model.", "model.d_modle", "train.warmup.x", ".seed", "seed.x", "data", "task", "", "x.y"])
    return st.integers(0, 3).flatmap(lambda i: other if i == 0 else st.sampled_from(KEYS[task]))


VALUE = st.text(max_size=6) | st.sampled_from([
    "0", "-1", "1", "3", "0.5", "nan", "-inf", "1e400", "true", "no", "none", "", " ", "1,2", "(0.9, 0.98)",
    "[1]", "x", "9" * 30, "1_000", "learned", "unigram"])


def _check(error: ConfigError, typed: set[str], known: list[str]) -> None:
    """A ConfigError names a key that was typed (or a part of one), or the key a range check is on."""
    assert error.key in known or any(t.startswith(error.key) for t in typed), error
    assert str(error) == f"config key '{error.key}': {error.problem}" and error.problem


def _round_trips(config: RunConfig) -> None:
    data_cls = tasks.load(config.task).Config
    again = cfg.from_dict(RunConfig, json.loads(json.dumps(cfg.to_dict(config), allow_nan=False)),
                          data_cls=data_cls)
    assert again == config


@settings(max_examples=200)
@given(data=st.data(), task=st.sampled_from(TASKS))
def test_any_set_pairs_give_a_config_or_an_error_naming_the_key(data: st.DataObject, task: str) -> None:
    pairs = data.draw(st.lists(st.tuples(_key(task), VALUE), min_size=1, max_size=3))
    try:
        config = seqtrans.resolve_config(task, overrides=[f"{k}={v}" for k, v in pairs])
    except ConfigError as err:
        _check(err, {k.strip() for k, _ in pairs}, KEYS[task])
    else:
        _round_trips(config)


JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)
LEAF = st.sampled_from(sorted({k.split(".", 1)[1] for ks in KEYS.values() for k in ks if "." in k}))
SECTION = st.dictionaries(LEAF | st.text(max_size=5), JSON_VALUE, max_size=3)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(task=st.sampled_from(TASKS),
       table=st.dictionaries(st.sampled_from(SECTIONS) | st.text(max_size=5), SECTION | JSON_VALUE,
                             max_size=3))
def test_any_json_config_file_gives_a_config_or_an_error_naming_the_key(tmp_path: Path, task: str,
                                                                         table: dict[str, Any]) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(table))  # NaN and Infinity included, as Python's json writes them
    typed = {f"{section}.{key}" for section, keys in table.items() if isinstance(keys, dict) for key in keys}
    try:
        config = seqtrans.resolve_config(task, config_file=path)
    except ConfigError as err:
        _check(err, typed | set(table) | {"<root>"}, KEYS[task])
    except UsageError as err:  # only a file for another task, which names it
        assert str(err).startswith(f"{path}: is a config for task")
    else:
        _round_trips(config)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=40) | st.text(max_size=40).map(str.encode),
       suffix=st.sampled_from([".json", ".toml"]))
def test_any_bytes_as_a_config_file_give_a_table_or_an_error_naming_the_file(tmp_path: Path, data: bytes,
                                                                               suffix: str) -> None:
    path = tmp_path / f"c{suffix}"
    path.write_bytes(data)
    try:
        loaded = cfg.load_file(path)
    except UsageError as err:
        assert str(err).startswith(f"{path}: ")
    else:
        assert isinstance(loaded, dict)


# ---------------------------------------------------------------- named cases


@pytest.mark.parametrize("pair", ["train.lr_scale=nan", "decode.alpha=inf", "train.clip_norm=-inf",
                                  "train.adam_eps=1e400"])
def test_a_number_that_is_not_finite_is_refused(pair: str) -> None:
    with pytest.raises(ConfigError, match=rf"config key '{pair.split('=')[0]}': expected a finite number"):
        seqtrans.resolve_config("copy", overrides=[pair])


def test_non_finite_numbers_and_deep_nesting_in_a_file_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text('{"train": {"lr_scale": NaN}}')
    with pytest.raises(ConfigError, match="config key 'train.lr_scale': expected a finite number"):
        seqtrans.resolve_config("copy", config_file=path)
    path.write_text('{"train": {"lr_scale": ' + "1" * 400 + "}}")
    with pytest.raises(ConfigError, match="config key 'train.lr_scale': expected a finite number"):
        seqtrans.resolve_config("copy", config_file=path)
    path.write_text("[" * 100_000)
    with pytest.raises(UsageError, match=r"c.json: not a config file: its arrays or tables nest too deeply"):
        seqtrans.resolve_config("copy", config_file=path)
    toml = tmp_path / "c.toml"
    toml.write_text("a = " + "[" * 100_000)
    with pytest.raises(UsageError, match=r"c.toml: not a config file"):
        seqtrans.resolve_config("copy", config_file=toml)


def test_a_mistyped_key_in_a_toml_file_names_the_key_and_the_nearest_one(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[decode]\nbeam = 4\nbrevity = 0.6\n")
    with pytest.raises(ConfigError, match=r"config key 'decode.brevity': unknown key; known keys: "):
        seqtrans.resolve_config("copy", config_file=path)
    path.write_text("[decode]\nbaem = 4\n")
    with pytest.raises(ConfigError, match=r"config key 'decode.baem': unknown key; did you mean 'beam'\?"):
        seqtrans.resolve_config("copy", config_file=path)
    path.write_text("[data]\ntrain_sizes = 4\n")
    with pytest.raises(ConfigError, match=r"'data.train_sizes': unknown key; did you mean 'train_size'"):
        seqtrans.resolve_config("copy", config_file=path)


@pytest.mark.parametrize("key", ["latency_weight", "latency_weight_var"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-0.5", "1e400"])
def test_a_latency_weight_that_is_not_finite_or_is_negative_names_its_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=rf"config key 'train.{key}': "):
        seqtrans.resolve_config("copy", overrides=[f"train.{key}={value}"])


@pytest.mark.parametrize("key", ["latency_weight", "latency_weight_var"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_a_latency_weight_built_in_python_is_checked_too(key: str, value: float) -> None:
    """The schema's own check: a TrainConfig made without the parser (which refuses
    non-finite numbers first) still refuses them, naming the key."""
    with pytest.raises(ConfigError, match=rf"config key 'train.{key}': must be a finite number, 0 or more"):
        cfg.TrainConfig(**{key: value})
    assert getattr(cfg.TrainConfig(**{key: 0.25}), key) == 0.25


@pytest.mark.parametrize("value", ["0", "-0.5", "nan", "inf"])
def test_a_monotonic_temperature_that_is_not_positive_names_its_key(value: str) -> None:
    with pytest.raises(ConfigError, match=r"config key 'model.monotonic_temperature': "):
        seqtrans.resolve_config("copy", overrides=[f"model.monotonic_temperature={value}"])
