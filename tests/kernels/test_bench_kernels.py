"""examples/benchmarks/bench_kernels.py runs (``--smoke``: tiny shapes through the Triton interpreter)
and refuses bad input with one line and exit status 2."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "examples" / "benchmarks" / "bench_kernels.py")
ENV = dict(os.environ, TRITON_INTERPRET="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")


def test_smoke_run_times_both_families_and_a_baseline_tree(tmp_path):
    """Every family's smoke shapes, fp32 checkpoints, with this checkout's own kernels/ as the baseline
    tree (loaded beside the installed kernels, custom operators renamed): a replay, baseline and
    per-step time for every row, the baseline as the reference, and both output files."""
    proc = subprocess.run([sys.executable, SCRIPT, "--smoke", "--dtypes", "float32", "--baseline-tree",
                           str(ROOT / "kernels"), "--out", str(tmp_path)], capture_output=True, text=True, env=ENV,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((tmp_path / "kernels.json").read_text())
    assert [(r["family"], r["shape"], r["batch"], r["checkpoint"]) for r in data["rows"]] == [
        ("mamba2", "smoke", 2, "float32"), ("delta", "smoke-gdn", 2, "float32"), ("delta", "smoke-kda", 2, "float32")]
    for r in data["rows"]:
        assert list(r["us"]) == ["replay", "baseline", "step"] and all(v > 0 for v in r["us"].values())
        assert r["speed_vs_ref"]["baseline"] == 1.0 and r["frac_floor"]["replay"] > 0
    assert data["meta"]["reference"] == "baseline" and data["meta"]["L"] == 2
    md = (tmp_path / "kernels.md").read_text()
    assert "| delta | smoke-kda | 2 | float32 |" in md and "`baseline`" in md


def test_bad_input_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """The script's own exit (one case) and its ``main`` in this process (the others, which the
    script's entry point returns as its exit status)."""
    bad = subprocess.run([sys.executable, SCRIPT, "--smoke", "--family", "mamba3", "--out", str(tmp_path / "bad")],
                         capture_output=True, text=True, env=ENV, timeout=300)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr[-500:]
    assert bad.stderr.strip() == "bench_kernels: --family takes mamba2, delta or both; got 'mamba3'"
    for name in ("TRITON_INTERPRET", "HF_HUB_OFFLINE", "TRANSFORMERS_VERBOSITY"):  # restored after the test
        monkeypatch.setenv(name, ENV[name])
    sys.path.insert(0, str(ROOT / "examples" / "benchmarks"))
    import bench_kernels

    for args, message in ((["--batches", "x"], "--batches takes comma-separated integers"),
                          (["--dtypes", "int4"], "--dtypes: unknown"),
                          (["--shapes", "nope"], "--shapes: unknown ['nope']"),
                          (["--L", "1"], "--L at least 2"),
                          (["--baseline-tree", str(tmp_path)], "is not a kernels/ directory"),
                          (["--launch", "block_v"], "--launch takes FIELD=VALUE,..."),
                          (["--family", "delta", "--shapes", "smoke-gdn", "--launch", "warps=2"],
                           "unexpected keyword argument 'warps'")):
        assert bench_kernels.main(["--smoke", *args, "--out", str(tmp_path / "bad")]) == 2, args
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, (args, err[-500:])
    assert not (tmp_path / "bad").exists()


