"""examples/benchmarks/bench_linear.py (a GPU benchmark): its shape list, sweep candidates, decode-step
sums and command-line checks, on any machine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from replayssm.kernels.linear import LaunchConfig, default_config

from test_linear import PRESET_SHAPES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_linear", ROOT / "examples" / "benchmarks" / "bench_linear.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_preset_shapes_and_counts(bench):
    """Qwen3.5-4B-like: 24 GDN layers (qkv, z, a, b, out projections), 8 attention layers (q, k, v, o),
    32 MLPs and the tied lm_head, from the meta-device model."""
    shapes = bench.preset_linear_shapes("qwen3.5-4b-like")
    assert shapes == {(8192, 2560): 24 + 8, (4096, 2560): 24, (32, 2560): 48, (2560, 4096): 24 + 8,
                      (1024, 2560): 16, (9216, 2560): 64, (2560, 9216): 32, (248320, 2560): 1}
    assert set(shapes) <= set(PRESET_SHAPES)


def test_sweep_candidates_start_at_the_default_and_are_distinct(bench):
    for (N, K), M in ((2560, 9216), 1), ((1024, 2560), 2), ((32, 2560), 2):
        cands = bench.sweep_candidates(N, K, M, 2, 132)
        assert cands[0] == default_config(N, K, M, 2, 132) and len(set(cands)) == len(cands) >= 8
        assert all(isinstance(c, LaunchConfig) for c in cands)
        for c in cands[1:]:  # one knob away from the default
            assert sum(getattr(c, f) != getattr(cands[0], f) for f in LaunchConfig.__dataclass_fields__) == 1, c


def test_step_sums_weigh_each_shape_by_its_count(bench):
    rows = [{"N": n, "K": k, "M": m, "us": {"cublas": 2.0 * n, "triton": 1.0 * n}}
            for n, k in ((10, 4), (20, 4)) for m in (1, 2)]
    sums = bench.step_sums(rows, {"p": {(10, 4): 3, (20, 4): 1}, "missing": {(30, 4): 1}})
    assert sums == [{"preset": "p", "M": m, "step_us": {"cublas": 100.0, "triton": 50.0}, "speedup": 2.0}
                    for m in (1, 2)]


def test_launch_groups_of_the_presets(bench):
    """The grouped launches a patched batch-1 step makes: Qwen3.5-4B-like's 24 GDN input-projection groups and
    32 gated MLPs, Kimi-Linear-like's 21 KDA q/k/v groups and 27 gated MLPs, none on the Nemotron-like model."""
    assert bench.preset_launch_groups("qwen3.5-4b-like") == {
        ("shared", ((8192, 2560), (4096, 2560), (32, 2560), (32, 2560))): 24,
        ("gated", ((9216, 2560), (9216, 2560))): 32}
    assert bench.preset_launch_groups("kimi-linear-like") == {
        ("shared", ((4096, 2304),) * 3): 21, ("gated", ((9216, 2304), (9216, 2304))): 27}
    assert bench.preset_launch_groups("nemotron3-nano-like") == {}


@pytest.mark.parametrize("kind", ["shared", "gated"])
def test_group_variants_compute_the_same(bench, kind):
    """The timed forms of a group (cuBLAS, separate launches, one launch) give one result (fp32, interpreter)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1, 24, generator=g)
    weights = [torch.randn(n, 24, generator=g) for n in ((16, 16) if kind == "gated" else (8, 16, 4))]
    outs = {name: fn(x, weights) for name, fn in bench.group_variants(kind).items()}
    outs = {name: torch.cat(o, -1) if isinstance(o, list) else o for name, o in outs.items()}
    for name in ("triton", "one_launch"):
        torch.testing.assert_close(outs[name], outs["cublas"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("argv,message", [
    (["--groups", "--sweep"], "--sweep and --groups are separate runs"),
    (["--batches", "1,x"], "--batches takes comma-separated integers"),
    (["--batches", "1,3"], "--batches: at most 2 rows; got 3"),
    (["--presets", "nope"], "--presets: unknown ['nope']"),
    (["--reps", "0"], "--reps must be positive"),
])
def test_bad_input_is_refused_in_one_line(bench, argv, message, capsys):
    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_without_a_gpu_it_says_so(bench, capsys):
    assert bench.main([]) == 2 and "needs a CUDA GPU" in capsys.readouterr().err
