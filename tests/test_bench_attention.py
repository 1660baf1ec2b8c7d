"""examples/benchmarks/bench_attention.py: the ``--smoke`` run (tiny shapes through the Triton interpreter)
writes a row per cell with every variant checked and timed, and bad input is refused in one line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_attention", ROOT / "examples" / "benchmarks" /
                                                  "bench_attention.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_run_writes_a_checked_row_per_cell(bench, tmp_path):
    assert bench.main(["--smoke", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "attention.json").read_text())
    assert [(r["shape"], r["batch"], r["length"]) for r in data["rows"]] == [("smoke-gqa", 2, 40),
                                                                             ("smoke-mla", 2, 40)]
    gqa, mla = data["rows"]
    assert set(gqa["us"]) == {"sdpa_grouped", "sdpa_repeated", "triton"} and set(mla["us"]) == {"sdpa_grouped",
                                                                                               "triton"}
    assert all(v > 0 for r in data["rows"] for v in r["us"].values())
    assert gqa["speedup"]["sdpa_repeated"] == round(gqa["us"]["sdpa_repeated"] / gqa["us"]["triton"], 3)
    assert data["meta"]["command"].endswith("--smoke --out " + str(tmp_path))
    assert "| smoke-mla | 2 | 40 |" in (tmp_path / "attention.md").read_text()


def test_bad_input_is_refused_in_one_line(bench, tmp_path, capsys):
    for args, message in ((["--shapes", "nope"], "--shapes: unknown ['nope']"),
                          (["--batches", "x"], "comma-separated integers"),
                          (["--live", "0"], "--live in (0, 1]"),
                          (["--dtype", "int8"], "--dtype: unknown")):
        assert bench.main(["--smoke", *args, "--out", str(tmp_path / "bad")]) == 2, args
        assert message in capsys.readouterr().err, args
    assert not (tmp_path / "bad").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_without_a_gpu_it_needs_smoke(bench, tmp_path, capsys):
    """The shared device check (run_record.cuda_or_smoke): no CUDA and no --smoke is refused in one line."""
    assert bench.main(["--out", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "bench_attention: needs a CUDA device (--smoke runs tiny shapes anywhere)"
    assert not (tmp_path / "none").exists()
