"""scripts/gpu_check.sh refuses a bad GPU_TEST_PART with one line and exit status 2, before it installs or
writes anything."""

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("part", ["3/2", "0/2", "1/0", "a/b", "1", "1/2/3", " 1/2"])
def test_a_bad_part_exits_2_with_one_line(part, tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, GPU_TEST_PART=part, OUT=str(out))
    run = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""
    assert run.stderr.count("\n") == 1 and f"GPU_TEST_PART must be i/n with 1 <= i <= n; got '{part}'" in run.stderr
    assert not out.exists()
