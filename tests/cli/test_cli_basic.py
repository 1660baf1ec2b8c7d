"""``replayssm --version``, ``--help``, ``env`` and option validation, through the console script."""

from __future__ import annotations

import pytest

from cli_helpers import one_error, parse_json


@pytest.fixture(scope="module")
def started(cli_batch, tmp_path_factory):
    """The console-script runs of this module, started together."""
    out = tmp_path_factory.mktemp("basic") / "out"
    return {
        "version": cli_batch("--version"),
        "bad-option": (cli_batch("convert", "tiny:mamba2", out, "--buffer-len", "0", "--json"), out),
        "env": cli_batch("env", "--json"),
    }


def test_version(started):
    import replayssm

    proc = started["version"].result()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"replayssm {replayssm.__version__}"
    assert proc.stderr == ""


def test_help_lists_commands_exit_codes_and_examples(capsys):
    from replayssm.cli.main import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for word in ("inspect", "convert", "env", "Exit codes", "130", "--debug", "Examples"):
        assert word in out, word


@pytest.mark.parametrize("command", ["inspect", "convert", "env"])
def test_every_command_has_examples_in_help(command):
    # in-process: the help text is static, a subprocess per command adds nothing
    from replayssm.cli.main import app
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    assert "Examples" in result.output
    assert f"replayssm {command}" in result.output
    assert "Exit codes" in result.output


def test_invalid_option_values_are_one_line_usage_errors(started):
    future, out = started["bad-option"]
    proc = future.result()
    assert proc.returncode == 2, proc.stderr
    error, hint = one_error(proc.stderr)
    assert "--buffer-len" in error
    assert hint and "replayssm convert --help" in hint
    # --json: the same error, plus exactly one JSON object on stdout
    doc = parse_json(proc.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 2
    assert "--buffer-len" in doc["error"]["message"] and doc["error"]["hint"]
    assert list(out.parent.iterdir()) == []


@pytest.mark.parametrize("args, expected", [
    (["convert", "tiny:mamba2", "OUT", "--state-dtype", "int8"], "int8"),
    (["convert", "tiny:mamba2", "OUT", "--dtype", "fp8"], "fp8"),
    (["convert", "tiny:mamba2", "OUT", "--buffer-len", "257"], "--buffer-len"),
    (["convert", "tiny:mamba2", "OUT", "--backend", "cuda"], "--backend"),
    (["convert", "tiny:mamba2"], "OUT_DIR"),
    (["frobnicate"], "frobnicate"),
    (["inspect", "tiny:mamba2", "--buffer-len", "-3"], "--buffer-len"),
])
def test_usage_errors_in_process(args, expected, capsys, tmp_path):
    from replayssm.cli.main import main

    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    assert main(args) == 2
    captured = capsys.readouterr()
    error, hint = one_error(captured.err)
    assert expected in error
    assert hint and "--help" in hint
    assert captured.out == ""
    assert not (tmp_path / "out").exists()


def test_no_arguments_prints_help(capsys):
    from replayssm.cli.main import main

    assert main([]) == 0
    assert "Usage" in capsys.readouterr().out


def test_env_table_and_json(started, capsys):
    from replayssm.cli.main import main

    assert main(["env", "--no-probe"]) == 0
    table = capsys.readouterr().out
    for word in ("python", "torch", "triton", "transformers", "triton kernels"):
        assert word in table
    proc = started["env"].result()
    assert proc.returncode == 0, proc.stderr
    info = parse_json(proc.stdout)
    import torch
    import transformers

    assert info["ok"] is True
    assert info["torch"] == torch.__version__
    assert info["transformers"] == transformers.__version__
    assert isinstance(info["gpus"], list)
    assert set(info["triton_kernels"]) >= {"can_run", "detail"}
    assert info["backend_auto"] in ("triton", "torch")