def test_smoke_run_with_8bit_checkpoints(tmp_path):
    """int8 / fp8 checkpoint rows: replay and a baseline tree that reads scales (this checkout's), no
    per-step kernel, with their time relative to bf16 and memory per sequence."""
    out = tmp_path / "bench8"
    proc = subprocess.run([sys.executable, SCRIPT, "--smoke", "--family", "mamba2", "--dtypes",
                           "bfloat16,int8,float8_e4m3fn", "--baseline-tree", str(ROOT / "kernels"),
                           "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["checkpoint"]: r for r in json.loads((out / "kernels.json").read_text())["rows"]}
    assert set(rows["int8"]["us"]) == {"replay", "baseline"} and "vs_bf16" in rows["int8"]
    assert set(rows["bfloat16"]["us"]) == {"replay", "baseline", "step"}
    assert rows["int8"]["mem_vs"]["bfloat16"] < 1 and rows["float8_e4m3fn"]["mem_vs"]["bfloat16"] < 0.7


def test_phases_time_the_output_only_and_flush_steps_apart(tmp_path):
    """``--phases`` adds the output-only and flush steps as their own columns, for a baseline tree too
    (not in the byte-floor fractions, which are per cycle); ``--launch`` a replay column with the cell's
    default launch knobs changed (in the fractions)."""
    out = tmp_path / "phases"
    proc = subprocess.run([sys.executable, SCRIPT, "--smoke", "--family", "delta", "--shapes", "smoke-gdn",
                           "--dtypes", "int8", "--phases", "--baseline-tree", str(ROOT / "kernels"),
                           "--launch", "block_v=16,block_k=16", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, env=ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads((out / "kernels.json").read_text())["rows"]
    launch = "launch[block_v=16,block_k=16]"
    assert set(row["us"]) == {"replay", "baseline", "output", "flush", "baseline_output", "baseline_flush", launch}
    assert min(row["us"].values()) > 0 and set(row["frac_floor"]) == {"replay", "baseline", launch}
    assert row["shape"] == "smoke-gdn" and "| delta | smoke-gdn | " in (out / "kernels.md").read_text()


def test_phase_cursors_take_the_intended_routes():
    """The phase bodies set every row's cursor first: L - 1 flushes (the checkpoint changes, cursors
    wrap to 0), mid-cycle does not (checkpoint untouched, cursors advance by one)."""
    sys.path.insert(0, str(ROOT / "examples" / "benchmarks"))
    import bench_kernels as bench
    import torch

    from replayssm.kernels import delta

    cell = bench.DeltaCell(bench.SMOKE_SHAPES["delta"]["smoke-gdn"], 2, torch.float32, 4, torch.device("cpu"),
                           False, R=1)
    cell.call = lambda mod, copy: mod.delta_replay_decode(*cell.inputs(), *copy[:5], cell.out, backend="torch")
    state, cursor = cell.copies[0][0], cell.copies[0][4]
    before = state.clone()
    body, steps = bench.phase_body(cell, delta, 1)
    body()
    assert steps == 1 and torch.equal(state, before) and cursor.tolist() == [2, 2]
    body, _ = bench.phase_body(cell, delta, 3)
    body()
    assert not torch.equal(state, before) and cursor.tolist() == [0, 0]


def test_baseline_trees_without_scales_are_told_apart():
    """A baseline tree older than the 8-bit checkpoints (no ``state_scale``) is not timed on them."""
    sys.path.insert(0, str(ROOT / "examples" / "benchmarks"))
    import types

    import bench_kernels

    import replayssm.kernels.delta as delta
    import replayssm.kernels.mamba2 as mamba2

    assert bench_kernels.takes_scales(mamba2, "mamba2") and bench_kernels.takes_scales(delta, "delta")
    old = types.SimpleNamespace(mamba2_replay_decode=lambda x, dt, B, C, state, *rest, backend="auto": None)
    assert not bench_kernels.takes_scales(old, "mamba2")


def test_verify_benchmark_smoke_run(tmp_path):
    """examples/benchmarks/bench_verify.py --smoke: a plain step and a verify (+ rollback) time for every
    (shape, T), their ratios, and the run's date / device / versions / command beside the rows."""
    script = str(ROOT / "examples" / "benchmarks" / "bench_verify.py")
    proc = subprocess.run([sys.executable, script, "--smoke", "--out", str(tmp_path)], capture_output=True, text=True,
                          env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((tmp_path / "verify.json").read_text())
    assert data["meta"]["command"].endswith("--smoke --out " + str(tmp_path)) and data["meta"]["date"]
    assert [(r["shape"], r["T"]) for r in data["rows"]] == [("smoke-mamba2", 4), ("smoke-mamba2", 5),
                                                            ("smoke-gdn", 4), ("smoke-gdn", 5)]
    for r in data["rows"]:
        assert r["step_us"] > 0 and r["verify_us"] > 0 and abs(r["T_steps_us"] - r["T"] * r["step_us"]) < 0.1
        assert abs(r["verify_per_step"] - r["verify_us"] / r["step_us"]) < 1e-2 and r["verify_rollback_us"] > 0
        assert abs(r["verify_rollback_per_T_steps"] - r["verify_rollback_us"] / r["T_steps_us"]) < 1e-2
    assert "| smoke-gdn | 2 | float32 | 5 |" in (tmp_path / "verify.md").read_text()


def test_verify_benchmark_times_low_precision_checkpoints(tmp_path):
    """--state-dtypes: a row per checkpoint dtype (int8 / fp8 read through their scales)."""
    script = str(ROOT / "examples" / "benchmarks" / "bench_verify.py")
    proc = subprocess.run([sys.executable, script, "--smoke", "--T", "4", "--state-dtypes", "float32,int8,float8_e4m3fn",
                           "--out", str(tmp_path)], capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "verify.json").read_text())["rows"]
    assert [(r["shape"], r["state"]) for r in rows] == [(s, d) for s in ("smoke-mamba2", "smoke-gdn")
                                                        for d in ("float32", "int8", "float8_e4m3fn")]
    assert all(r["verify_us"] > 0 and r["step_us"] > 0 for r in rows)


def test_verify_benchmark_beside_a_baseline_tree(tmp_path):
    """bench_verify.py --baseline-tree: this checkout's own kernels/ as the baseline, timed on the same
    data (a time and the ratio in every row, and two more columns); bad input (a directory that is
    not a kernels/ tree, malformed or too long windows) is refused in one line, before any output."""
    script = str(ROOT / "examples" / "benchmarks" / "bench_verify.py")
    proc = subprocess.run([sys.executable, script, "--smoke", "--T", "4", "--baseline-tree", str(ROOT / "kernels"),
                           "--out", str(tmp_path)], capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "verify.json").read_text())["rows"]
    assert [r["shape"] for r in rows] == ["smoke-mamba2", "smoke-gdn"]
    for r in rows:
        assert r["baseline_verify_rollback_us"] > 0
        assert abs(r["vs_baseline"] - r["verify_rollback_us"] / r["baseline_verify_rollback_us"]) < 1e-2
    assert "| vs baseline |" in (tmp_path / "verify.md").read_text()
    for args, message in ((["--baseline-tree", str(tmp_path)], "is not a kernels/ directory"),
                          (["--batches", "x"], "--batches takes comma-separated integers"),
                          (["--T", "0,4"], "--T takes positive integers"),
                          (["--T", "9", "--L", "8"], "--T values must be at most --L"),
                          (["--state-dtypes", "int4"], "--state-dtypes takes comma-separated names")):
        bad = subprocess.run([sys.executable, script, "--smoke", *args, "--out", str(tmp_path / "bad")],
                             capture_output=True, text=True, env=ENV, timeout=300)
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr, (args, bad.stderr)
        assert len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()


def test_speculative_benchmark_smoke_run(tmp_path):
    """examples/benchmarks/bench_speculative.py --smoke: an oracle drafter at every acceptance rate and
    prompt lookup reproduce plain greedy decoding; acceptance 1 accepts every draft, 0 none."""
    script = str(ROOT / "examples" / "benchmarks" / "bench_speculative.py")
    proc = subprocess.run([sys.executable, script, "--smoke", "--accept", "1,0.5,0", "--stock", "--out",
                           str(tmp_path)], capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((tmp_path / "speculative.json").read_text())
    rows, stock = data["rows"][:6], data["rows"][6:]
    assert [r["mode"] for r in rows] == ["plain, eager"] + ["oracle drafter, 4 per round, eager"] * 3 + [
        "prompt lookup, repeating prompt, eager", "draft model (Llama, 2 layers, hidden 512, random), eager"]
    major, minor = (int(p) for p in data["meta"]["transformers"].split(".")[:2])
    stateful = (major, minor) < (5, 25)  # transformers up to 5.24 refuses assisted decoding of the stock model
    assert [r["mode"] for r in stock] == ["plain, stock transformers, eager"] + (
        [] if stateful else ["oracle drafter, 4 per round, stock transformers, eager"])
    assert all(r["same_as_plain"] for r in stock) and (stateful or stock[1]["acceptance"] == 1.0)
    assert all(r["same_as_plain"] and r["e2e_tokens_per_s"] > 0 for r in rows)
    # decode rates and round times are differences of two runs' times: positive, or (where this loaded machine's
    # noise made the long run no longer than the short one) left out with a note
    noise_note = _load_bench_speculative().NOISE_NOTE
    for r in rows:
        assert (r["tokens_per_s"] is None) == (r.get("note") == noise_note)
        assert r["tokens_per_s"] is None or r["tokens_per_s"] > 0
    for r in rows[1:4]:  # fp32: the plain continuation is the speculative one; every round timed in parts
        assert r["oracle_runs"] == 1 and r["settled"] and r["forward_ms"] > 0
        assert (r["round_ms"] is None) == (r["host_ms"] is None) == (r["tokens_per_s"] is None)
        if r["round_ms"] is not None:
            assert r["round_ms"] > 0 and abs(r["forward_ms"] + r["host_ms"] - r["round_ms"]) < 2e-3
    for key in ("", "e2e_"):
        base = rows[0][f"{key}tokens_per_s"]
        assert all(abs(r[f"{key}vs_plain"] - r[f"{key}tokens_per_s"] / base) < 1e-2 if r[f"{key}tokens_per_s"]
                   and base else r[f"{key}vs_plain"] is None for r in rows)
    assert [r["accept"] for r in rows[1:4]] == [1.0, 0.5, 0.0]
    for r in rows[4:]:  # transformers' drafters, counted through its candidate generator: 4 drafted a round
        assert r["rounds"] > 0 and 0.0 <= r["acceptance"] <= 1.0
    assert rows[1]["acceptance"] == 1.0 and rows[3]["acceptance"] == 0.0 and rows[1]["rounds"] < rows[3]["rounds"]
    assert data["meta"]["model"] == "tiny:nemotron_h" and "--smoke" in data["meta"]["command"]
    assert data["meta"]["dtype"] == "float32" and data["meta"]["host_launch_us"] > 0
    assert f"host {data['meta']['host_launch_us']} µs an eager launch" in (tmp_path / "speculative.md").read_text()
    bad = subprocess.run([sys.executable, script, "--smoke", "--draft", "16"], capture_output=True, text=True,
                         env=ENV, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--draft must be below --buffer-len" in bad.stderr
    bad = subprocess.run([sys.executable, script, "--short-tokens", "200"], capture_output=True, text=True,
                         env=ENV, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--short-tokens must be within" in bad.stderr


def test_speculative_benchmark_leaves_out_figures_that_noise_made_meaningless():
    """A decode rate differenced from two runs is None (not a huge or negative number) where the long run took no
    longer than the short one; otherwise tokens over the extra seconds."""
    bench = _load_bench_speculative()
    ids = lambda n: torch.zeros(1, n, dtype=torch.long)  # noqa: E731
    assert bench._decode_rate((ids(40), 2.0), (ids(10), 1.5)) == 60.0
    assert bench._decode_rate((ids(40), 1.5), (ids(10), 1.5)) is None
    assert bench._decode_rate((ids(40), 1.2), (ids(10), 1.5)) is None
    assert bench._extra_seconds((ids(40), 1.2), (ids(10), 1.5)) is None
    assert bench._ratio(None, 2.0) is None and bench._ratio(3.0, None) is None and bench._ratio(3.0, 2.0) == 1.5
    assert bench._cell(None) == "n/a" and bench._cell(1.25) == "1.25"


def _load_bench_speculative():
    spec = importlib.util.spec_from_file_location("bench_speculative",
                                                  ROOT / "examples" / "benchmarks" / "bench_speculative.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
