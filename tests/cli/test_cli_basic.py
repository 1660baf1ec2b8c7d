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
    (["convert", "tiny:mamba2", "OUT", "--state-dtype", "int4"], "int4"),
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
    out = capsys.readouterr().out
    assert out.count("Usage:") == 1 and out.count("Exit codes") == 1, out  # once, not twice


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


_ERRORS_WITHOUT_IMPORTS = """
import json, sys
from replayssm.cli.main import main
codes = [main(args) for args in json.loads(sys.argv[1])]
print(json.dumps({"codes": codes, "imported": sorted(m for m in ("torch", "transformers") if m in sys.modules)}))
"""


def test_path_and_option_errors_come_before_importing_torch(tiny_dir, tiny_cache, tmp_path):
    """Errors about paths and options take well under a second: torch and transformers
    (seconds to import) are imported only once those checks passed."""
    import json
    import shutil
    import subprocess
    import sys

    from cli_helpers import cli_env

    src = tmp_path / "src"
    shutil.copytree(tiny_dir("bamba"), src)
    truncated = tmp_path / "truncated"
    shutil.copytree(src, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    no_type = tmp_path / "no-type"
    shutil.copytree(src, no_type)
    config = json.loads((no_type / "config.json").read_text())
    del config["model_type"]
    (no_type / "config.json").write_text(json.dumps(config))
    exists = tmp_path / "exists"
    exists.mkdir()
    out = str(tmp_path / "out")
    cases = [
        ["convert", str(tmp_path / "missing"), out],
        ["convert", str(src), str(exists)],
        ["convert", str(src), out, "--state-dtype", "int4"],
        ["convert", str(src), out, "--device", "gpu"],
        ["convert", str(truncated), out],
        ["convert", str(no_type), out],
        ["convert", "tiny:nope", out],
        ["inspect", str(tmp_path / "missing")],
        ["inspect", str(no_type)],
    ]
    proc = subprocess.run([sys.executable, "-c", _ERRORS_WITHOUT_IMPORTS, json.dumps(cases)], capture_output=True,
                          text=True, timeout=120, env=cli_env(tiny_cache))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["codes"] == [2] * len(cases), proc.stderr
    assert result["imported"] == [], proc.stderr
    assert "has no model_type" in proc.stderr and "upgrade" not in proc.stderr
