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


def test_decode_benchmark_smoke_run(tmp_path):
    """examples/benchmarks/bench_decode.py --smoke (tiny Qwen3.5 on CPU, bf16 weights, an fp32 oracle):
    every variant runs, the table and JSON are written, and ReplaySSM is no further from the fp32
    model than the stock bf16 model is; bad arguments get one line and exit status 2."""
    import json
    import os

    script = str(ROOT / "examples" / "benchmarks" / "bench_decode.py")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", REPLAYSSM_CACHE=str(tmp_path / "c"))
    proc = subprocess.run([sys.executable, script, "--smoke", "--models", "smoke-qwen3.5", "--dtype", "bfloat16",
                           "--reference", "--out", str(tmp_path / "o")], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((tmp_path / "o" / "decode_bench.json").read_text())
    assert data["meta"]["reference"] is True and data["meta"]["dtype"] == "bfloat16"
    (res,) = data["results"]
    (row,) = res["rows"]
    assert row["batch"] == 2 and row["stock_wall_us"] > 0 and row["replay_wall_us"] > 0
    assert row["stock_device_us"] is None  # no CUDA: no kernel trace
    assert 0.5 <= row["argmax_agree"] <= 1.0 and 0 < row["dlogit"] < 0.5
    assert 0 < row["dlogit_stock_ref"] < 0.5
    assert row["dlogit_replay_ref"] <= 1.5 * row["dlogit_stock_ref"]
    assert row["argmax_replay_ref"] >= row["argmax_stock_ref"] - 0.1
    md = (tmp_path / "o" / "decode_bench.md").read_text()
    assert "| batch | stock wall µs |" in md and "Against the stock model with fp32 weights" in md
    assert "recurrent state float32 (stock), float32 (ReplaySSM checkpoint)" in md
    for args, message in ((["--smoke", "--models", "nope"], "--models: unknown nope"),
                          (["--smoke", "--batches", "0"], "must be positive"),
                          ([], "needs a CUDA device")):
        bad = subprocess.run([sys.executable, script, *args, "--out", str(tmp_path / "bad")], capture_output=True,
                             text=True, env=dict(env, CUDA_VISIBLE_DEVICES=""), timeout=300)
        assert bad.returncode == 2 and message in bad.stderr, (args, bad.stderr[-500:])
        assert "Traceback" not in bad.stderr
    assert not (tmp_path / "bad").exists()


def _bench_decode():
    """examples/benchmarks/bench_decode.py imported as a module."""
    sys.path.insert(0, str(ROOT / "examples" / "benchmarks"))
    try:
        import bench_decode
    finally:
        sys.path.pop(0)
    return bench_decode


def test_decode_benchmark_device_time_reads_gpu_events_only(tmp_path):
    """bench_decode.device_time sums kernel, copy and set durations per step (not CPU ops) and ranks kernels by time."""
    import json

    bench_decode = _bench_decode()
    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "small", "dur": 2},
        {"ph": "X", "cat": "kernel", "name": "big", "dur": 10}, {"ph": "X", "cat": "kernel", "name": "big", "dur": 6},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD", "dur": 4},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 100}, {"ph": "i", "cat": "kernel", "name": "x"}]}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    per_step, top = bench_decode.device_time(str(path), steps=2, top=2)
    assert per_step == (2 + 10 + 6 + 4) / 2
    assert top == [["big", 8.0, 1.0], ["Memcpy DtoD", 2.0, 0.5]]


def test_decode_benchmark_keeps_the_batches_that_fit(monkeypatch):
    """A batch that runs out of device memory becomes an error row; the other batches of that child
    are measured and tabled, and the Mamba-2 model (cache kwarg ``cache``/``cache_params``) decodes."""
    import torch

    bench_decode = _bench_decode()
    real = bench_decode.run_batch

    def run_batch(model, Bt, *args):
        if Bt == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 128.00 GiB.\nmore")
        return real(model, Bt, *args)

    monkeypatch.setattr(bench_decode, "run_batch", run_batch)
    spec = dict(model="smoke-mamba2", device="cpu", dtype="float32", L=2, cycles=1, prompt=3, batches=[1, 3],
                state_dtype=None, variant="stock")
    got = bench_decode.run_variant(spec)
    assert got["ssm"].endswith("PyTorch path")
    ok, oom = got["rows"]
    assert ok["checkpoint"] == "float32"
    assert ok["batch"] == 1 and ok["wall_us"] > 0
    assert len(ok["argmax"]) == 1 and len(ok["argmax"][0]) == 2 * 3  # warm-up, timed and last cycle of L = 2
    assert oom == dict(batch=3, error="out of memory: CUDA out of memory. Tried to allocate 128.00 GiB.")
    row = dict(batch=1, stock_wall_us=2.0, replay_wall_us=1.0, x_wall=2.0, stock_device_us=None,
               replay_device_us=None, x_device=None, argmax_agree=1.0, dlogit=0.1)
    meta = dict(versions={}, date="d", dtype="bfloat16", L=2, state_dtype=None, prompt=3, cycles=1, reference=False)
    md = bench_decode.table([dict(model="m", description="d", stock_ssm="x", rows=[row, oom])], meta)
    assert "| 1 | 2 | 1 | 2.00x |" in md and "| 3 | not run: out of memory: CUDA out of memory." in md
