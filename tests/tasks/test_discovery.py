"""Task discovery through entry points: lazy listing, isolated failures, clear errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fake_plugins import install
from seqtrans import tasks
from seqtrans.errors import TaskError


@pytest.fixture
def plugin_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    install(tmp_path, "lines_plugin", "1.2", {"lines": "lines_task:LinesTask"})
    install(tmp_path, "broken_plugin", "0.3", {"broken": "broken_task:Nope"})
    install(tmp_path, "wrong_plugin", "1.0", {"wrong": "lines_task:LinesConfig"})
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in ("lines_task", "broken_task"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    return [str(tmp_path)]


def test_listing_reads_metadata_without_importing(plugin_path: list[str]) -> None:
    found = tasks.installed(plugin_path)
    assert set(found) == {"lines", "broken", "wrong"}
    entry = found["lines"][0]
    assert (entry.distribution, entry.version) == ("lines_plugin", "1.2")
    assert entry.target == "lines_task:LinesTask"
    assert "lines_task" not in sys.modules and "broken_task" not in sys.modules


def test_a_broken_plugin_is_named_and_does_not_break_the_others(plugin_path: list[str]) -> None:
    with pytest.raises(TaskError) as err:
        tasks.load("broken", plugin_path)
    message = str(err.value)
    assert "'broken'" in message and "broken_plugin 0.3" in message
    assert "missing_dependency_of_broken_task" in message
    assert tasks.load("lines", plugin_path).name == "lines"


def test_an_object_that_is_not_a_task_is_rejected(plugin_path: list[str]) -> None:
    with pytest.raises(TaskError, match="does not implement the Task protocol; missing: name"):
        tasks.load("wrong", plugin_path)


def test_an_unknown_name_lists_the_available_tasks(plugin_path: list[str]) -> None:
    with pytest.raises(TaskError, match="unknown task 'lnies'; installed tasks: broken, lines, wrong"):
        tasks.load("lnies", plugin_path)


def test_a_duplicate_name_is_an_error_not_a_shadow(tmp_path: Path, plugin_path: list[str]) -> None:
    other = tmp_path / "other"
    install(other, "impostor", "9.9", {"lines": "lines_task:LinesTask"})
    clash = "'lines' is offered by 2 distributions: lines_plugin 1.2.*impostor 9.9"
    with pytest.raises(TaskError, match=clash):
        tasks.load("lines", [*plugin_path, str(other)])
    assert tasks.load("lines", plugin_path).name == "lines"  # alone it still loads


def test_the_distribution_is_named_as_its_metadata_spells_it(tmp_path: Path) -> None:
    install(tmp_path, "Dashed.Plugin-Name", "2.0", {"lines": "lines_task:LinesTask"})
    # packaging tools name the folder by the normalised name; the metadata keeps the real one
    (tmp_path / "Dashed.Plugin-Name-2.0.dist-info").rename(tmp_path / "dashed_plugin_name-2.0.dist-info")
    entry = tasks.find("lines", [str(tmp_path)])
    assert (entry.distribution, entry.version) == ("Dashed.Plugin-Name", "2.0")


def test_the_builtin_copy_task_comes_through_its_entry_point() -> None:
    entry = tasks.find("copy")
    assert entry.distribution == "seqtrans-copy"
    assert entry.target == "seqtrans_copy:CopyTask"
