"""GPU suite of the Mamba-2 Triton decode kernels (run with ``bash scripts/gpu_check.sh``).

Production shapes, every state x activation dtype pair, L in {1, 4, 8, 16, 32}, with and
without z/D, strided inputs, the per-step kernel, CUDA-graph capture, torch.compile and
opcheck. Each trajectory runs at least 2L+1 steps with desynchronised cursors and an idle
row, over NaN-poisoned buffers; see ``mamba2_helpers.check_replay_trajectory``.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from mamba2_helpers import Problem, check_replay_trajectory, check_step_kernel, record

pytestmark = pytest.mark.gpu

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
DTYPES = [F32, BF16, F16]


def _replay():
    from replayssm.kernels.mamba2.ops import mamba2_replay_decode_triton

    return mamba2_replay_decode_triton


def _step():
    from replayssm.kernels.mamba2.ops import mamba2_step_decode_triton

    return mamba2_step_decode_triton


def _launching(cfg):
    """A kernel function (the reference's signature) that launches the replay kernel with ``cfg``."""
    from replayssm.kernels.mamba2.launch import launch_replay

    def fn(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias=None, D=None, z=None, sp=True, out=None):
        launch_replay(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z, sp, out, False, None, cfg)
        return out

    return fn


def _cursors(Bt, L, seed):
    g = torch.Generator().manual_seed(seed)
    c = torch.randint(0, L, (Bt,), generator=g)
    c[0] = 0
    c[-1] = -1  # one idle row
    if Bt > 2:
        c[1] = L - 1  # flushes on the first step
    return c.tolist()


@pytest.mark.parametrize("state_dtype", DTYPES, ids=lambda d: f"s{str(d)[-7:]}")
@pytest.mark.parametrize("act_dtype", DTYPES, ids=lambda d: f"a{str(d)[-7:]}")
def test_dtype_pairs(state_dtype, act_dtype):
    Bt, H, P, N, G, L = 6, 16, 32, 64, 4, 4
    prob = Problem(Bt, H, P, N, G, L, state_dtype, act_dtype, "cuda", _cursors(Bt, L, 1), seed=2)
    w = check_replay_trajectory(_replay(), prob, steps=2 * L + 1, check_exact=state_dtype == F32)
    record(f"dtype_pairs[{state_dtype}-{act_dtype}]", w)


@pytest.mark.parametrize("L", [1, 4, 8, 16, 32])
@pytest.mark.parametrize("state_dtype,act_dtype", [(F32, F32), (F32, BF16), (BF16, BF16)], ids=["s32a32", "s32a16", "s16a16"])
def test_buffer_lengths(L, state_dtype, act_dtype):
    Bt, H, P, N, G = 5, 8, 64, 64, 2
    prob = Problem(Bt, H, P, N, G, L, state_dtype, act_dtype, "cuda", _cursors(Bt, L, L), seed=L)
    w = check_replay_trajectory(_replay(), prob, steps=2 * L + 1, check_exact=state_dtype == F32)
    record(f"buffer_lengths[L={L}-{state_dtype}-{act_dtype}]", w)


PROD = {"nano4b": (96, 80, 128, 8), "super": (128, 64, 128, 8), "mamba2-2.7b": (80, 64, 128, 1),
        "p80n40": (8, 80, 40, 2)}


@pytest.mark.parametrize("shape", list(PROD), ids=list(PROD))
@pytest.mark.parametrize("state_dtype,act_dtype", [(F32, F32), (F32, BF16), (BF16, BF16)], ids=["s32a32", "s32a16", "s16a16"])
def test_production_shapes(shape, state_dtype, act_dtype):
    H, P, N, G = PROD[shape]
    Bt, L = 4, 8
    prob = Problem(Bt, H, P, N, G, L, state_dtype, act_dtype, "cuda", _cursors(Bt, L, 3), seed=4)
    w = check_replay_trajectory(_replay(), prob, steps=2 * L + 1, check_exact=state_dtype == F32)
    record(f"production[{shape}-{state_dtype}-{act_dtype}]", w)


@pytest.mark.parametrize("specialize", [False, True], ids=["runtime-sizes", "specialized"])
@pytest.mark.parametrize("state_dtype,act_dtype", [(F32, BF16), (BF16, BF16)], ids=["s32a16", "s16a16"])
def test_both_kernels_at_a_serving_batch(specialize, state_dtype, act_dtype):
    """Both launches of the replay program (compile-time and runtime sizes) at batch 16, where a
    16-bit checkpoint takes the runtime kernel by default and an fp32 one the specialized kernel."""
    import dataclasses

    from replayssm.kernels.backend import num_sms
    from replayssm.kernels.mamba2.config import default_config

    H, P, N, G = PROD["super"]
    Bt, L = 16, 8
    base = default_config(Bt, H, P, N, G, L, state_dtype.itemsize, act_dtype.itemsize, num_sms("cuda", 0))
    assert base.specialize is (state_dtype == F32)
    fn = _launching(dataclasses.replace(base, specialize=specialize))
    prob = Problem(Bt, H, P, N, G, L, state_dtype, act_dtype, "cuda", _cursors(Bt, L, 9), seed=10)
    w = check_replay_trajectory(fn, prob, steps=2 * L + 1, check_exact=state_dtype == F32)
    record(f"serving_batch[{specialize}-{state_dtype}-{act_dtype}]", w)


@pytest.mark.parametrize("opt", [False, True], ids=["no-z-D-bias", "z-D-bias"])
@pytest.mark.parametrize("strided", [False, True], ids=["contig", "strided"])
@pytest.mark.parametrize("state_dtype,act_dtype", [(F32, F32), (BF16, BF16)], ids=["s32a32", "s16a16"])
def test_options_and_strides(opt, strided, state_dtype, act_dtype):
    Bt, H, P, N, G, L = 4, 6, 80, 40, 3, 4
    prob = Problem(Bt, H, P, N, G, L, state_dtype, act_dtype, "cuda", _cursors(Bt, L, 5), seed=6, has_z=opt,
                   has_D=opt, has_bias=opt, strided=strided)
    check_replay_trajectory(_replay(), prob, steps=2 * L + 1, check_exact=state_dtype == F32)


@pytest.mark.parametrize("shape,state_dtype", [("super", F32), ("mamba2-2.7b", BF16)], ids=["super-s32", "2p7b-s16"])
def test_large_batch_config_and_out_none(shape, state_dtype):
    """Batch 64: several heads per program (8 of a group's 16 or 80 with the defaults), the flush rows'
    programs first with the launch-wide cursor advance, the rows at desynchronised cursors; out=None
    zeroes idle rows."""
    from replayssm.kernels.backend import num_sms
    from replayssm.kernels.mamba2.config import default_config, program_split

    H, P, N, G = PROD[shape]
    Bt, L = 64, 4
    cfg = default_config(Bt, H, P, N, G, L, state_dtype.itemsize, 2, num_sms("cuda", 0))
    assert cfg.heads_per_program == 8 and program_split(cfg, H, P, G)[1] == H // G // 8 and cfg.flush_first
    prob = Problem(Bt, H, P, N, G, L, state_dtype, BF16, "cuda", _cursors(Bt, L, 7), seed=8, has_z=False)
    check_replay_trajectory(_replay(), prob, steps=2 * L + 1, use_out=False, check_exact=state_dtype == F32)


@pytest.mark.parametrize("variant", ["dot-flush-4-warps", "one-head-16-lanes", "flush-fma-8-lanes",
                                     "flush-fma-two-warps", "flush-fma-4-lanes-1920-programs"])
def test_launch_variants(variant):
    from replayssm.kernels.mamba2.config import LaunchConfig

    H, P, N, G = PROD["nano4b"]
    Bt, L = 5, 4
    cfg = {"dot-flush-4-warps": LaunchConfig(32, 3, 128, 64, 4),
           "one-head-16-lanes": LaunchConfig(16, 1, 128, 64, 2),
           "flush-fma-8-lanes": LaunchConfig(8, 4, 128, 64, 1, flush_fma=True),
           "flush-fma-two-warps": LaunchConfig(32, 3, 128, 32, 2, flush_fma=True),
           # 96 heads x 20 lane blocks: 1920 programs arrive at each row's counter
           "flush-fma-4-lanes-1920-programs": LaunchConfig(4, 1, 128, 64, 1, flush_fma=True)}[variant]
    prob = Problem(Bt, H, P, N, G, L, F32, BF16, "cuda", _cursors(Bt, L, 9), seed=10)
    check_replay_trajectory(_launching(cfg), prob, steps=2 * L + 1)


@pytest.mark.parametrize("state_dtype,act_dtype", [(BF16, BF16), (F16, F16), (BF16, F32)],
                         ids=["s16a16", "sf16af16", "s16a32"])
def test_flush_fma_16bit_checkpoint(state_dtype, act_dtype):
    """The rank-1 flush route (default only with an fp32 checkpoint up to batch 4) with
    16-bit checkpoints, at a batch above 4, against the reference and the exact recurrence."""
    from replayssm.kernels.mamba2.config import LaunchConfig

    H, P, N, G = PROD["super"]
    Bt, L = 6, 8
    fn = _launching(LaunchConfig(16, 2, 128, 64, 1, flush_fma=True))
    prob = Problem(Bt, H, P, N, G, L, state_dtype, act_dtype, "cuda", _cursors(Bt, L, 15), seed=16)
    w = check_replay_trajectory(fn, prob, steps=2 * L + 1)
    record(f"flush_fma[{state_dtype}-{act_dtype}]", w)


@pytest.mark.parametrize("shape", ["super", "nano4b", "p80n40"])
@pytest.mark.parametrize("state_dtype,act_dtype", [(F32, F32), (F32, BF16), (BF16, BF16), (F16, F16)],
                         ids=["s32a32", "s32a16", "s16a16", "sf16af16"])
def test_step_kernel(shape, state_dtype, act_dtype):
    H, P, N, G = PROD[shape]
    prob = Problem(3, H, P, N, G, 2, state_dtype, act_dtype, "cuda", [0, 0, 0], seed=11)
    record(f"step[{shape}-{state_dtype}-{act_dtype}]", check_step_kernel(_step(), prob, steps=3))


def test_step_kernel_strided_batch1():
    H, P, N, G = PROD["mamba2-2.7b"]
    prob = Problem(1, H, P, N, G, 2, F32, F32, "cuda", [0], seed=12, strided=True)
    check_step_kernel(_step(), prob, steps=2)


def test_cuda_graph_capture_equals_eager():
    """Capture 2L+1 steps (three flushes for some rows) in one graph; replay == eager."""
    H, P, N, G = PROD["super"]
    Bt, L = 6, 4
    base = Problem(Bt, H, P, N, G, L, F32, BF16, "cuda", [0, 3, 1, 2, 0, -1], seed=13)
    steps = [base.inputs() for _ in range(2 * L + 1)]
    fn = _replay()
    eager, graph = base.clone(), base.clone()
    outs_e = [torch.full((Bt, H, P), 7.0, dtype=BF16, device="cuda") for _ in steps]
    outs_g = [o.clone() for o in outs_e]
    # warm up (compiles) on a throwaway copy, on a side stream as capture requires
    warm = base.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for (x, dt, B, C, z), o in zip(steps, [o.clone() for o in outs_e]):
            fn(x, dt, B, C, *warm.mutable(), base.A, base.dt_bias, base.D, z, True, o)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for (x, dt, B, C, z), o in zip(steps, outs_g):
            fn(x, dt, B, C, *graph.mutable(), base.A, base.dt_bias, base.D, z, True, o)
    assert torch.equal(graph.cursor, base.cursor), "capture must not run the kernels"
    g.replay()
    for (x, dt, B, C, z), o in zip(steps, outs_e):
        fn(x, dt, B, C, *eager.mutable(), base.A, base.dt_bias, base.D, z, True, o)
    torch.cuda.synchronize()
    for oe, og in zip(outs_e, outs_g):
        assert torch.equal(oe, og)
    for a, b in zip(eager.mutable(), graph.mutable()):
        assert torch.equal(a.nan_to_num(0), b.nan_to_num(0))
    # a second replay continues from the advanced cursors, like eager would
    g.replay()
    for (x, dt, B, C, z), o in zip(steps, outs_e):
        fn(x, dt, B, C, *eager.mutable(), base.A, base.dt_bias, base.D, z, True, o)
    torch.cuda.synchronize()
    for a, b in zip(eager.mutable(), graph.mutable()):
        assert torch.equal(a.nan_to_num(0), b.nan_to_num(0))


def test_torch_compile_fullgraph():
    from replayssm.kernels.mamba2.ops import mamba2_replay_decode_triton, mamba2_step_decode_triton

    H, P, N, G = 16, 32, 64, 4
    Bt, L = 4, 4
    prob = Problem(Bt, H, P, N, G, L, F32, BF16, "cuda", [0, 3, 2, -1], seed=14)
    ker, ref = prob.clone(), prob.clone()
    sk, sr = prob.clone().state, prob.clone().state

    def f(x, dt, B, C, z, state, x_buf, dt_buf, B_buf, cursor, st):
        y = mamba2_replay_decode_triton(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, prob.A, prob.dt_bias,
                                        prob.D, z)
        y2 = mamba2_step_decode_triton(x, dt, B, C, st, prob.A, prob.dt_bias, prob.D, z)
        return y.float() * 2.0 + y2.float()

    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True)
    for _ in range(L + 1):  # crosses a flush for every active row
        x, dt, B, C, z = prob.inputs()
        yc = cf(x, dt, B, C, z, *ker.mutable(), sk)
        ye = f(x, dt, B, C, z, *ref.mutable(), sr)
        assert_close(yc, ye, rtol=1e-2, atol=1e-2)
        for a, b in zip(ker.mutable(), ref.mutable()):
            assert torch.equal(a.nan_to_num(0), b.nan_to_num(0))
        assert torch.equal(sk, sr)


