"""Every ``replayssm convert`` error: one line + hint, the right exit code, nothing written,
the input unchanged.

The errors the issue lists (missing input, no config.json, truncated or corrupt shard, no
SSM layers, unsupported layer, a crash, Ctrl-C) run through the console script; their
subprocesses start together in the ``cases`` fixture. The remaining variants, whose
subprocess would add nothing (JSON error objects, --debug tracebacks, validation failure,
out of disk, SIGTERM mapping), call the CLI's ``main()`` in-process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cli_helpers import (cli_env, fail_after_first_shard, hooked_cli_command, leftovers, one_error,
                         parse_json, perturb_logits, tree_digest)


def _damage(src, how: str) -> None:
    weights = src / "model.safetensors"
    if how == "truncated":
        os.truncate(weights, weights.stat().st_size - 1000)
    elif how == "corrupt-header":
        data = bytearray(weights.read_bytes())
        data[12:16] = b"\xff\xfe\x00{"
        weights.write_bytes(bytes(data))
    elif how == "no-config":
        (src / "config.json").unlink()


class Case:
    """One failing convert started in the background: its input, its output parent, its result."""

    def __init__(self, root, name, model, *extra, submit, env=None, src=None, command=None):
        self.work = root / name / "work"
        self.work.mkdir(parents=True)
        self.src = src
        self.before = tree_digest(src) if src is not None else None
        self.future = submit("convert", model, self.work / "out", *extra, env=env, command=command)

    def failed(self, code: int = 2):
        proc = self.future.result()
        assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
        assert proc.stdout == ""
        assert leftovers(self.work) == [], leftovers(self.work)  # nothing written, no temporary dir
        if self.src is not None:
            assert tree_digest(self.src) == self.before  # the input is unchanged
        return proc


@pytest.fixture(scope="module")
def cases(cli_batch, tiny_dir, tmp_path_factory):
    """Start every failing convert of this module at once (they are independent)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    root = tmp_path_factory.mktemp("errors")
    inputs = root / "inputs"
    made = {}
    for name, family in [("no-config", "mamba2"), ("truncated", "bamba"), ("corrupt-header", "bamba")]:
        made[name] = inputs / name
        shutil.copytree(tiny_dir(family), made[name])
        _damage(made[name], name)
    made["no-ssm"] = inputs / "tiny-llama"
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2)
    AutoModelForCausalLM.from_config(config).save_pretrained(made["no-ssm"])
    tiny_dir("mamba")
    originals = {"bamba": tree_digest(tiny_dir("bamba"))}
    runs = {name: Case(root, name, path, src=path, submit=cli_batch) for name, path in made.items()}
    runs["missing"] = Case(root, "missing", root / "does-not-exist", submit=cli_batch)
    runs["unsupported"] = Case(root, "unsupported", "tiny:mamba", submit=cli_batch)
    runs["crash"] = Case(root, "crash", "tiny:nemotron_h", src=tiny_dir("nemotron_h"), submit=cli_batch,
                         command=hooked_cli_command("fail"))
    runs["originals"] = originals
    return runs


def test_missing_input(cases):
    error, hint = one_error(cases["missing"].failed().stderr)
    assert "does-not-exist: no such directory" in error and hint


def test_directory_without_config_json(cases):
    error, hint = one_error(cases["no-config"].failed().stderr)
    assert "has no config.json" in error and "config.json" in hint


@pytest.mark.parametrize("how, message", [("truncated", "is truncated"), ("corrupt-header", "is corrupt")])
def test_damaged_shard(how, message, cases, tiny_dir):
    error, hint = one_error(cases[how].failed().stderr)
    assert "model.safetensors" in error and message in error, error
    assert hint and "re-download" in hint
    assert tree_digest(tiny_dir("bamba")) == cases["originals"]["bamba"]  # only the copy was damaged


def test_no_ssm_layers(cases):
    error, hint = one_error(cases["no-ssm"].failed().stderr)
    assert "LlamaForCausalLM has no SSM layer" in error
    assert hint and "replayssm inspect" in hint


def test_unsupported_layer(cases):
    error, hint = one_error(cases["unsupported"].failed().stderr)
    assert "can be rewritten; backbone.layers.0.mixer (MambaMixer)" in error
    assert "Mamba-1" in error
    assert hint and "replayssm inspect" in hint  # every layer is Mamba-1: skipping would leave nothing


def test_crash_leaves_nothing(cases):
    error, hint = one_error(cases["crash"].failed(code=1).stderr)
    assert "unexpected RuntimeError" in error and "nothing was written" in error
    assert "--debug" in hint


def test_skip_unsupported_with_nothing_left_is_still_an_error(capsys, tmp_path):
    from replayssm.cli.main import main

    assert main(["convert", "tiny:jamba", str(tmp_path / "out"), "--skip-unsupported", "--json"]) == 2
    captured = capsys.readouterr()
    error, _ = one_error(captured.err)
    assert "JambaMambaMixer" in error
    doc = parse_json(captured.out)
    assert doc["ok"] is False and doc["error"]["type"] == "UnsupportedLayerError"
    assert leftovers(tmp_path) == []


def test_newer_schema_block_refused(capsys, tiny_dir, tmp_path):
    import replayssm
    from replayssm.cli.main import main

    src = tmp_path / "newer"
    shutil.copytree(tiny_dir("mamba2"), src)
    config = json.loads((src / "config.json").read_text())
    config["replayssm"] = {"schema_version": replayssm.SCHEMA_VERSION + 1, "buffer_len": 16, "layers": []}
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(replayssm.SchemaVersionError, match="schema version") as info:
        replayssm.from_pretrained(src)
    assert "upgrade replayssm" in info.value.hint
    assert main(["convert", str(src), str(tmp_path / "out")]) == 2
    error, hint = one_error(capsys.readouterr().err)
    assert "schema version" in error and "upgrade replayssm" in hint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["newer"]


