"""``replayssm --version``, ``--help``, ``env`` and option validation, through the console script."""

from __future__ import annotations

import pytest

from cli_helpers import one_error, parse_json


def test_version(run_cli):
    import replayssm

    proc = run_cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"replayssm {replayssm.__version__}"
    assert proc.stderr == ""


def test_help_lists_commands_exit_codes_and_examples(run_cli):
    proc = run_cli("--help")
    assert proc.returncode == 0, proc.stderr
    for word in ("inspect", "convert", "env", "Exit codes", "130", "--debug", "Examples"):
        assert word in proc.stdout, word


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


def test_invalid_option_values_are_one_line_usage_errors(run_cli, tmp_path):
    out = tmp_path / "out"
    for args, expected in [
        (("--buffer-len", "0"), "--buffer-len"),
        (("--state-dtype", "int8"), "int8"),
        (("--dtype", "fp8"), "fp8"),
    ]:
        proc = run_cli("convert", "tiny:mamba2", out, *args)
        assert proc.returncode == 2, (args, proc.stderr)
        error, hint = one_error(proc.stderr)
        assert expected in error
        assert hint and "replayssm convert --help" in hint
        assert proc.stdout == ""
        assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_invalid_option_json_mode_prints_one_json_error(run_cli, tmp_path):
    proc = run_cli("convert", "tiny:mamba2", tmp_path / "out", "--buffer-len", "999", "--json")
    assert proc.returncode == 2
    doc = parse_json(proc.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 2
    assert "--buffer-len" in doc["error"]["message"]


def test_unknown_command_and_no_arguments(run_cli):
    proc = run_cli("frobnicate")
    assert proc.returncode == 2
    error, _ = one_error(proc.stderr)
    assert "frobnicate" in error
    proc = run_cli()
    assert proc.returncode == 0
    assert "Usage" in proc.stdout


def test_env_table_and_json(run_cli):
    proc = run_cli("env")
    assert proc.returncode == 0, proc.stderr
    for word in ("python", "torch", "triton", "transformers", "triton kernels"):
        assert word in proc.stdout
    proc = run_cli("env", "--json")
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
