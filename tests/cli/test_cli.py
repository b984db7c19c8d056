"""The command-line contract, checked as written: commands, files, exit status, messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fake_plugins import install

TINY = ["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=32", "model.d_ff=64",
        "model.heads=2", "data.train_size=300", "data.dev_size=20", "data.test_size=30",
        "data.max_length=6", "train.max_steps=12", "train.eval_every=6", "train.checkpoint_every=4",
        "train.log_every=4", "train.max_tokens=256", "train.keep_checkpoints=3", "train.average_last=2",
        "train.max_minutes=0"]


def seqtrans(*args: str, stdin: str | None = None, env: dict[str, str] | None = None,
             cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "seqtrans", *args], input=stdin, capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "run"
    done = seqtrans("run", "copy", "--out", str(out), "--device", "cpu", "--set", *TINY[:6],
                    "--set", *TINY[6:])
    assert done.returncode == 0, done.stderr
    return out


def test_run_writes_the_documented_files(run_dir: Path) -> None:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    for key in ("exact_match", "params", "train_tokens_per_s", "decode_sentences_per_s"):
        assert isinstance(metrics[key], (int, float)), key
    config = json.loads((run_dir / "config.json").read_text())
    assert config["task"] == "copy" and config["model"]["d_model"] == 32
    assert config["train"]["adam_betas"] == [0.9, 0.98] and config["data"]["test_size"] == 30
    assert len((run_dir / "predictions" / "test.txt").read_text().splitlines()) == 30
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["average.pt", "best.pt", "checkpoint_00000004.pt", "checkpoint_00000008.pt",
                     "checkpoint_00000012.pt"]


#: seqtrans.run(config, out) from a plain Python process, whose logging nobody configured
API_RUN = """
import sys
import seqtrans
config = seqtrans.resolve_config("copy", overrides=sys.argv[2:])
seqtrans.run(config, sys.argv[1], device="cpu")
"""


def _files(directory: Path) -> set[str]:
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*")}


def _log_kinds(path: Path) -> set[str]:
    """Each line of a run.log without its time and numbers: the level, the logger and
    the message's first words."""
    kinds = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        level, logger, message = line.split(" ", 4)[2:]
        kinds.add(" ".join([level, logger, *message.split()[:2]]))
    return kinds