def test_debug_shows_the_traceback_without_locals(monkeypatch, capsys, tmp_path):
    from replayssm.cli.main import main

    fail_after_first_shard(monkeypatch)
    assert main(["convert", "tiny:nemotron_h", str(tmp_path / "out"), "--no-validate"], debug=True) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "injected failure" in err
    assert "locals" not in err  # tracebacks never show local variables
    assert leftovers(tmp_path) == []


def test_validation_failure_exits_1_and_writes_nothing(monkeypatch, capsys, tmp_path):
    from replayssm.cli.main import main

    perturb_logits(monkeypatch, "replay")
    assert main(["convert", "tiny:mamba2", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    error, hint = one_error(err)
    assert error.startswith("error: validation failed") and "nothing was written" in error
    assert "✗ logits" in err and "exceeds tol" in err
    assert hint
    assert leftovers(tmp_path) == []


def test_sigterm_maps_to_143(monkeypatch, capsys, tmp_path):
    """The SIGTERM handler raises Terminated, which unwinds (cleaning up) and exits 143."""
    import signal as _signal

    import replayssm.conversion as conversion
    from replayssm.cli import main as cli_main

    def terminated(*args, **kwargs):
        cli_main._on_sigterm(_signal.SIGTERM, None)

    monkeypatch.setattr(conversion, "convert", terminated)
    assert cli_main.main(["convert", "tiny:mamba2", str(tmp_path / "out")]) == 143
    error, _ = one_error(capsys.readouterr().err)
    assert "terminated" in error


def signal_masks(pid: int) -> str:
    """The Sig* lines of /proc/PID/status for the process and each of its threads (Linux; else empty)."""
    lines = []
    for status in [Path(f"/proc/{pid}/status"), *sorted(Path(f"/proc/{pid}/task").glob("*/status"))]:
        try:
            text = status.read_text()
        except OSError:
            continue
        sig = [ln for ln in text.splitlines() if ln.startswith(("Sig", "ShdPnd", "Name"))]
        lines.append(f"{status.parent.name}: " + "; ".join(sig))
    return "\n".join(lines)


def test_ctrl_c_while_copying_leaves_nothing(tiny_cache, tiny_dir, tmp_path):
    """A real SIGINT while the output is half written: exit 130, the temporary directory goes away."""
    src = tiny_dir("mamba2")
    before = tree_digest(src)
    work = tmp_path / "work"
    work.mkdir()
    # PYTHONFAULTHANDLER: should the child outlive the interrupt, SIGABRT makes it print every thread's stack
    env = cli_env(tiny_cache, PYTHONFAULTHANDLER="1")
    proc = subprocess.Popen(hooked_cli_command("pause") + ["convert", "tiny:mamba2", str(work / "a" / "out")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8")
    try:
        deadline = time.monotonic() + 120
        shard = None
        while time.monotonic() < deadline and proc.poll() is None:
            found = list(work.glob("a/.out.replayssm-tmp-*/model.safetensors"))
            if found and found[0].stat().st_size == (src / "model.safetensors").stat().st_size:
                shard = found[0]
                break
            time.sleep(0.05)
        assert shard is not None, proc.communicate(timeout=30)
        proc.send_signal(signal.SIGINT)
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            masks = signal_masks(proc.pid)  # was SIGINT (bit 2) blocked, ignored or pending, and in which thread?
            proc.send_signal(signal.SIGABRT)
            _, stacks = proc.communicate(timeout=30)
            pytest.fail(f"convert still ran 60 s after SIGINT; signal masks:\n{masks}\nwhere its threads were:\n"
                        f"{stacks[-6000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (stdout, stderr)
    error, _ = one_error(stderr)
    assert "interrupted; nothing was written" in error
    assert leftovers(work) == []  # the temporary dir and the parent created for it are gone
    assert tree_digest(src) == before


def test_out_of_disk_is_refused_up_front(monkeypatch, capsys, tiny_dir, tmp_path):
    """In-process through the CLI's main(): shutil.disk_usage reports a nearly full disk."""
    from collections import namedtuple

    from replayssm.cli.main import main

    tiny_dir("zamba2")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 10**12 - 4096, 4096))
    work = tmp_path / "work"
    work.mkdir()
    assert main(["convert", "tiny:zamba2", str(work / "out")]) == 2
    captured = capsys.readouterr()
    error, hint = one_error(captured.err)
    assert "not enough disk space" in error and "4.0 KiB free" in error
    assert "plus 16.0 MiB kept free" in error  # the reserve is not hidden
    assert hint and "free some space" in hint
    assert leftovers(work) == []


def test_out_of_disk_while_writing(monkeypatch, capsys, tiny_dir, tmp_path):
    """ENOSPC in the middle of a copy: OutOfDiskError, nothing left behind."""
    import errno

    import replayssm.output_dir as output_dir
    from replayssm.cli.main import main

    tiny_dir("zamba2")
    real_open = open

    class FullDisk:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.fh, name)

    def fake_open(path, mode="r", *args, **kwargs):
        fh = real_open(path, mode, *args, **kwargs)
        return FullDisk(fh) if "x" in mode else fh

    monkeypatch.setattr(output_dir, "open", fake_open, raising=False)
    work = tmp_path / "work"
    work.mkdir()
    assert main(["convert", "tiny:zamba2", str(work / "out"), "--no-validate"]) == 2
    error, hint = one_error(capsys.readouterr().err)
    assert "out of disk space" in error and hint
    assert leftovers(work) == []
