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



def test_generate_profiler_needs_a_gpu():
    """The graph-step profiler is a GPU tool: on a CPU-only machine one line and exit status 2."""
    if __import__("torch").cuda.is_available():
        import pytest

        pytest.skip("a GPU is present: the profiler would run")
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "benchmarks" / "profile_generate.py")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == "profile_generate.py: needs a CUDA GPU (CUDA-graph decoding)"
