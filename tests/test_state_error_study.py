"""examples/benchmarks/state_error_study.py --smoke runs on CPU and writes its JSON report."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "benchmarks" / "state_error_study.py"


def test_smoke_mode_writes_a_report(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "state_error_study.json").read_text())
    assert set(report["results"]) == {"tiny:nemotron_h", "tiny:qwen3_5"}
    for seeds in report["results"].values():
        for name, res in seeds["0"].items():
            overall = res["overall"]
            assert overall["steps"] == report["steps"] and 0.0 <= overall["argmax_agreement"] <= 1.0
            assert overall["mean_std"] < 0.2, (name, overall)  # a broken variant is off by whole stds
            assert res["by_position"][0]["start"] == 0
        # the fused per-step bf16 kernel stands in for stock's bf16 state on long GPU runs: same numbers
        stock, perstep = seeds["0"]["stock-bf16"]["overall"], seeds["0"]["perstep-bf16"]["overall"]
        assert abs(stock["mean_std"] - perstep["mean_std"]) <= 1e-3 * stock["mean_std"] + 1e-9
        assert stock["argmax_agreement"] == perstep["argmax_agreement"]


def test_bad_variant_is_refused_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--variants", "replay-int4-nearest-L4", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "unknown variant" in proc.stderr
