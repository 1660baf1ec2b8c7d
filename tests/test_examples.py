"""The quickstart example runs and reports identical greedy tokens."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quickstart(tmp_path):
    env = {"REPLAYSSM_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
           "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py"), "--model", "tiny:bamba",
                           "--buffer-len", "3", "--new-tokens", "10", "--device", "cpu"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "model.layers.0.mamba" in proc.stdout
    assert "greedy tokens identical: True" in proc.stdout
    assert "note: on CPU ReplaySSM runs its PyTorch reference, which is slower" in proc.stdout


def test_delta_benchmark_smoke_run(tmp_path):
    """examples/benchmarks/bench_delta.py --smoke (tiny shapes, Triton interpreter on CPU) writes
    its table and JSON with a replay time, a per-step time and a byte floor for every row."""
    import json
    import os

    env = dict(os.environ, TRITON_INTERPRET="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "benchmarks" / "bench_delta.py"), "--smoke",
                           "--compare", '{"ring_by_cursor": false}', "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((tmp_path / "delta_bench.json").read_text())
    assert {r["shape"] for r in data["results"]} == {"smoke-gdn", "smoke-kda"}
    assert data["meta"]["compare"] == {"ring_by_cursor": False}
    for r in data["results"]:
        assert r["step_us"] > 0
        for x in r["replay"].values():
            assert x["us"] > 0 and x["floor_us"] > 0
            assert x["compare_us"] > 0 and x["compare_ratio"] == x["compare_us"] / x["us"]
    md = (tmp_path / "delta_bench.md").read_text()
    assert "| state | batch |" in md and '`{"ring_by_cursor": false}`' in md
    bad = subprocess.run([sys.executable, str(ROOT / "examples" / "benchmarks" / "bench_delta.py"), "--smoke",
                          "--compare", "[1]", "--out", str(tmp_path / "bad")], capture_output=True, text=True,
                         env=env, timeout=300)
    assert bad.returncode == 2 and "--compare takes a JSON object" in bad.stderr
    assert not (tmp_path / "bad").exists()
    unknown = subprocess.run([sys.executable, str(ROOT / "examples" / "benchmarks" / "bench_delta.py"), "--smoke",
                              "--compare", '{"no_such_knob": 1}', "--out", str(tmp_path / "bad")],
                             capture_output=True, text=True, env=env, timeout=300)
    assert unknown.returncode == 2 and "not knobs of delta_replay_decode_triton: no_such_knob" in unknown.stderr
    assert not (tmp_path / "bad").exists()


def test_delta_variants_smoke_run(tmp_path):
    """examples/benchmarks/delta_variants.py --smoke times every variant of every case, then the
    first again; bad knobs, cases and sizes are refused with one line and exit status 2."""
    import json
    import os

    script = str(ROOT / "examples" / "benchmarks" / "delta_variants.py")
    env = dict(os.environ, TRITON_INTERPRET="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    second = {"ring_by_cursor": False, "gate_ring_dtype": "bfloat16"}  # a kernel knob and the script's own
    proc = subprocess.run([sys.executable, script, "--smoke", "--variants", json.dumps([{}, second]),
                           "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "delta_variants.json").read_text())["rows"]
    assert [(r["case"], r["kw"]) for r in rows] == [
        (c, kw) for c in ("smoke-gdn:float32", "smoke-kda:float32") for kw in ({}, second, {})]
    assert all(r["us"] > 0 and r["Bt"] == 2 and r["L"] == 4 for r in rows)
    assert all(r["vs_first"] == 1.0 for r in rows[::3])
    for args, message in ((["--variants", '[{"no_such_knob": 1}]'], "not knobs of delta_replay_decode_triton"),
                          (["--variants", "{}"], "--variants takes a non-empty JSON list"),
                          (["--variants", '[{"gate_ring_dtype": "int8"}]'], "gate_ring_dtype must be one of"),
                          (["--cases", "nope:float32"], "--cases: unknown shape 'nope'"),
                          (["--cases", "smoke-kda:int8"], "checkpoint dtype must be one of"),
                          (["--L", "0"], "--batch and --L must be positive")):
        bad = subprocess.run([sys.executable, script, "--smoke", *args, "--out", str(tmp_path / "bad")],
                             capture_output=True, text=True, env=env, timeout=300)
        assert bad.returncode == 2 and message in bad.stderr, (args, bad.stderr[-500:])
        assert "Traceback" not in bad.stderr
    assert not (tmp_path / "bad").exists()


def test_mamba2_benchmark_smoke_run(tmp_path):
    """examples/benchmarks/bench_mamba2.py --smoke (one tiny shape, Triton interpreter on CPU)
    writes its table and JSON with replay, per-step and transformers times and byte floors."""
    import json
    import os

    env = dict(os.environ, TRITON_INTERPRET="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "benchmarks" / "bench_mamba2.py"), "--smoke",
                           "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((tmp_path / "mamba2_bench.json").read_text())
    assert len(data["results"]) == 2  # fp32 and bf16 checkpoints
    for r in data["results"]:
        assert r["replay_L4_us"] > 0 and r["step_us"] > 0 and r["hf_us"] > 0 and r["replay_L4_floor_us"] > 0
    assert "smoke" in (tmp_path / "mamba2_bench.md").read_text()


def test_cursor_advance_smoke_run(tmp_path):
    """examples/benchmarks/cursor_advance.py --smoke times every cursor-advance variant of both
    kernels (Triton interpreter on CPU) and writes the JSON rows and the markdown table."""
    import json
    import os

    script = str(ROOT / "examples" / "benchmarks" / "cursor_advance.py")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, script, "--smoke", "--out", str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "cursor_advance.json").read_text())["rows"]
    assert [(r["family"], r["shape"]) for r in rows] == [("mamba2", "smoke"), ("delta-one-launch", "smoke-gdn"),
                                                         ("delta-one-launch", "smoke-kda")]
    for r, variants in zip(rows, (("atomic", "cursor", "none"),) + (("kernel", "cursor-first", "cursor"),) * 2):
        assert all(len(r[v]) == 1 and r[v][0] > 0 for v in variants) and r["step"] > 0
    md = (tmp_path / "cursor_advance.md").read_text()
    assert "| smoke-kda | float32 | 2 |" in md and "kernel/cursor-first" in md and "atomic/none" in md
    bad = subprocess.run([sys.executable, script, "--smoke", "--L", "1", "--out", str(tmp_path / "bad")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and "--L must be at least 2" in bad.stderr and "Traceback" not in bad.stderr


def test_bandwidth_ceilings_without_cuda_exits_with_one_line(tmp_path):
    """examples/benchmarks/bandwidth_ceilings.py needs CUDA: without it, a one-line error, a
    non-zero exit and nothing written."""
    import os

    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "benchmarks" / "bandwidth_ceilings.py"), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode != 0
    assert proc.stderr.strip() == "bandwidth_ceilings.py needs a CUDA device"
    assert not (tmp_path / "out").exists()


def test_delta_one_step_smoke_run():
    """examples/benchmarks/delta_one_step.py --smoke runs steps at a fixed cursor (a flush step too)
    with finite outputs; a cursor outside [0, L) and unknown knobs are refused with one line, exit 2."""
    import os

    script = str(ROOT / "examples" / "benchmarks" / "delta_one_step.py")
    env = dict(os.environ, TRITON_INTERPRET="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    for cursor in ("1", "3"):
        proc = subprocess.run([sys.executable, script, "--smoke", "--cursor", cursor, "--steps", "2"],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert f"2 steps at cursor {cursor}; outputs finite: True" in proc.stdout
    for args, message in ((["--cursor", "4"], "--cursor must be in [0, L) = [0, 4), got 4"),
                          (["--knobs", '{"no_such_knob": 1}'], "not knobs of delta_replay_decode_triton: no_such_knob"),
                          (["--case", "smoke-kda:int8"], "checkpoint dtype must be one of")):
        bad = subprocess.run([sys.executable, script, "--smoke", *args], capture_output=True, text=True, env=env,
                             timeout=300)
        assert bad.returncode == 2 and message in bad.stderr, (args, bad.stderr[-500:])
        assert "Traceback" not in bad.stderr


def test_kernel_ab_smoke_run(tmp_path):
    """examples/benchmarks/kernel_ab.py --smoke times a baseline module file, the installed kernel and
    a launch setting on the same data and writes both tables; bad input is refused in one line."""
    import json
    import os

    script = str(ROOT / "examples" / "benchmarks" / "kernel_ab.py")
    baseline = ROOT / "kernels" / "mamba2" / "triton_decode.py"  # any triton_decode.py of the family
    env = dict(os.environ, TRITON_INTERPRET="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    setting = '[{"specialize": false, "BLOCK_P": 8}]'  # BLOCK_P: the configuration is rebuilt (2 lane blocks)
    proc = subprocess.run([sys.executable, script, "--family", "mamba2", "--smoke", "--dtypes", "float32",
                           "--baseline", str(baseline), "--settings", setting, "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((tmp_path / "kernel_ab.json").read_text())
    (row,) = data["rows"]
    assert list(row["us"]) == ["baseline", "default", '{"specialize": false, "BLOCK_P": 8}', "step"]
    assert all(v > 0 for v in row["us"].values()) and row["speed_vs_ref"]["baseline"] == 1.0
    assert data["meta"]["L"] == 2 and "| smoke | 2 | float32 |" in (tmp_path / "kernel_ab.md").read_text()
    assert data["meta"]["stagger"] is False and "cursors all from 0" in (tmp_path / "kernel_ab.md").read_text()
    for args, message in ((["--baseline", str(tmp_path / "nope.py")], "--baseline: no such file"),
                          (["--settings", "{}"], "--settings takes a JSON list of objects"),
                          (["--dtypes", "int8"], "--dtypes: unknown"),
                          (["--batches", "x"], "--batches takes comma-separated integers"),
                          (["--settings", '[{"BLOCK_P": 8}]'], "--settings: unknown ['BLOCK_P']")):
        bad = subprocess.run([sys.executable, script, "--family", "delta", "--smoke", *args, "--out",
                              str(tmp_path / "bad")], capture_output=True, text=True, env=env, timeout=300)
        assert bad.returncode == 2 and message in bad.stderr, (args, bad.stderr[-500:])
        assert "Traceback" not in bad.stderr


def test_staggered_cursors():
    """timing.stagger_cursors (kernel_ab.py --stagger, the benchmarks' staggered cycles) starts row b
    at cursor b % L, in place, for every copy's cursors."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("_timing", ROOT / "examples" / "benchmarks" / "timing.py")
    timing = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(timing)
    cursors = [torch.full((5,), -7, dtype=torch.int32) for _ in range(2)]
    timing.stagger_cursors(cursors, 3)
    for cur in cursors:
        assert cur.dtype == torch.int32 and cur.tolist() == [0, 1, 2, 0, 1]


def test_offline_sass_counts_a_specialized_kernel(tmp_path):
    """examples/benchmarks/offline_sass.py compiles the Mamba-2 replay kernel for sm_90 on a CPU
    machine; the specialized kernel takes the sizes and buffer strides as constants, so it has
    fewer integer arguments, registers and instructions than the runtime-size one."""
    import json
    import os

    script = str(ROOT / "examples" / "benchmarks" / "offline_sass.py")
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, script, "mamba2-2.7b", "1", "float32",
                           '[{}, {"specialize": false}, {"BLOCK_P": 8, "flush_fma": false}]'],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    spec, dyn, refused = [json.loads(line) for line in proc.stdout.splitlines()]
    assert spec["config"]["specialize"] and not dyn["config"]["specialize"]
    assert 0 < spec["int_args"] < dyn["int_args"] and 0 < spec["regs"] < dyn["regs"]
    assert 0 < spec["sass_instructions"] < dyn["sass_instructions"]
    # compiled with the alignment facts of a real launch: the fp32 checkpoint tile is read in wide loads
    assert spec["wide_global_loads"] > 0 and dyn["wide_global_loads"] > 0
    assert spec["programs"] == dyn["programs"] == 320
    assert "tl.dot needs BLOCK_P >= 16" in refused["error"]
    bad = subprocess.run([sys.executable, script, "nope", "1", "float32"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert bad.returncode == 2 and "usage: offline_sass.py" in bad.stderr and "Traceback" not in bad.stderr


def test_two_streams_script_needs_cuda():
    """examples/benchmarks/mamba2_two_streams.py is GPU-only: without CUDA one line and exit status 2."""
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("has CUDA: the script runs for real")
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "benchmarks" / "mamba2_two_streams.py")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "needs a CUDA device" in proc.stderr and "Traceback" not in proc.stderr
