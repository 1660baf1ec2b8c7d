"""The small-batch linear kernel against F.linear (Triton interpreter on the CPU, fp32), and its launch rules."""

import os

import pytest
import torch
import torch.nn.functional as F
import triton

from replayssm.kernels import linear as linear_mod
from replayssm.kernels.linear import (ACTIVATIONS, M_MAX, LaunchConfig, default_config, linear_small_batch,
                                      linear_small_batch_gated, linear_small_batch_gated_reference,
                                      linear_small_batch_group, split_plan)

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


def _gated_bound(x, g, u, activation):
    """fp64 act(x g^T) * (x u^T) and what fp32 sums may move it: 1e-5 of sum |x||g| through act' (at most 1.13)
    times |x u^T|, plus 1e-5 of sum |x||u| times |act(x g^T)|, plus 1e-6 relative (fp32 activation, product)."""
    xd, gd, ud = x.double(), g.double(), u.double()
    gate, up = F.linear(xd, gd), F.linear(xd, ud)
    act = ACTIVATIONS[activation](gate)
    bound = (1e-5 * 1.13 * F.linear(xd.abs(), gd.abs()) * up.abs() + 1e-5 * act.abs() * F.linear(xd.abs(), ud.abs())
             + 1e-6 * (act * up).abs())
    return act * up, bound


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


#: grouped weights of uneven widths (partial column blocks at every boundary), K = 72 (masked K tail)
GROUP_WIDTHS, GROUP_K = (3, 26, 17, 32), 72
#: split K: 5 tiles of 16 over 3 programs, the last one's tile masked; 8-column blocks
SPLIT = LaunchConfig(block_n=8, block_k=16, num_warps=2, split_k=3)


def _group_data(count, bias, seed=0):
    """x (2, 72) and ``count`` weights (N_i, 72), the odd ones column slices of a wider tensor (own row strides)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, GROUP_K, generator=g)
    ws = [torch.randn(n, GROUP_K + 28 * (i % 2), generator=g).to(DEVICE)[:, 28 * (i % 2):]
          for i, n in enumerate(GROUP_WIDTHS[:count])]
    bs = [torch.randn(n, generator=g).to(DEVICE) for n in GROUP_WIDTHS[:count]] if bias else None
    return x.to(DEVICE), ws, bs


@needs_triton
@pytest.mark.parametrize("count,bias,cfg", [(c, False, None) for c in (1, 2, 3, 4)]
                         + [(c, True, SPLIT) for c in (1, 2, 3, 4)] + [(2, True, None), (3, False, SPLIT)])
def test_group_matches_f_linear_on_the_concatenation(count, bias, cfg, monkeypatch):
    """Every output column written, from its own weight (widths 3, 26, 17, 32 in blocks of 2 or 8 columns: partial
    blocks at the boundaries; strided rows), with and without split K and bias."""
    x, ws, bs = _group_data(count, bias, seed=count)
    if count > 1:
        assert ws[1].stride(0) == GROUP_K + 28  # a column slice: its own row stride
    _poison_empty(monkeypatch)
    y = linear_small_batch_group(x, ws, bs, backend="triton", config=cfg)
    assert y.shape == (2, sum(GROUP_WIDTHS[:count])) and not y.isnan().any()
    assert_matches_fp64(y, x, torch.cat(ws), None if bs is None else torch.cat(bs))


@needs_triton
@pytest.mark.parametrize("bias", [False, True])
def test_group_of_one_is_linear_small_batch(bias):
    """The single-weight entry is the 1-weight case of the same kernel: bit for bit, split or not."""
    x = _group_data(1, bias)[0]
    w, b = torch.randn(13, GROUP_K).to(DEVICE), None if not bias else torch.randn(13).to(DEVICE)
    for cfg in (None, SPLIT):
        assert torch.equal(linear_small_batch_group(x, [w], None if b is None else [b], backend="triton", config=cfg),
                           linear_small_batch(x, w, b, backend="triton", config=cfg))


def test_group_cpu_path_is_f_linear_on_the_concatenation():
    x, ws, bs = _group_data(3, bias=True)
    x, ws, bs = x.cpu(), [w.cpu() for w in ws], [b.cpu() for b in bs]
    assert torch.equal(linear_small_batch_group(x, ws, bs, backend="torch"), F.linear(x, torch.cat(ws), torch.cat(bs)))
    assert torch.equal(linear_small_batch_group(x, ws, [None] * 3, backend="torch"), F.linear(x, torch.cat(ws)))


@needs_triton
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("cfg", [None, LaunchConfig(block_n=8, block_k=32, num_warps=2, split_k=3)])
def test_gated_matches_its_reference(activation, cfg, monkeypatch):
    """act(x g^T) * (x u^T) from fp32 sums against the reference (and both against fp64); the up weight a strided
    column slice; a split_k > 1 config runs unsplit (gated launches never split)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 1, 100, generator=g).to(DEVICE)
    gate = (torch.randn(37, 100, generator=g) / 5).to(DEVICE)
    up = torch.randn(37, 130, generator=g).to(DEVICE)[:, 30:]
    assert up.stride(0) == 130  # a column slice: its own row stride
    _poison_empty(monkeypatch)
    y = linear_small_batch_gated(x, gate, up, activation=activation, backend="triton", config=cfg)
    ref = linear_small_batch_gated_reference(x, gate, up, activation)
    want, bound = _gated_bound(x, gate, up, activation)
    assert y.shape == ref.shape == (2, 1, 37) and y.dtype == ref.dtype == x.dtype and not y.isnan().any()
    for out in (y, ref):
        assert bool(((out.double() - want).abs() <= bound + 1e-30).all())
    if activation == "relu":  # the activation is applied: about half the gate sums are negative
        assert bool((y == 0).any()) and bool((y != 0).any())