def test_opcheck_gpu():
    import replayssm.kernels.mamba2.ops  # noqa: F401

    H, P, N, G = 8, 32, 64, 2
    prob = Problem(3, H, P, N, G, 4, F32, BF16, "cuda", [0, 3, -1], seed=15)
    x, dt, B, C, z = prob.inputs()
    out = torch.zeros(3, H, P, dtype=BF16, device="cuda")
    for arrivals in (None, torch.zeros(3, dtype=torch.int32, device="cuda")):
        args = (x, dt, B, C, *prob.clone().mutable(), prob.A, prob.dt_bias, prob.D, z, True, out, False, arrivals,
                None, None)
        torch.library.opcheck(torch.ops.replayssm.mamba2_replay_decode.default, args)
    torch.library.opcheck(torch.ops.replayssm.mamba2_step_decode.default,
                          (x, dt, B, C, prob.clone().state, prob.A, prob.dt_bias, prob.D, z, True, out.clone()))


def test_tf32x3_matters():
    """The flush route's tl.dot with plain tf32 drifts measurably more than with tf32x3 (its
    default); the rank-1 fp32 flush route (the default at this batch) is as close as tf32x3."""
    import dataclasses

    from replayssm.kernels.mamba2.config import default_config
    from replayssm.kernels.mamba2.launch import launch_replay
    from replayssm.kernels.mamba2.reference import mamba2_replay_decode_reference

    H, P, N, G = PROD["super"]
    Bt, L = 4, 16
    prob = Problem(Bt, H, P, N, G, L, F32, F32, "cuda", [L - 1] * Bt, seed=16, has_z=False)
    x, dt, B, C, z = prob.inputs()
    ref = prob.clone()
    y_ref = mamba2_replay_decode_reference(x, dt, B, C, *ref.mutable(), prob.A, prob.dt_bias, prob.D)
    errs = {}
    for prec in ("tf32x3", "tf32", "fma"):
        k = prob.clone()
        out = torch.empty_like(x)
        cfg = default_config(Bt, H, P, N, G, L, 4, 4, torch.cuda.get_device_properties(0).multi_processor_count)
        assert cfg.flush_fma
        if prec != "fma":
            cfg = dataclasses.replace(cfg, flush_fma=False, num_warps=2, dot_precision=prec)
        launch_replay(x, dt, B, C, *k.mutable(), prob.A, prob.dt_bias, prob.D, None, True, out, False, None, cfg)
        errs[prec] = max((out - y_ref).abs().max().item(), (k.state - ref.state).abs().max().item())
    record("flush_error_by_dot_precision", errs)
    assert errs["tf32x3"] < 1e-4 and errs["fma"] < 1e-4
    assert errs["tf32"] > 2 * max(errs["tf32x3"], errs["fma"])


