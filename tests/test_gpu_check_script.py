"""scripts/gpu_check.sh refuses a bad GPU_TEST_PART or BENCH_SET with one line and exit status 2, before it
installs or writes anything."""

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("part", ["3/2", "0/2", "1/0", "a/b", "1", "1/2/3", " 1/2"])
def test_a_bad_part_exits_2_with_one_line(part, tmp_path):
    _expect_refusal(tmp_path, dict(GPU_TEST_PART=part), f"GPU_TEST_PART must be i/n with 1 <= i <= n; got '{part}'")


@pytest.mark.parametrize("bench_set", ["target", "ALL", " targets"])
def test_a_bad_bench_set_exits_2_with_one_line(bench_set, tmp_path):
    _expect_refusal(tmp_path, dict(BENCH_SET=bench_set), f"BENCH_SET must be all or targets; got '{bench_set}'")


def _run(tmp_path, variables):
    env = dict(os.environ, OUT=str(tmp_path / "out"), **variables)
    return subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                          timeout=60)


def _expect_refusal(tmp_path, variables, message):
    run = _run(tmp_path, variables)
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""
    assert run.stderr.count("\n") == 1 and message in run.stderr
    assert not (tmp_path / "out").exists()