@needs_triton
def test_gated_fp16_rounds_once():
    """16-bit loads, the activation and product on the fp32 sums, one rounding: within half an ulp (plus fp32
    error) of the fp32 result; three roundings (two GEMVs, act, product in fp16) need not be."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(1, 96, generator=g).half().to(DEVICE)
    gate, up = ((torch.randn(48, 96, generator=g) / 10).half().to(DEVICE) for _ in range(2))
    y = linear_small_batch_gated(x, gate, up, backend="triton")
    want, bound = _gated_bound(x, gate, up, "silu")
    assert y.dtype == torch.float16
    assert bool(((y.double() - want).abs() <= HALF_ULP[torch.float16] * want.abs() + bound).all())


def test_gated_cpu_path_is_its_reference():
    x, gate, up = torch.randn(1, 24).bfloat16(), torch.randn(8, 24).bfloat16(), torch.randn(8, 24).bfloat16()
    y = linear_small_batch_gated(x, gate, up, activation="gelu_tanh", backend="torch")
    assert y.dtype == torch.bfloat16
    want = F.gelu(x.float() @ gate.float().T, approximate="tanh") * (x.float() @ up.float().T)
    assert torch.equal(y, want.bfloat16())


def test_gated_plan_never_splits():
    """(256, 16384) at one row splits K for a plain launch (see below), never for the gated pair."""
    assert linear_mod._launch_plan((256,), 16384, 1, 2, 132, None, False)[3] > 1
    assert linear_mod._launch_plan((256,), 16384, 1, 2, 132, None, True)[3] == 1


def _w(n=8, k=24):
    return torch.randn(n, k)


@pytest.mark.parametrize("call,match", [
    (lambda: linear_small_batch_group(torch.randn(2, 24), []), "1 to 4 weights; got 0"),
    (lambda: linear_small_batch_group(torch.randn(2, 24), [_w()] * 5), "1 to 4 weights; got 5"),
    (lambda: linear_small_batch_group(torch.randn(2, 24), _w()), "tuple or list .* got Tensor"),
    (lambda: linear_small_batch_group(torch.randn(2, 24), [_w(), _w(8, 23)]), "weights\\[1\\] \\(N, K\\)"),
    (lambda: linear_small_batch_group(torch.randn(2, 24), [_w(), _w(24, 8).t()]), "unit stride"),
    (lambda: linear_small_batch_group(torch.randn(2, 24), [_w(), _w().half()]), "one dtype"),
    (lambda: linear_small_batch_group(torch.randn(2, 24), [_w(), _w().to("meta")]), "on x's device"),
    (lambda: linear_small_batch_group(torch.randn(2, 24), [_w(), _w()], [torch.randn(8)]), "2 entries"),
    (lambda: linear_small_batch_group(torch.randn(2, 24), [_w(), _w()], [torch.randn(8), None]), "all None or all"),
    (lambda: linear_small_batch_group(torch.randn(2, 24), [_w(), _w(5)], [torch.randn(8)] * 2),
     "biases\\[1\\] \\(N,\\) = \\(5,\\)"),
    (lambda: linear_small_batch_group(torch.randn(3, 24), [_w()]), "at most 2 rows of x; got 3"),
    (lambda: linear_small_batch_gated(torch.randn(1, 24), _w(), _w(9)), "one shape .* \\(8, 24\\) and \\(9, 24\\)"),
    (lambda: linear_small_batch_gated(torch.randn(1, 24), _w(), _w().half()), "one dtype"),
    (lambda: linear_small_batch_gated(torch.randn(1, 24), _w(), _w(), activation="gelu"),
     "'silu', 'gelu_tanh', 'relu'; got 'gelu'"),
    (lambda: linear_small_batch_gated(torch.randn(3, 24), _w(), _w()), "at most 2 rows"),
])
def test_group_and_gated_bad_inputs_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()


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
        # at most 4 warps; the FMA accumulator within 16 fp32 registers a thread, 8 weight elements a thread
        threads = 32 * cfg.num_warps
        assert cfg.num_warps <= 4
        assert rows * cfg.block_n * cfg.block_k <= 16 * threads
        assert cfg.block_n * cfg.block_k >= 8 * threads
        assert K % cfg.block_k == 0 or cfg.block_k >= K  # the K loop needs no mask on these shapes


def test_default_config_splits_a_large_weight_over_few_columns():
    """A weight worth a second launch whose N gives too few programs is split (the preset shapes never are at
    one or two rows): (256, 16384) bf16 at M = 1 has 128 two-column programs, K split 5 ways."""
    cfg = default_config(256, 16384, 1, 2, 132)
    assert (cfg.block_n, cfg.split_k) == (2, 5) and split_plan(16384, cfg) == (5, 7 * 512)
