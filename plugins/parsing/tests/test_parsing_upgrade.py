"""Runs saved when the engine held the cursors and word vectors: their settings and
weights converted to the plugin's (the whole runs: tests/test_old_runs.py)."""

from __future__ import annotations

import copy

import pytest

from seqtrans.plugin import Upgrading
from seqtrans_parsing import ParsingTask


def _saved(**model: bool) -> dict:
    return {"task": "parsing", "model": {"d_model": 16, **model}, "data": {"word_vectors": "v.txt"}}


def test_the_task_class_converts_earlier_settings_and_weights() -> None:
    assert isinstance(ParsingTask, Upgrading)
    config = _saved(source_cursor=True, span_cursor=False, source_vectors=True)
    weights = {"cursor.proj.weight": 1, "vectors.proj.weight": 2, "vectors.proj.bias": 3, "output.weight": 4}
    changes = ParsingTask.upgrade(config, weights)
    assert config == {"task": "parsing", "model": {"d_model": 16},
                      "data": {"word_vectors": "v.txt", "source_cursor": True, "span_cursor": False}}
    assert weights == {"extensions.source_cursor.proj.weight": 1, "extensions.source_vectors.proj.weight": 2,
                       "extensions.source_vectors.proj.bias": 3, "output.weight": 4}
    assert len(changes) == 6
    # converted once: nothing more to do
    again_config, again_weights = copy.deepcopy(config), dict(weights)
    assert ParsingTask.upgrade(again_config, again_weights) == []
    assert (again_config, again_weights) == (config, weights)


@pytest.mark.parametrize(("fed", "kept"), [(True, "v.txt"), (False, "")])
def test_vectors_named_but_not_fed_are_dropped(fed: bool, kept: str) -> None:
    """Naming word vectors now feeds them; a run that read them without feeding them keeps none."""
    config = _saved(source_vectors=fed)
    ParsingTask.upgrade(config, {})
    assert config["data"]["word_vectors"] == kept and "source_vectors" not in config["model"]


def test_a_span_cursor_weight_is_not_taken_for_the_source_cursors() -> None:
    weights = {"span_cursor.proj.weight": 1}
    ParsingTask.upgrade(_saved(), weights)
    assert weights == {"extensions.span_cursor.proj.weight": 1}
