"""Numeric flags of every command refuse NaN and infinity with a usage error naming the
flag (NaN passes every range check, infinity every limit), and ``serve``'s token flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from seqtrans import cli
from seqtrans.cli.parser import build_parser
from seqtrans.cli.serve import token


def _typed_flags() -> list[tuple[str, argparse.Action]]:
    """Every option of every engine command (and the global ones) that converts its value."""
    parser = build_parser()
    found = [("", a) for a in parser._actions if a.type is not None and a.option_strings]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [(name, a) for a in sub._actions if a.type is not None and a.option_strings]
    return [(c, a) for c, a in found if a.type not in (Path, str)]


FLAGS = _typed_flags()


def test_the_flags_checked_include_every_float_flag() -> None:
    names = {a.option_strings[-1] for _, a in FLAGS}
    assert {"--timeout-s", "--header-timeout-s", "--stream-idle-s", "--max-wait-ms", "--temperature",
            "--top-p", "--epsilon", "--port", "--threads", "--beam"} <= names


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "Infinity", "1e999"])
@pytest.mark.parametrize(("command", "action"), FLAGS, ids=[f"{c} {a.option_strings[-1]}" for c, a in FLAGS])
def test_no_numeric_flag_takes_nan_or_infinity(command: str, action: argparse.Action, text: str) -> None:
    assert callable(action.type)
    with pytest.raises((argparse.ArgumentTypeError, ValueError)):
        action.type(text)


@pytest.mark.parametrize("args", [
    ["serve", "RUN", "--timeout-s", "nan"], ["serve", "RUN", "--timeout-s", "inf"],
    ["serve", "RUN", "--header-timeout-s", "nan"], ["serve", "RUN", "--stream-idle-s=-inf"],
    ["serve", "RUN", "--max-wait-ms", "nan"], ["predict", "RUN", "--temperature", "nan"],
    ["evaluate", "RUN", "--top-p", "inf"], ["predict", "RUN", "--epsilon", "1e999"]])
def test_a_non_finite_flag_is_a_usage_error_naming_it(args: list[str],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    flag = next(a for a in args if a.startswith("--")).split("=")[0]
    with pytest.raises(SystemExit) as exited:
        cli.main(args)
    error = capsys.readouterr().err
    assert exited.value.code == 2 and f"argument {flag}: expected a finite number" in error
    assert "Traceback" not in error


def _token_args(**given: str | None) -> argparse.Namespace:
    return argparse.Namespace(**{"token": None, "token_file": None, **given})


def test_the_token_comes_from_a_file_a_flag_or_the_environment(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQTRANS_SERVE_TOKEN", "from-env")
    secret = tmp_path / "token"
    secret.write_text("from-file\n")
    assert token(_token_args(token_file=str(secret))) == "from-file"  # the file wins over the environment
    assert token(_token_args(token="from-flag")) == "from-flag"
    assert token(_token_args()) == "from-env"
    monkeypatch.delenv("SEQTRANS_SERVE_TOKEN")
    assert token(_token_args()) is None


@pytest.mark.parametrize(("flags", "message"), [
    (["--token-file", "{missing}"], "--token-file {missing}: cannot read it"),
    (["--token-file", "{empty}"], "--token-file {empty}: the file is empty"),
    (["--token", ""], "--token: a token must be"),
    (["--token", "a b"], "--token: a token must be"),
    (["--token", "x", "--token-file", "{empty}"], "--token and --token-file: give one of them")])
def test_a_token_that_cannot_be_used_is_a_usage_error_naming_its_source(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str) -> None:
    paths = {"missing": str(tmp_path / "missing"), "empty": str(tmp_path / "empty")}
    (tmp_path / "empty").write_text(" \n")
    assert cli.main(["serve", "RUN", *(f.format(**paths) for f in flags)]) == 2
    assert message.format(**paths) in capsys.readouterr().err


def test_the_token_in_the_environment_is_checked_too(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SEQTRANS_SERVE_TOKEN", "caf\u00e9")
    assert cli.main(["serve", "RUN"]) == 2
    assert "$SEQTRANS_SERVE_TOKEN: a token must be" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["timeout_s", "header_timeout_s", "stream_idle_s", "max_wait_ms"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_serve_settings_from_python_refuse_non_finite_numbers(key: str, value: float) -> None:
    from seqtrans.errors import ConfigError
    from seqtrans.serving.settings import ServeSettings

    with pytest.raises(ConfigError, match=f"{key}.*finite"):
        ServeSettings(**{key: value})
