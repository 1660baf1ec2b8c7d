"""The small-batch linear kernel against F.linear (Triton interpreter on the CPU, fp32), and its launch rules."""

import os

import pytest
import torch
import torch.nn.functional as F
import triton

from replayssm.kernels import linear as linear_mod
from replayssm.kernels.linear import M_MAX, LaunchConfig, default_config, linear_small_batch, split_plan

needs_triton = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                  reason="Triton kernels need TRITON_INTERPRET=1 or a GPU")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _poison_empty(monkeypatch):
    """Every buffer the kernel allocates starts as NaN, so an unwritten output or partial sum shows."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(linear_mod.torch, "empty", poisoned)


def assert_matches_fp64(y, x, w, b):
    """Within fp32 summation error of the float64 result: 1e-5 of sum |x| |w| (+ |b|)."""
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    scale = F.linear(x.double().abs(), w.double().abs(), None if b is None else b.double().abs())
    assert y.shape == ref.shape and y.dtype == x.dtype
    err = (y.double() - ref).abs()
    assert bool((err <= 1e-5 * scale + 1e-30).all()), f"max error {err.max().item()} (scale {scale.max().item()})"


#: half a unit in the last place, relative: the most one rounding to the dtype can move a value
HALF_ULP = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def assert_within_rounding(y, x, w, b):
    """|y - fp32 result| <= one rounding of the fp32 result to y's dtype plus fp32 summation error (1e-5 of
    sum |x| |w|): what an fp32-accumulating cuBLAS GEMM meets (torch lets cuBLAS reduce split-K partial
    sums in 16 bits, which can exceed it; its error is shown beside the kernel's)."""
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    scale = F.linear(x.float().abs(), w.float().abs(), None if b is None else b.float().abs())
    bound = HALF_ULP[x.dtype] * ref.abs() + 1e-5 * scale
    assert y.dtype == x.dtype and y.shape == ref.shape
    excess = {name: ((out.float() - ref).abs() - bound).max().item()
              for name, out in (("kernel", y), ("cuBLAS", F.linear(x, w, b)))}
    assert excess["kernel"] <= 0, f"largest error minus bound: {excess}"


CASES = [  # (N, K, leading shape of x, config or None for default_config)
    (37, 100, (2,), None),  # N, K not multiples of the tiles
    (64, 128, (1,), None),
    (20, 64, (1, 1), None),
    (50, 300, (2,), LaunchConfig(block_n=4, block_k=64, num_warps=4, split_k=3)),  # split, masked K tail
    (33, 200, (1,), LaunchConfig(block_n=16, block_k=32, num_warps=4, split_k=4)),  # wide column block, split
    (24, 96, (2, 1, 1), LaunchConfig(block_n=8, block_k=64, num_warps=2, split_k=2)),  # 3-D x, 2 rows
    (40, 64, (M_MAX,), LaunchConfig(block_n=1, block_k=64, num_warps=1, num_stages=1)),  # M_MAX rows, 1 column
]


@needs_triton
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("N,K,lead,cfg", CASES)
def test_kernel_matches_f_linear(N, K, lead, cfg, bias, monkeypatch):
    g = torch.Generator().manual_seed(N * K)
    x = torch.randn(*lead, K, generator=g).to(DEVICE)
    w = torch.randn(N, K, generator=g).to(DEVICE)
    b = torch.randn(N, generator=g).to(DEVICE) if bias else None
    _poison_empty(monkeypatch)
    y = linear_small_batch(x, w, b, backend="triton", config=cfg)
    assert y.shape == (*lead, N)
    assert_matches_fp64(y, x, w, b)


@needs_triton
@pytest.mark.parametrize("cfg", [None, LaunchConfig(block_n=4, block_k=32, num_warps=1, split_k=3)])
def test_fp16_rounds_once(cfg, monkeypatch):
    """16-bit loads, bias and the one rounding of the fp32 sum (fp16: the interpreter's bf16 rounds
    differently from the GPU's)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 100, generator=g).half().to(DEVICE)
    w = (torch.randn(37, 100, generator=g) / 10).half().to(DEVICE)
    b = torch.randn(37, generator=g).half().to(DEVICE)
    _poison_empty(monkeypatch)
    assert_within_rounding(linear_small_batch(x, w, b, backend="triton", config=cfg), x, w, b)


@needs_triton
def test_strided_rows_and_deterministic():
    """x rows with a stride (a slice of a longer sequence, as lm_head sees it): no copy needed, and
    two calls agree bit for bit."""
    g = torch.Generator().manual_seed(5)
    h = torch.randn(2, 4, 72, generator=g).to(DEVICE)
    x = h[:, -1:, :]  # (2, 1, 72), row stride 4 * 72
    w = torch.randn(30, 72, generator=g).to(DEVICE)
    cfg = LaunchConfig(block_n=8, block_k=32, num_warps=1, split_k=2)
    y = linear_small_batch(x, w, backend="triton", config=cfg)
    assert_matches_fp64(y, x, w, None)
    assert torch.equal(y, linear_small_batch(x, w, backend="triton", config=cfg))


def test_cpu_path_is_f_linear():
    x, w, b = torch.randn(1, 2, 24), torch.randn(8, 24), torch.randn(8)
    assert torch.equal(linear_small_batch(x, w, b, backend="torch"), F.linear(x, w, b))
    assert linear_small_batch(torch.randn(0, 24), w, backend="torch").shape == (0, 8)


@pytest.mark.parametrize("args,match", [
    (lambda: (torch.randn(2, 24), torch.randn(8, 23)), "weight \\(N, K\\)"),
    (lambda: (torch.randn(2, 24), torch.randn(24, 8).t()), "unit stride"),
    (lambda: (torch.randn(2, 0), torch.randn(8, 0)), "K >= 1"),
    (lambda: (torch.randn(2, 24), torch.randn(8, 24).double()), "one dtype"),
    (lambda: (torch.randn(2, 24), torch.randn(8, 24), torch.randn(8).half()), "one dtype"),
    (lambda: (torch.randn(2, 24), torch.randn(8, 24), torch.randn(7)), "bias \\(N,\\)"),
    (lambda: (torch.randn(M_MAX + 1, 24), torch.randn(8, 24)), f"at most {M_MAX} rows"),
    (lambda: (torch.randn(3, 1, 24), torch.randn(8, 24)), "at most 2 rows of x; got 3"),  # rows over all leading dims
])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_bad_inputs_raise(args, match, backend):
    """Checked before either path runs (so the Triton backend raises them on the CPU too)."""
    with pytest.raises(ValueError, match=match):
        linear_small_batch(*args(), backend=backend)


def test_launch_config_checks():
    with pytest.raises(ValueError, match="power of two"):
        LaunchConfig(block_n=3, block_k=64, num_warps=4)
    with pytest.raises(ValueError, match="positive"):
        LaunchConfig(block_n=8, block_k=64, num_warps=4, split_k=0)
    # split rounded to whole tiles: 10 tiles over 4 programs -> 3 tiles each, 4 programs; over 9 -> 2 each, 5
    assert split_plan(2560, LaunchConfig(8, 256, 4, split_k=4)) == (4, 768)
    assert split_plan(2560, LaunchConfig(8, 256, 4, split_k=9)) == (5, 512)
    assert split_plan(100, LaunchConfig(8, 256, 4, split_k=4)) == (1, 256)


#: every distinct (N, K) of the linear layers of the three benchmark presets (bench_linear.py lists them)
PRESET_SHAPES = [(1024, 3072), (3072, 4096), (3072, 6144), (3072, 7680), (4096, 3072), (6144, 3072), (17504, 3072),
                 (131072, 3072), (32, 2560), (1024, 2560), (2560, 4096), (2560, 9216), (4096, 2560), (8192, 2560),
                 (9216, 2560), (248320, 2560), (32, 2304), (128, 2304), (576, 2304), (2304, 4096), (2304, 9216),
                 (4096, 128), (4096, 2304), (6144, 2304), (8192, 512), (9216, 2304), (163840, 2304)]


@pytest.mark.parametrize("M", [1, 2])
@pytest.mark.parametrize("itemsize", [2, 4])
def test_default_config_rules(M, itemsize):
    """The rule table's promises on every preset shape (132 multiprocessors)."""
    for N, K in PRESET_SHAPES:
        cfg = default_config(N, K, M, itemsize, 132)
        rows = triton.next_power_of_2(M)
        splits, k_per = split_plan(K, cfg)
        programs = triton.cdiv(N, cfg.block_n)
        if cfg.split_k > 1:  # split only for weights worth a second launch, and only when N gives too few programs
            assert N * K * itemsize >= 4 << 20 and programs < 2 * 132 and splits > 1
        if programs < 4 * 132:  # too few programs: the smallest column block
            assert cfg.block_n <= 2
        # the FMA accumulator within 32 fp32 registers a thread; 8 elements a thread unless that breaks it
        threads = 32 * cfg.num_warps
        assert rows * cfg.block_n * cfg.block_k <= 32 * threads
        assert cfg.block_n * cfg.block_k >= 8 * threads or rows * cfg.block_n * cfg.block_k > 16 * threads
        assert K % cfg.block_k == 0 or cfg.block_k >= K  # the K loop needs no mask on these shapes


def test_default_config_splits_a_large_weight_over_few_columns():
    """A weight worth a second launch whose N gives too few programs is split (the preset shapes never are at
    one or two rows): (256, 16384) bf16 at M = 1 has 128 two-column programs, K split 5 ways."""
    cfg = default_config(256, 16384, 1, 2, 132)
    assert (cfg.block_n, cfg.split_k) == (2, 5) and split_plan(16384, cfg) == (5, 7 * 512)
