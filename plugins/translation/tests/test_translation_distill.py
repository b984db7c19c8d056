"""Distillation of a translation teacher (``seqtrans distill``): the corpus is what the
teacher's predict gives for each training source, it resumes after kill -9 to the same
bytes as an uninterrupted run, a student trains on it with the teacher's vocabulary, and
vocabularies that differ are refused naming both."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seqtrans import load
from seqtrans.plugin import CACHE_ENV, MIRROR_ENV, Example
from translation_data import MULTI30K

TEACHER = ["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=32", "model.d_ff=64",
           "model.heads=2", "data.max_train_examples=240", "data.vocab_size=600", "train.max_steps=4",
           "train.eval_every=4", "train.checkpoint_every=4", "train.max_tokens=1500", "train.max_minutes=0",
           "train.valid_max_examples=4", "decode.beam=2", "decode.max_len_a=0", "decode.max_len_b=6"]


@pytest.fixture(scope="module")
def environment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Multi30k from the shared data through the mirror override, into a fresh cache."""
    env = dict(os.environ)
    env[MIRROR_ENV] = MULTI30K.as_uri()
    env[CACHE_ENV] = str(tmp_path_factory.mktemp("cache"))
    return env


@pytest.fixture(autouse=True)
def _in_process_too(environment: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for key in (MIRROR_ENV, CACHE_ENV):
        monkeypatch.setenv(key, environment[key])


def seqtrans(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "seqtrans", *args], capture_output=True, text=True, env=env,
                          timeout=600)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory, environment: dict[str, str]) -> Path:
    out = tmp_path_factory.mktemp("distill") / "teacher"
    done = seqtrans(environment, "run", "translation", "--out", str(out), "--device", "cpu",
                    "--set", *TEACHER)
    assert done.returncode == 0, done.stderr
    return out


def test_the_corpus_is_the_teachers_predictions_of_its_training_sources(
        teacher: Path, environment: dict[str, str], tmp_path: Path) -> None:
    done = seqtrans(environment, "distill", str(teacher), "--out", str(tmp_path / "corpus"), "--chunk", "64",
                    "--device", "cpu")
    assert done.returncode == 0, done.stderr
    sources = (tmp_path / "corpus" / "train.src").read_text(encoding="utf-8").splitlines()
    targets = (tmp_path / "corpus" / "train.tgt").read_text(encoding="utf-8").splitlines()
    loaded = load(teacher, device="cpu")
    reference = [e for e in loaded.task.read("train") if isinstance(e, Example)]
    assert sources == [e.source for e in reference] and len(sources) == 240
    predicted = subprocess.run([sys.executable, "-m", "seqtrans", "predict", str(teacher), "--device", "cpu"],
                               input="".join(s + "\n" for s in sources), capture_output=True, text=True,
                               env=environment, timeout=600)
    assert predicted.returncode == 0, predicted.stderr
    assert targets == predicted.stdout.splitlines()
    # the printed command trains a student with the teacher's vocabulary
    record = json.loads((tmp_path / "corpus" / "distill.json").read_text())
    assert record["pairs"] == 240 and f"--vocab {teacher}" in done.stdout
    assert f"data.train_tgt={(tmp_path / 'corpus' / 'train.tgt').resolve()}" in record["student_overrides"]
    student = tmp_path / "student"
    done = seqtrans(environment, "run", "translation", "--out", str(student), "--device", "cpu",
                    "--vocab", str(teacher), "--set", *TEACHER, "model.decoder_layers=1",
                    *record["student_overrides"])
    assert done.returncode == 0, done.stderr
    for name in os.listdir(teacher / "vocab"):
        assert (student / "vocab" / name).read_bytes() == (teacher / "vocab" / name).read_bytes()
    # again with the same settings: the finished corpus is kept; --mix adds the references
    assert seqtrans(environment, "distill", str(teacher), "--out", str(tmp_path / "corpus"), "--chunk", "64",
                    "--device", "cpu").returncode == 0
    done = seqtrans(environment, "distill", str(teacher), "--out", str(tmp_path / "corpus"), "--mix",
                    "--device", "cpu")
    assert done.returncode == 2 and "other settings (chunk, mix)" in done.stderr


def test_a_distillation_killed_mid_way_resumes_to_the_same_bytes(
        teacher: Path, environment: dict[str, str], tmp_path: Path) -> None:
    args = [sys.executable, "-m", "seqtrans", "distill", str(teacher), "--chunk", "8", "--device", "cpu",
            "--mix", "--set", "decode.max_len_b=12"]
    whole = subprocess.run([*args, "--out", str(tmp_path / "whole")], capture_output=True, text=True,
                           env=environment, timeout=600)
    assert whole.returncode == 0, whole.stderr

    out = tmp_path / "resumed"
    chunks = tmp_path / "resumed.partial" / "chunks"
    process = subprocess.Popen([*args, "--out", str(out)], env=environment, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while len(list(chunks.glob("*.jsonl")) if chunks.is_dir() else []) < 3:
        assert process.poll() is None and time.monotonic() < deadline, "finished before it could be killed"
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    written = len(list(chunks.glob("*.jsonl")))
    assert not out.exists() and 3 <= written < 30  # 240 sentences in chunks of 8: killed mid-way

    resumed = subprocess.run([*args, "--out", str(out)], capture_output=True, text=True, env=environment,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    for name in ("train.src", "train.tgt"):
        assert (out / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    assert len((out / "train.tgt").read_text(encoding="utf-8").splitlines()) == 2 * 240
    assert not (tmp_path / "resumed.partial").exists()


def test_the_progress_bar_shows_sentences_a_second_and_the_time_left(
        teacher: Path, environment: dict[str, str], tmp_path: Path) -> None:
    done = seqtrans(environment, "--progress", "on", "distill", str(teacher), "--out", str(tmp_path / "c"),
                    "--chunk", "40", "--device", "cpu")
    assert done.returncode == 0, done.stderr
    bar = [line for line in done.stderr.replace("\r", "\n").splitlines() if line.startswith("distill:")]
    assert any("/240" in line and "sent/s" in line and "<" in line for line in bar), done.stderr


def test_a_teacher_of_another_vocabulary_than_the_students_is_refused_naming_both(
        teacher: Path, environment: dict[str, str], tmp_path: Path) -> None:
    student = tmp_path / "student"
    own = [*TEACHER, "data.vocab_size=500"]
    done = seqtrans(environment, "run", "translation", "--out", str(student), "--device", "cpu",
                    "--set", *own)
    assert done.returncode == 0, done.stderr
    done = seqtrans(environment, "run", "translation", "--out", str(student), "--device", "cpu",
                    "--vocab", str(teacher), "--set", *own, "train.max_steps=8")
    assert done.returncode == 2
    assert str(teacher) in done.stderr and str(student / "vocab") in done.stderr
    assert done.stderr.count("sha256") == 2
    done = seqtrans(environment, "run", "copy", "--out", str(tmp_path / "copy"), "--device", "cpu",
                    "--vocab", str(teacher))
    assert done.returncode == 2 and "task 'translation'" in done.stderr and "task 'copy'" in done.stderr
