"""Untrusted files: a checkpoint that would run code when unpickled, and plugins that are
not installed (a task name or config value that looks like a module or a file, modules
and metadata lying in the working directory) are refused and never imported or run."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import seqtrans
from fake_plugins import install
from seqtrans import config as cfg
from seqtrans import tasks
from seqtrans.config import ModelConfig, RunConfig, TrainConfig
from seqtrans.data.batches import Pairs
from seqtrans.errors import CheckpointError, ConfigError, TaskError, UsageError
from seqtrans.inference import loading
from seqtrans.model.transformer import Transformer
from seqtrans.training import checkpoint
from seqtrans.training.loop import Trainer


class _System:
    """Unpickled, runs a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch '{self.marker}'",)


class _Exec:
    """Unpickled, runs Python code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",)


def _crafted(path: Path, marker: Path, how: str) -> Path:
    """A file that looks like a seqtrans checkpoint and runs code when it is unpickled."""
    payload = {"format": checkpoint.FORMAT, "config": {"task": "copy"}, "assets": {}, "model": {},
               "hook": _System(marker) if how == "system" else _Exec(marker)}
    if how == "legacy pickle":  # not torch's zip format: the plain pickle torch.load also reads
        path.write_bytes(pickle.dumps(payload, protocol=2))
    else:
        torch.save(payload, path)
    return path


@pytest.mark.parametrize("how", ["system", "exec", "legacy pickle"])
def test_a_checkpoint_that_would_run_code_is_refused_and_runs_nothing(tmp_path: Path, how: str) -> None:
    marker = tmp_path / "marker"
    path = _crafted(tmp_path / "checkpoint_00000001.pt", marker, how)
    with pytest.raises(CheckpointError, match=r"checkpoint_00000001.pt: not a readable checkpoint"):
        checkpoint.load(path)
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        loading.load(path, device="cpu")
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        checkpoint.average([path], tmp_path / "avg.pt")
    assert not marker.exists()
    # the file is live: unpickled without the guard, it does run its code
    if how == "legacy pickle":
        pickle.loads(path.read_bytes())
    else:
        torch.load(path, weights_only=False)
    assert marker.exists()


def test_resuming_from_a_crafted_checkpoint_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    (tmp_path / "run").mkdir()
    _crafted(tmp_path / "run" / checkpoint.checkpoint_name(5), marker, "exec")
    model_config = ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2)
    config = RunConfig(task="copy", model=model_config, train=TrainConfig(average_last=1))
    model = Transformer(model_config, source_vocab_size=12, target_vocab_size=12, shared_vocab=True)
    trainer = Trainer(model, config, Pairs([[4, 2]], [[4]]), directory=tmp_path / "run",
                      device=torch.device("cpu"))
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        trainer.resume()
    assert not marker.exists()


def _seqtrans(*args: str, cwd: Path, module: bool = False) -> subprocess.CompletedProcess[str]:
    """The installed ``seqtrans`` command (or ``python -m seqtrans``) run in ``cwd``."""
    command = [sys.executable, "-m", "seqtrans"] if module else [shutil.which("seqtrans") or "seqtrans"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([*command, *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


def test_evaluate_and_predict_refuse_a_crafted_checkpoint_with_a_one_line_error(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    path = _crafted(run / "checkpoints" / "average.pt", marker, "system")
    for args in (["evaluate", str(run), "--device", "cpu"], ["predict", str(path)]):
        done = _seqtrans(*args, cwd=tmp_path)
        assert done.returncode == 1, done.stderr
        assert f"{path}: not a readable checkpoint" in done.stderr and "Traceback" not in done.stderr
    assert not marker.exists()


# ---------------------------------------------------------------- plugins


_EVIL = "import pathlib\npathlib.Path({marker!r}).write_text('imported')\nclass EvilTask: name = 'evil'\n"


def _plant(directory: Path, marker: Path) -> None:
    """Modules that leave a marker when imported, and metadata that registers them, as a
    data directory or an unpacked archive might hold them."""
    for module in ("seqtrans", "seqtrans_copy", "evil_task", "sitecustomize"):
        (directory / f"{module}.py").write_text(_EVIL.format(marker=str(marker)))
    install(directory, "evil_plugin", "6.6.6", {"evil": "evil_task:EvilTask", "copy": "evil_task:EvilTask"})


@pytest.mark.parametrize("name", ["evil_task:EvilTask", "evil_task", "seqtrans_copy:CopyTask", "os:system",
                                  "./evil_task.py", "evil_task.py", "/tmp/evil_task.py", "../copy",
                                  "plugins/copy", "seqtrans_copy.CopyTask"])
def test_a_task_name_that_looks_like_a_module_or_a_file_is_an_unknown_task(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    marker = tmp_path / "marker"
    (tmp_path / "evil_task.py").write_text(_EVIL.format(marker=str(marker)))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TaskError, match=rf"unknown task '{name}'; installed tasks: "):
        tasks.load(name)
    with pytest.raises(TaskError, match="unknown task"):
        seqtrans.resolve_config(name)
    assert not marker.exists() and "evil_task" not in sys.modules


def test_a_config_or_checkpoint_cannot_name_its_own_task_module(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "marker"
    (tmp_path / "evil_task.py").write_text(_EVIL.format(marker=str(marker)))
    monkeypatch.chdir(tmp_path)
    file = tmp_path / "c.json"
    file.write_text('{"task": "evil_task:EvilTask"}')
    with pytest.raises(UsageError, match="is a config for task 'evil_task:EvilTask', not 'copy'"):
        seqtrans.resolve_config("copy", config_file=file)
    with pytest.raises(ConfigError, match="config key 'task': is 'evil_task:EvilTask', but the command runs"):
        seqtrans.resolve_config("copy", overrides=["task=evil_task:EvilTask"])
    # a checkpoint whose saved config names a module is an unknown task too
    saved = cfg.to_dict(seqtrans.resolve_config("copy"))
    path = tmp_path / "ckpt.pt"
    checkpoint.save_atomic({"format": checkpoint.FORMAT, "config": {**saved, "task": "evil_task:EvilTask"},
                            "assets": {}, "model": {}}, path)
    with pytest.raises(TaskError, match="unknown task 'evil_task:EvilTask'"):
        loading.load(path, device="cpu")
    assert not marker.exists() and "evil_task" not in sys.modules


def test_modules_and_metadata_in_the_working_directory_are_never_loaded(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    _plant(tmp_path, marker)
    done = _seqtrans("tasks", cwd=tmp_path)
    rows = {line.split()[0]: line for line in done.stdout.splitlines()[1:]}
    assert done.returncode == 0 and "evil" not in rows and rows["copy"].rstrip().endswith("ok")
    done = _seqtrans("config", "copy", "--json", cwd=tmp_path)
    assert done.returncode == 0 and '"task": "copy"' in done.stdout
    assert _seqtrans("run", "evil", cwd=tmp_path).returncode == 2
    # 'python -m' puts the working directory first on sys.path, and would run a
    # seqtrans.py there itself; past that, nothing more is taken from there
    (tmp_path / "seqtrans.py").unlink()
    done = _seqtrans("tasks", cwd=tmp_path, module=True)
    assert done.returncode == 0 and "evil" not in done.stdout and "offered by several" not in done.stdout
    assert _seqtrans("config", "copy", cwd=tmp_path, module=True).returncode == 0
    assert not marker.exists()


def test_data_parallel_ranks_do_not_put_the_working_directory_on_their_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from seqtrans.training import distributed

    seen: list[str | None] = []
    monkeypatch.setattr("torch.distributed.run.run",
                        lambda launch: seen.append(os.environ.get("PYTHONSAFEPATH")))
    monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
    assert distributed.launch(2, ["run", "copy"]) == 0
    assert seen == ["1"] and "PYTHONSAFEPATH" not in os.environ  # for the ranks only