def run_on_two_streams(own_counters: bool, steps: int = 9, seed: int = 50):
    """Two independent Mamba2-2.7B-shaped layers (batch 4, L = 4, desynchronised cursors) decoding
    at the same time on two CUDA streams; returns the worst output/checkpoint error of each
    against its own reference trajectory and whether every cursor came out right. With
    ``own_counters`` each layer passes its own ``arrivals`` (as the caches of two patched models
    do); otherwise both use the device's shared counter."""
    from replayssm.kernels.mamba2.reference import mamba2_replay_decode_reference

    H, P, N, G = PROD["mamba2-2.7b"]
    Bt, L = 4, 4  # grids small enough for both streams' kernels to be resident at once
    probs = [Problem(Bt, H, P, N, G, L, F32, F32, "cuda", _cursors(Bt, L, seed + i), seed=seed + i, has_z=False)
             for i in range(2)]
    refs = [p.clone() for p in probs]
    inputs = [[p.inputs()[:4] for _ in range(steps)] for p in probs]
    outs = [[torch.full((Bt, H, P), float("nan"), device="cuda") for _ in range(steps)] for _ in probs]
    counters = [torch.zeros(Bt, dtype=torch.int32, device="cuda") if own_counters else None for _ in probs]
    streams = [torch.cuda.Stream() for _ in probs]
    torch.cuda.synchronize()
    for s in streams:
        with torch.cuda.stream(s):
            torch.cuda._sleep(5_000_000)  # let both queues fill before either starts
    for t in range(steps):  # step t of both layers at about the same time
        for i, (p, s) in enumerate(zip(probs, streams)):
            with torch.cuda.stream(s):
                x, dt, B, C = inputs[i][t]
                _replay()(x, dt, B, C, *p.mutable(), p.A, p.dt_bias, p.D, None, True, outs[i][t], counters[i])
    torch.cuda.synchronize()
    def gap(a, b):  # largest difference; inf where either side is not finite (an unwritten output)
        return torch.nan_to_num((a - b).abs(), nan=float("inf")).max().item()

    worst, cursors_ok = [], True
    for i, (p, r) in enumerate(zip(probs, refs)):
        err = 0.0
        for t in range(steps):
            x, dt, B, C = inputs[i][t]
            y = mamba2_replay_decode_reference(x, dt, B, C, *r.mutable(), p.A, p.dt_bias, p.D)
            active = r.cursor >= 0
            err = max(err, gap(outs[i][t][active], y[active]))
        err = max(err, gap(p.state, r.state))
        cursors_ok = cursors_ok and torch.equal(p.cursor, r.cursor)
        worst.append(err)
    return worst, cursors_ok, counters


def test_two_streams_at_once_with_their_own_arrival_counters():
    """Layers decoding concurrently on two streams, each with its own arrival counters (as two
    patched models' caches have), match their references: outputs, checkpoints, cursors; the
    counters end at zero."""
    worst, cursors_ok, counters = run_on_two_streams(own_counters=True)
    record("two_streams_own_counters", {"worst": worst})
    assert cursors_ok
    assert max(worst) < 1e-3, worst
    assert all(not c.any() for c in counters)