def test_the_python_api_writes_the_files_the_command_line_writes(tmp_path: Path) -> None:
    settings = [*TINY, "train.max_steps=5", "train.log_every=2"]
    cli, api = tmp_path / "cli", tmp_path / "api"
    # each prepares its data afresh, so that both logs tell of it alike
    done = seqtrans("run", "copy", "--out", str(cli), "--device", "cpu", "--set", *settings,
                    f"train.data_cache={tmp_path / 'cli-data'}")
    assert done.returncode == 0, done.stderr
    done = subprocess.run([sys.executable, "-c", API_RUN, str(api), *settings,
                           f"train.data_cache={tmp_path / 'api-data'}"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert " INFO " not in done.stderr  # the console shows what it did before: warnings only
    assert {"run.log", "metrics.json", "config.json", "train.jsonl", "predictions/test.txt",
            "checkpoints/average.pt", "vocab"} <= _files(cli)
    assert _files(api) == _files(cli)
    kinds = _log_kinds(cli / "run.log")
    assert {"INFO seqtrans.pipeline: run directory:", "INFO seqtrans.training.loop: step 1",
            "INFO seqtrans.pipeline: test: exact_match"} <= kinds
    assert _log_kinds(api / "run.log") == kinds


def test_predict_reads_stdin_and_writes_one_line_per_input(run_dir: Path) -> None:
    done = seqtrans("predict", str(run_dir), "--device", "cpu", stdin="1 2 3\n\n4 4\n")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert len(lines) == 4 and lines[-1] == ""  # three outputs, the empty input included
    assert all(tok.isdigit() or tok == "<unk>" for line in lines for tok in line.split())
    done = seqtrans("predict", str(run_dir / "checkpoints" / "average.pt"), "--beam", "3",
                    "--set", "decode.nbest=2", stdin="1 2 3\n")
    rank_lines = [line.split("\t") for line in done.stdout.splitlines() if line]
    assert [r[0] for r in rank_lines] == ["1", "2"] and float(rank_lines[0][1]) >= float(rank_lines[1][1])


def test_predict_samples_reproducibly_and_names_a_bad_sampling_key(run_dir: Path) -> None:
    args = ("predict", str(run_dir), "--device", "cpu", "--sample", "3", "--top-k", "4", "--seed", "5")
    first = seqtrans(*args, stdin="1 2 3\n4 4\n")
    assert first.returncode == 0, first.stderr
    blocks = first.stdout.split("\n\n")
    assert [[line.split("\t")[0] for line in b.splitlines()] for b in blocks[:2]] == [["1", "2", "3"]] * 2
    assert seqtrans(*args, stdin="1 2 3\n4 4\n").stdout == first.stdout  # another process
    assert seqtrans(*args, stdin="1 2 3\n").stdout == blocks[0] + "\n\n"  # without its neighbour
    bad = seqtrans("predict", str(run_dir), "--device", "cpu", "--sample", "1", "--top-p", "1.5", stdin="1\n")
    assert bad.returncode == 2 and "decode.top_p" in bad.stderr


def test_predict_forces_prefixes_and_names_a_line_whose_prefix_cannot_be_encoded(run_dir: Path) -> None:
    done = seqtrans("predict", str(run_dir), "--device", "cpu", "--prefixes", "--set",
                    "decode.constrained=false", stdin="1 2 3\t3 3\n4 4\tnine\n5 6\n")
    assert done.returncode == 1
    lines = done.stdout.split("\n")
    assert len(lines) == 4 and lines[0].split()[:2] == ["3", "3"] and lines[1] == "" and lines[2]
    assert "<stdin>:2: target prefix: 1 token(s) not in the model's target vocabulary: '-1'" in done.stderr


def test_predict_reports_symbols_the_model_has_never_seen(run_dir: Path) -> None:
    done = seqtrans("predict", str(run_dir), "--device", "cpu", stdin="1 2 3\n4 57 5 99\n")
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 2
    assert ("<stdin>:2: 2 symbol(s) the model has never seen, read as <unk>: '57', '99', "
            "in the input '4 57 5 99'") in done.stderr


def test_predict_writes_the_outputs_before_a_bad_line_and_names_it(run_dir: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "seqtrans", "predict", str(run_dir), "--device", "cpu"],
                          input=b"1 2 3\n4 4\nbad \xff\n5 6\n", capture_output=True, timeout=300)
    assert done.returncode == 1 and len(done.stdout.decode().splitlines()) == 2
    assert done.stderr.decode().strip().endswith("<stdin>:3: invalid UTF-8 at byte 5 of the line")


def test_predict_stream_writes_outputs_with_their_delays(tmp_path: Path, run_dir: Path) -> None:
    out = tmp_path / "stream"
    done = seqtrans("run", "copy", "--out", str(out), "--device", "cpu", "--set", *TINY,
                    "model.cross_attention=monotonic", "model.causal_encoder=true", "train.max_steps=4",
                    "train.eval_every=4")
    assert done.returncode == 0, done.stderr
    done = seqtrans("predict", str(out), "--stream", "--device", "cpu", stdin="1 2 3\n\n4 4\n")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and lines[1] == "\t"  # an empty line: an empty output, no delays
    del lines[1]
    for line, length in zip(lines, (3, 2)):
        output, delays = line.split("\t")
        assert len(delays.split()) == len(output.split())
        assert all(1 <= int(d) <= length for d in delays.split())
    assert "AL " in done.stderr and "LAAL " in done.stderr
    done = seqtrans("predict", str(out), "--stream", "--device", "cpu", stdin="1 2\n3 57\n")
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 2
    assert "<stdin>:2: 1 symbol(s) the model has never seen, read as <unk>: '57'" in done.stderr
    # an encoder that reads the whole source: under wait-k the prefix read is encoded again at each read
    done = seqtrans("predict", str(run_dir), "--stream", "--device", "cpu", "--set", "decode.wait_k=2",
                    stdin="1 2 3 4\n")
    assert done.returncode == 0, done.stderr
    output, delays = done.stdout.splitlines()[0].split("\t")
    assert [int(d) for d in delays.split()] == [min(i + 2, 4) for i in range(len(output.split()))]


def test_predict_stream_wait_k_reads_k_words_before_each_first_write(tmp_path: Path) -> None:
    out = tmp_path / "waitk"
    done = seqtrans("run", "copy", "--out", str(out), "--device", "cpu", "--set", *TINY,
                    "model.multi_k=true", "model.causal_encoder=true", "train.max_steps=4",
                    "train.eval_every=4")
    assert done.returncode == 0, done.stderr
    written = 0
    for k in (1, 3, 9):
        done = seqtrans("predict", str(out), "--stream", "--device", "cpu", "--set", f"decode.wait_k={k}",
                        "decode.max_len_b=2", stdin="1 2 3 4\n5 5\n")
        assert done.returncode == 0, done.stderr
        for line, length in zip(done.stdout.splitlines(), (4, 2)):
            output, delays = line.split("\t")
            expected = [min(i + k, length) for i in range(len(output.split()))]
            assert [int(d) for d in delays.split()] == expected
            written += len(output.split())
    assert written
    done = seqtrans("predict", str(out), "--stream", "--set", "decode.wait_k=1.5", stdin="1 2\n")
    assert done.returncode == 2 and "decode.wait_k" in done.stderr


def test_evaluate_prints_the_metrics(run_dir: Path, tmp_path: Path) -> None:
    done = seqtrans("evaluate", str(run_dir), "--split", "dev", "--device", "cpu")
    assert done.returncode == 0, done.stderr
    assert 0.0 <= json.loads(done.stdout)["exact_match"] <= 1.0
    done = seqtrans("evaluate", str(run_dir), "--stream", "--device", "cpu", "--set", "decode.wait_k=2",
                    "--output", str(tmp_path / "stream.json"))
    assert done.returncode == 0, done.stderr  # re-encoded: the run's encoder reads the whole source
    assert {"exact_match", "stream_al"} <= set(json.loads(done.stdout))


def test_evaluate_takes_the_sampling_flags_of_predict(run_dir: Path) -> None:
    args = ("evaluate", str(run_dir), "--split", "dev", "--device", "cpu", "--sample", "1", "--top-k", "3",
            "--epsilon", "0.01", "--seed")
    first, again = (seqtrans(*args, "4") for _ in range(2))
    assert first.returncode == 0, first.stderr
    scores = [{k: v for k, v in json.loads(d.stdout).items() if k != "decode_sentences_per_s"}
              for d in (first, again)]
    assert scores[0] == scores[1]  # the same seed, the same samples
    for flag, value, key in (("--top-p", "0", "decode.top_p"), ("--temperature", "0", "decode.temperature")):
        bad = seqtrans("evaluate", str(run_dir), "--device", "cpu", "--sample", "1", flag, value)
        assert bad.returncode == 2 and key in bad.stderr


def test_predict_takes_a_constraints_file_and_names_its_bad_lines(run_dir: Path, tmp_path: Path) -> None:
    constraints = tmp_path / "constraints.jsonl"
    constraints.write_text('{"required": ["5 5"], "banned": ["1"]}\n{"required": ["nine"]}\n\n')
    done = seqtrans("predict", str(run_dir), "--device", "cpu", "--beam", "3", "--constraints",
                    str(constraints), "--set", "decode.constrained=false", stdin="1 2 3\n4 4\n6\n")
    assert done.returncode == 1
    lines = done.stdout.split("\n")
    assert len(lines) == 4 and " 5 5 " in f" {lines[0]} " and "1" not in lines[0].split()
    assert lines[1] == "" and lines[2]
    assert (f"{constraints}:2: required phrase 'nine': 1 token(s) not in the model's target vocabulary"
            in done.stderr)
    missing = seqtrans("predict", str(run_dir), "--device", "cpu", "--constraints", str(tmp_path / "none"),
                       stdin="1\n")
    assert missing.returncode == 2 and "--constraints" in missing.stderr


def test_average_writes_a_loadable_checkpoint(run_dir: Path, tmp_path: Path) -> None:
    ckpts = sorted((run_dir / "checkpoints").glob("checkpoint_*.pt"))
    done = seqtrans("average", *map(str, ckpts), "--out", str(tmp_path / "avg.pt"))
    assert done.returncode == 0, done.stderr
    done = seqtrans("predict", str(tmp_path / "avg.pt"), stdin="5 6\n")
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 1


def test_plot_draws_the_curves_of_a_run(run_dir: Path, tmp_path: Path) -> None:
    done = seqtrans("plot", str(run_dir), "--out", str(tmp_path / "c.png"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")
    records = [json.loads(line) for line in (run_dir / "train.jsonl").read_text().splitlines()]
    assert all("seconds" in r for r in records)  # the time axis has its data


def test_tasks_lists_copy_with_its_distribution() -> None:
    done = seqtrans("tasks")
    assert done.returncode == 0
    row = next(line.split() for line in done.stdout.splitlines() if line.startswith("copy "))
    assert row[1].replace("_", "-") == "seqtrans-copy" and row[2] == "0.1.0" and row[3] == "ok"


@pytest.mark.parametrize("args, words", [
    (["run", "copy", "--set", "model.d_modle=4"], "model.d_modle"),
    (["run", "copy", "--set", "train.max_steps=many"], "train.max_steps"),
    (["run", "copy", "--set", "nokey"], "key=value"),
    (["run", "copy", "--preset", "enormous"], "unknown preset 'enormous'"),
    (["run", "nosuchtask"], "installed tasks: copy"),
    (["run"], "usage:"),
    (["config", "copy", "--config", "/nonexistent/c.toml"], "cannot read config file"),
])
def test_usage_and_config_errors_exit_with_status_2(args: list[str], words: str) -> None:
    done = seqtrans(*args)
    assert done.returncode == 2
    assert words in done.stderr
    assert "Traceback" not in done.stderr


def test_a_data_error_is_one_line_naming_file_and_line(tmp_path: Path) -> None:
    install(tmp_path / "site", "lines_plugin", "1.0", {"lines": "lines_task:LinesTask"})
    good = tmp_path / "good.tsv"
    good.write_text("a b\tb a\nc\tc\n")
    bad = tmp_path / "bad.tsv"
    bad.write_text("a b\tb a\nno tab here\n")
    env = {"PYTHONPATH": str(tmp_path / "site")}
    done = seqtrans("run", "lines", "--preset", "tiny", "--out", str(tmp_path / "run"), "--set",
                    f"data.train={bad}", f"data.dev={good}", f"data.test={good}", env=env)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].endswith(
        f"{bad}:2: expected source<TAB>target, found 1 field(s)")
    assert "Traceback" not in done.stderr


def test_a_third_party_plugin_runs_end_to_end(tmp_path: Path) -> None:
    install(tmp_path / "site", "lines_plugin", "1.0", {"lines": "lines_task:LinesTask"})
    data = tmp_path / "d.tsv"
    data.write_text("a b\tb a\nc d\td c\n")
    env = {"PYTHONPATH": str(tmp_path / "site")}
    done = seqtrans("tasks", env=env)
    assert any(line.split()[:2] == ["lines", "lines_plugin"] for line in done.stdout.splitlines())
    done = seqtrans("run", "lines", "--preset", "tiny", "--out", str(tmp_path / "run"), "--set",
                    f"data.train={data}", f"data.dev={data}", f"data.test={data}", "train.max_steps=3",
                    "train.eval_every=3", "train.checkpoint_every=3", "train.average_last=1",
                    "train.keep_checkpoints=1", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "run" / "config.json").read_text())["decode"]["beam"] == 2  # task default


def test_config_prints_every_key_with_help() -> None:
    done = seqtrans("config", "copy", "--set", "model.d_model=64")
    assert done.returncode == 0
    assert "model.d_model = 64  (int)" in done.stdout
    assert "Model width d_model" in done.stdout
    done = seqtrans("config", "copy", "--preset", "base", "--json")
    assert json.loads(done.stdout)["model"]["d_model"] == 512


def test_help_describes_every_command() -> None:
    done = seqtrans("--help")
    for command in ("tasks", "run", "predict", "evaluate", "average", "config"):
        assert command in done.stdout
    done = seqtrans("run", "--help")
    assert "--preset" in done.stdout and "--set" in done.stdout and "--device" in done.stdout


def test_plugins_can_add_commands(tmp_path: Path) -> None:
    install(tmp_path, "shout_plugin", "0.1", {"shout": "shout_command:main"}, group="seqtrans.commands")
    env = {"PYTHONPATH": str(tmp_path)}
    done = seqtrans("shout", "hello", "world", env=env)
    assert done.returncode == 0 and done.stdout == "HELLO WORLD\n"
    done = seqtrans("-q", "shout", "--fail", env=env)
    assert done.returncode == 1
    assert done.stderr.strip() == "seqtrans shout: error: words.txt:3: not loud enough"
    assert "shout (shout_plugin)" in seqtrans("--help", env=env).stdout
