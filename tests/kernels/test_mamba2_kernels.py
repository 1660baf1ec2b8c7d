"""Mamba-2 Triton decode kernels vs the PyTorch reference and the exact fp32 recurrence.

On a machine without CUDA these run the Triton kernels through the interpreter
(``TRITON_INTERPRET=1``, set by ``tests/conftest.py``): tiny fp32 shapes only. The GPU
suite (many shapes, 16-bit dtypes, CUDA graphs, torch.compile) is
``test_mamba2_kernels_gpu.py``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.testing import assert_close

from mamba2_helpers import FP32_TOL, Problem, check_replay_trajectory, check_step_kernel

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _replay():
    from replayssm.kernels.mamba2.ops import mamba2_replay_decode_triton

    return mamba2_replay_decode_triton


def _step():
    from replayssm.kernels.mamba2.ops import mamba2_step_decode_triton

    return mamba2_step_decode_triton


def _launching(cfg, arrivals=None):
    """A kernel function (the reference's signature) that launches the replay kernel with ``cfg``."""
    from replayssm.kernels.mamba2.launch import launch_replay

    def fn(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias=None, D=None, z=None, sp=True, out=None):
        launch_replay(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z, sp, out, False, arrivals,
                      cfg)
        return out

    return fn


# (Bt, H, P, N, G, L, cursors, z/D/dt_bias, strided)
CASES = [
    pytest.param(3, 4, 16, 16, 2, 4, [0, 0, -1], True, False, id="sync-idle-z"),
    pytest.param(4, 4, 16, 16, 2, 4, [0, 2, 3, -1], True, False, id="desync-z"),
    pytest.param(3, 2, 10, 12, 1, 3, [1, -1, 0], False, True, id="nonpow2-strided-noz"),
    pytest.param(2, 2, 16, 16, 2, 1, [0, -1], True, False, id="L1-every-step-flushes"),
    pytest.param(2, 2, 64, 32, 1, 4, [0, 3], True, False, id="two-lane-blocks-early-load"),
]


@pytest.mark.parametrize("Bt,H,P,N,G,L,cursors,opt,strided", CASES)
def test_replay_fp32_trajectory(Bt, H, P, N, G, L, cursors, opt, strided):
    prob = Problem(Bt, H, P, N, G, L, torch.float32, torch.float32, DEV, cursors, seed=Bt * 100 + L,
                   has_z=opt, has_D=opt, has_bias=opt, strided=strided)
    worst = check_replay_trajectory(_replay(), prob, steps=2 * L + 1)
    assert worst["flushes"] >= 2
    # fp32 with tf32x3 (ieee under the interpreter) sits far inside the tolerance
    assert worst["y_exact"] < 1e-4 and worst["state_exact"] < 1e-4, worst


def test_replay_rollback_matches_reference():
    """A speculative-decoding rollback (cursors moved back by 2 and 3 after 4 verified drafted
    tokens) and more steps, a flush among them: the kernel stays equal to the reference (whose
    rollback test compares with the float64 recurrence over the accepted tokens)."""
    from replayssm.kernels.mamba2 import mamba2_replay_decode_reference

    prob = Problem(2, 4, 16, 16, 2, 8, torch.float32, torch.float32, DEV, [3, 2], seed=21)
    ref = prob.clone()
    for step in range(4 + 16):
        if step == 4:
            for p in (prob, ref):
                p.cursor -= torch.tensor([2, 3], dtype=torch.int32, device=DEV)
        x, dt, B, C, z = prob.inputs()
        args = (prob.A, prob.dt_bias, prob.D, z)
        y_k = _replay()(x, dt, B, C, *prob.mutable(), *args)
        y_r = mamba2_replay_decode_reference(x, dt, B, C, *ref.mutable(), *args)
        rtol, atol = FP32_TOL
        assert_close(y_k, y_r, rtol=rtol, atol=atol)
        for a, b in zip(prob.mutable(), ref.mutable()):
            assert_close(a, b, equal_nan=True, rtol=rtol, atol=atol)


def test_replay_out_none_zeroes_idle_rows():
    prob = Problem(3, 2, 16, 16, 1, 2, torch.float32, torch.float32, DEV, [1, -1, 0], seed=5)
    check_replay_trajectory(_replay(), prob, steps=3, use_out=False)


def test_replay_launch_configurations():
    """Launch configurations other than the defaults: the state dim in several tiles on both routes
    (N=40 in tiles of 16) with two heads per program, and flush tiles as wide as the state dim, where
    the flush route starts from the tiles loaded before the cursor was known (the window's stale
    slots NaN-poisoned), one and two heads per program."""
    from replayssm.kernels.mamba2.config import LaunchConfig

    tiles = LaunchConfig(block_p=16, heads_per_program=2, block_n=16, flush_block_n=16, num_warps=4)
    prob = Problem(3, 4, 16, 40, 2, 3, torch.float32, torch.float32, DEV, [2, 0, 1], seed=12)
    check_replay_trajectory(_launching(tiles), prob, steps=4)
    for hc in (1, 2):
        early = LaunchConfig(block_p=16, heads_per_program=hc, block_n=16, flush_block_n=16, num_warps=4)
        prob = Problem(3, 4, 16, 16, 2, 3, torch.float32, torch.float32, DEV, [2, 0, -1], seed=14)
        check_replay_trajectory(_launching(early), prob, steps=7)


def test_replay_counts_arrivals_in_the_given_counters(monkeypatch):
    """With ``arrivals`` the kernel counts its cursor-advance arrivals there, never in the device's
    shared counter, and leaves the rows' entries at zero (entries past the batch untouched)."""
    import replayssm.kernels.mamba2.launch as launch

    def shared_counter(*args):
        raise AssertionError("the device's shared arrival counter was used")

    monkeypatch.setattr(launch, "_arrival_counter", shared_counter)
    Bt = 3
    arrivals = torch.zeros(Bt + 2, dtype=torch.int32, device=DEV)
    arrivals[Bt:] = 7
    seen = []

    def fn(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias=None, D=None, z=None, sp=True, out=None):
        y = _replay()(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z, sp, out, arrivals)
        seen.append(arrivals.tolist())
        return y

    prob = Problem(Bt, 4, 16, 16, 2, 3, torch.float32, torch.float32, DEV, [2, 0, -1], seed=41)
    worst = check_replay_trajectory(fn, prob, steps=7)
    assert worst["flushes"] >= 2
    assert seen and all(row == [0, 0, 0, 7, 7] for row in seen), seen
    for bad in (torch.zeros(Bt, dtype=torch.int64, device=DEV), torch.zeros(Bt - 1, dtype=torch.int32, device=DEV),
                torch.zeros(2 * Bt, dtype=torch.int32, device=DEV)[::2]):
        with pytest.raises(ValueError, match="arrivals must be a contiguous int32 vector"):
            launch.launch_replay(*prob.inputs()[:4], *prob.mutable(), prob.A, None, None, None, True,
                                 torch.empty(Bt, 4, 16, device=DEV), False, arrivals=bad)


@pytest.mark.parametrize("split", [False, True], ids=["one-launch", "split-routes"])
@pytest.mark.parametrize("cursors,BLOCK_P,HC,specialize,fma", [
    ([2, 0, -1, 2, 1, 2], 8, 1, True, True),     # three flush rows between others, an idle row, 2 lane blocks
    ([0, 1, 2, -1, -1, 0], 16, 2, False, False),  # runtime sizes, two heads per program, dot flush
    ([2, 2, 2, 2, 2, 2], 16, 1, True, True),     # every row flushes together
    ([-1, -1, 0, -1, 1, -1], 16, 1, True, True),  # mostly idle rows
])
def test_replay_flush_first_order(cursors, BLOCK_P, HC, specialize, fma, split):
    """Flush-first order: the flush rows' programs first, the cursors moved by the launch's last
    program. Same trajectory as the reference (outputs, rings, checkpoints, cursors every step); the
    launch-wide count uses only the first entry of ``arrivals`` and leaves it at zero. With split
    routes the output-only rows' launch runs first and the flush launch moves every cursor."""
    from replayssm.kernels.mamba2.config import LaunchConfig

    Bt, L = len(cursors), 3
    cfg = LaunchConfig(block_p=BLOCK_P, heads_per_program=HC, block_n=16, flush_block_n=16, num_warps=4,
                       flush_fma=fma, specialize=specialize, flush_first=not split, split_routes=split)
    assert _flush_first_block(cfg, Bt, route=2 if split else 0) == 8
    arrivals = torch.zeros(Bt + 1, dtype=torch.int32, device=DEV)
    arrivals[Bt] = 5
    seen = []
    launch = _launching(cfg, arrivals)

    def fn(*args):
        y = launch(*args)
        seen.append(arrivals.tolist())
        return y

    prob = Problem(Bt, 2, 16, 16, 1, L, torch.float32, torch.float32, DEV, cursors, seed=51, has_z=True,
                   has_D=True, has_bias=True)
    worst = check_replay_trajectory(fn, prob, steps=2 * L + 1)
    assert worst["flushes"] >= 2
    assert worst["y_exact"] < 1e-4 and worst["state_exact"] < 1e-4, worst
    assert seen and all(row == [0] * Bt + [5] for row in seen), seen


def _flush_first_block(cfg, n_rows, route=0):
    """The launch's FLUSH_FIRST_BB: 0 for row order, else a power of two >= the batch."""
    from replayssm.kernels.mamba2.launch import replay_flags

    return replay_flags(cfg, 16, 3, n_rows, has_dt_bias=True, has_D=True, has_z=True, dt_softplus=True,
                        zero_idle=False, lowp=False, route=route).FLUSH_FIRST_BB.value


def test_default_order_runs_flush_rows_first_from_batch_32():
    from replayssm.kernels.mamba2.config import default_config

    for Bt in (1, 4, 8, 16, 31):
        assert not default_config(Bt, 128, 64, 128, 8, 16, 4, 2, 132).flush_first
    for Bt in (32, 64, 256, 512):
        assert default_config(Bt, 128, 64, 128, 8, 16, 4, 2, 132).flush_first


def test_replay_flush_first_order_config():
    """Flush-first needs the batch in one block of cursors (``persistent.FLUSH_ROWS``): larger batches
    run in row order; row order is the default below batch 32."""
    from replayssm.kernels.mamba2.config import LaunchConfig

    cfg = LaunchConfig(block_p=16, heads_per_program=1, block_n=16, flush_block_n=16, num_warps=4, flush_first=True)
    assert _flush_first_block(cfg, 200) == 256 and _flush_first_block(cfg, 5000) == 0  # past one block
    rows = LaunchConfig(block_p=16, heads_per_program=1, block_n=16, flush_block_n=16, num_warps=4)
    assert _flush_first_block(rows, 200) == 0


@pytest.mark.parametrize("L,P,BLOCK_P,HC,N,BLOCK_N,BLOCK_NF", [
    (3, 8, 4, 1, 40, 16, 16),   # two 4-lane blocks, state dim in three flush tiles
    (4, 16, 8, 2, 16, 16, 16),  # two heads per program, one tile (early loads): the first head's flush from them
    (1, 16, 16, 1, 16, 16, 16),  # every step flushes: the window is the current token alone
    (3, 16, 8, 2, 40, 64, 64),  # one masked flush tile wider than the state dim, from the early loads
])
def test_replay_flush_fma_variant(L, P, BLOCK_P, HC, N, BLOCK_N, BLOCK_NF):
    """The flush route with rank-1 fp32 updates (``flush_fma``, any BLOCK_P) matches the reference."""
    from replayssm.kernels.mamba2.config import LaunchConfig

    fn = _launching(LaunchConfig(block_p=BLOCK_P, heads_per_program=HC, block_n=BLOCK_N, flush_block_n=BLOCK_NF,
                                 num_warps=4, flush_fma=True))
    cursors = [L - 1, 0, -1] if L > 1 else [0, -1, 0]
    prob = Problem(3, 2, P, N, 1, L, torch.float32, torch.float32, DEV, cursors, seed=21 + L, has_z=True,
                   has_D=True, has_bias=True)
    worst = check_replay_trajectory(fn, prob, steps=2 * L + 1)
    assert worst["flushes"] >= 2
    assert worst["y_exact"] < 1e-4 and worst["state_exact"] < 1e-4, worst


@pytest.mark.parametrize("fma", [False, True], ids=["dot-flush", "fma-flush"])
def test_replay_runtime_layout_kernel(fma):
    """``specialize=False`` (sizes and buffer strides as runtime arguments, ``replay_kernel_dyn``)
    runs the same program: equal to the reference on both routes, several heads and state tiles per
    program, with strided inputs."""
    from replayssm.kernels.mamba2.config import LaunchConfig

    fn = _launching(LaunchConfig(block_p=16, heads_per_program=2, block_n=16, flush_block_n=16, num_warps=4,
                                 flush_fma=fma, specialize=False))

    prob = Problem(3, 4, 16, 40, 2, 3, torch.float32, torch.float32, DEV, [2, 0, -1], seed=31, has_z=True,
                   has_D=True, has_bias=True, strided=True)
    worst = check_replay_trajectory(fn, prob, steps=7)
    assert worst["flushes"] >= 2
    assert worst["y_exact"] < 1e-4 and worst["state_exact"] < 1e-4, worst


def test_replay_config_needs_16_lanes_for_the_dot_flush():
    from replayssm.kernels.mamba2.config import LaunchConfig

    with pytest.raises(ValueError, match="block_p >= 16"):
        LaunchConfig(block_p=8, heads_per_program=1, block_n=16, flush_block_n=16, num_warps=4)
    assert LaunchConfig(block_p=8, heads_per_program=1, block_n=16, flush_block_n=16, num_warps=4,
                        flush_fma=True).flush_fma


@pytest.mark.parametrize("knobs, message", [
    (dict(block_p=12), "block_p must be a power of two"),
    (dict(num_warps=3), "num_warps must be a power of two"),
    (dict(heads_per_program=0), "heads_per_program must be positive"),
    (dict(block_n=8, flush_block_n=8), "tiles must be at least 16 wide"),
    (dict(dot_precision="bf16"), "dot_precision must be one of"),
])
def test_launch_config_is_validated(knobs, message):
    from replayssm.kernels.mamba2.config import LaunchConfig

    base = dict(block_p=16, heads_per_program=1, block_n=16, flush_block_n=16, num_warps=4)
    with pytest.raises(ValueError, match=message):
        LaunchConfig(**dict(base, **knobs))


def test_default_config_takes_the_rank1_flush_route_only_where_measured_faster():
    """Up to batch 4, fp32 checkpoint, L <= 16: rank-1 flush route with 1 warp, or 4 when the grid
    fits one wave of 4-warp programs; the tl.dot route everywhere else."""
    from replayssm.kernels.mamba2.config import default_config

    super_, m27 = (128, 64, 128, 8), (80, 64, 128, 1)
    c = default_config(1, *super_, 16, 4, 2, 132)
    assert c.flush_fma and c.num_warps == 1
    assert c.flush_block_n == c.block_n == 128  # one flush tile: the first head flushes from the early loads
    c = default_config(1, *m27, 8, 4, 2, 132)  # 320 programs <= 3 x 132
    assert c.flush_fma and c.num_warps == 4 and c.flush_block_n == 64
    for args in ((8, *super_, 16, 4, 2), (1, *super_, 32, 4, 2), (1, *super_, 16, 2, 2), (4, *m27, 16, 2, 2)):
        c = default_config(*args, 132)
        assert not c.flush_fma, args
        assert c.num_warps == (1 if args[-2] == 2 else 2), args


def test_default_heads_per_program():
    """About 8 programs per multiprocessor; at most a whole group of fewer than 16 heads, else 8 heads
    (shorter flush programs when only some rows flush), in chunks of equal size."""
    from replayssm.kernels.mamba2.config import default_config, program_split

    nano, super_, m27 = (96, 80, 128, 8), (128, 64, 128, 8), (80, 64, 128, 1)
    for shape, Bt, hc, n_hc in ((nano, 256, 12, 1), (nano, 32, 6, 2), (super_, 256, 8, 2), (super_, 512, 8, 2),
                                (super_, 32, 6, 3), (super_, 8, 1, 16), (m27, 256, 8, 10), (m27, 32, 4, 20),
                                (m27, 1, 1, 80)):
        for s in (4, 2):
            c = default_config(Bt, *shape, 16, s, 2, 132)
            H, P, _, G = shape
            assert (c.heads_per_program, program_split(c, H, P, G)[1]) == (hc, n_hc), (shape, Bt, s)


def test_default_config_specializes_except_16bit_serving_batches():
    """Compile-time sizes and strides everywhere but 16-bit checkpoint and activations above batch 8
    (measured faster)."""
    from replayssm.kernels.mamba2.config import default_config

    super_ = (128, 64, 128, 8)
    for Bt, s, a, spec in ((1, 4, 2, True), (256, 4, 2, True), (1, 2, 2, True), (8, 2, 2, True), (9, 2, 2, False),
                           (256, 2, 2, False), (256, 2, 4, True)):
        assert default_config(Bt, *super_, 16, s, a, 132).specialize is spec, (Bt, s, a)


def test_tolerance_catches_tf32_sized_drift():
    """A 1e-2 relative error (plain tf32 drift) must fail the fp32 tolerance used above."""
    torch.manual_seed(0)
    y = torch.randn(4, 8, 16)
    rtol, atol = FP32_TOL
    assert_close(y * (1 + 1e-5), y, rtol=rtol, atol=atol)  # tf32x3-sized error passes
    with pytest.raises(AssertionError):
        assert_close(y * (1 + 1e-2), y, rtol=rtol, atol=atol)
    with pytest.raises(AssertionError):
        assert_close(y + 1e-2 * y.abs().mean(), y, rtol=rtol, atol=atol)


def test_trajectory_check_has_teeth():
    """A kernel whose output is off by 1e-2 at one step, or that reads a stale buffer slot, fails."""
    ok = _replay()
    calls = {"n": 0}

    def off_by_1e2(*args):
        y = ok(*args)
        calls["n"] += 1
        if calls["n"] == 3:
            y.mul_(1 + 1e-2)
        return y

    prob = Problem(2, 2, 16, 16, 1, 2, torch.float32, torch.float32, DEV, [0, 1], seed=3, has_z=False)
    with pytest.raises(AssertionError):
        check_replay_trajectory(off_by_1e2, prob, steps=4)

    def drops_append(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z, sp, out):
        saved = x_buf.clone()
        y = ok(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z, sp, out)
        x_buf.copy_(saved)  # forgets the x append
        return y

    prob = Problem(2, 2, 16, 16, 1, 2, torch.float32, torch.float32, DEV, [0, 1], seed=4, has_z=False)
    with pytest.raises(AssertionError):
        check_replay_trajectory(drops_append, prob, steps=3)


@pytest.mark.parametrize("strided", [False, True])
def test_step_kernel_fp32(strided):
    prob = Problem(2, 4, 10, 12, 2, 2, torch.float32, torch.float32, DEV, [0, 0], seed=7, strided=strided)
    worst = check_step_kernel(_step(), prob, steps=2)
    assert worst < 1e-4


def test_dispatch_backend_triton():
    """``mamba2_replay_decode(backend='triton')`` routes to the kernel (interpreter on CPU)."""
    from replayssm.kernels.mamba2 import mamba2_replay_decode, mamba2_step_decode

    prob = Problem(2, 2, 16, 16, 1, 2, torch.float32, torch.float32, DEV, [0, 1], seed=9)
    check_replay_trajectory(lambda *a: mamba2_replay_decode(*a, backend="triton"), prob, steps=2)
    check_step_kernel(lambda *a: mamba2_step_decode(*a, backend="triton"), prob, steps=1)


def test_custom_ops_registered_and_traceable():
    """Both ops exist with the declared mutations, and a call traces without graph breaks."""
    from replayssm.kernels.mamba2.ops import mamba2_replay_decode_triton

    schema = str(torch.ops.replayssm.mamba2_replay_decode.default._schema)
    for name in ("state", "x_buf", "dt_buf", "B_buf", "cursor", "out"):
        assert f"!) {name}," in schema, schema
    assert "!)? arrivals" in schema, schema
    step_schema = str(torch.ops.replayssm.mamba2_step_decode.default._schema)
    assert "!) state," in step_schema and "!) out" in step_schema, step_schema

    prob = Problem(2, 2, 16, 16, 1, 2, torch.float32, torch.float32, DEV, [0, 1], seed=13, has_z=False)
    ker = prob.clone()
    ref = prob.clone()
    x, dt, B, C, z = prob.inputs()

    def f(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor):
        return mamba2_replay_decode_triton(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, prob.A, prob.dt_bias,
                                           prob.D) * 2.0

    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    y = cf(x, dt, B, C, *ker.mutable())
    y_ref = f(x, dt, B, C, *ref.mutable())
    assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(ker.cursor, ref.cursor)
    assert torch.equal(ker.x_buf.nan_to_num(0), ref.x_buf.nan_to_num(0))


def test_opcheck_both_ops():
    """``torch.library.opcheck``: schema (declared mutations), fake tensors, AOT dispatch."""
    import replayssm.kernels.mamba2.ops  # noqa: F401

    prob = Problem(2, 2, 16, 16, 1, 2, torch.float32, torch.float32, DEV, [0, 1], seed=17)
    x, dt, B, C, z = prob.inputs()
    out = torch.zeros(2, 2, 16, device=DEV)
    for arrivals in (None, torch.zeros(2, dtype=torch.int32, device=DEV)):
        args = (x, dt, B, C, *prob.clone().mutable(), prob.A, prob.dt_bias, prob.D, z, True, out, False, arrivals,
                None, None)
        torch.library.opcheck(torch.ops.replayssm.mamba2_replay_decode.default, args)
    s = prob.clone().state
    torch.library.opcheck(torch.ops.replayssm.mamba2_step_decode.default,
                          (x, dt, B, C, s, prob.A, prob.dt_bias, prob.D, z, True, torch.zeros_like(out)))


def test_custom_ops_declare_no_defaults_for_mutated_arguments():
    """The dispatcher drops trailing arguments equal to their schema default before the in-place
    bookkeeping of some torch versions (2.11) indexes them: a mutated argument with a default
    breaks every call there. Every replayssm operator declares its mutated arguments without one."""
    import replayssm.kernels.delta.ops  # noqa: F401 (registers the delta operators)
    import replayssm.kernels.mamba2.ops  # noqa: F401

    ops = {n: getattr(torch.ops.replayssm, n) for n in dir(torch.ops.replayssm)}
    ops = {n: op for n, op in ops.items() if isinstance(op, torch._ops.OpOverloadPacket)}
    assert {"mamba2_replay_decode", "delta_replay_decode"} <= ops.keys()
    for name, op in ops.items():
        for overload in op.overloads():
            for arg in getattr(op, overload)._schema.arguments:
                if arg.alias_info is not None and arg.alias_info.is_write:
                    assert not arg.has_default_value(), f"{name}: mutated argument {arg.name} has a default"


def test_8bit_checkpoint_launch_rules():
    """An int8 / fp8 checkpoint flushes whole state-dim tiles (its scale is an absmax over N) on one
    warp, with the flush product on the 16-bit rings' dtype; 16-bit operands never meet fp32 rings."""
    import torch

    from replayssm.kernels.mamba2.config import default_config
    from replayssm.kernels.mamba2.launch import quant_config, uses_lowp_dot

    c = quant_config(default_config(256, 128, 64, 128, 8, 16, 1, 2, 132), 128, True, False)
    assert (c.flush_block_n, c.num_warps, c.heads_per_program) == (128, 1, 8)
    assert default_config(256, 128, 64, 128, 8, 16, 1, 4, 132).num_warps == 2  # fp32 rings: fp32 flush tile
    for state, ring, lowp in ((torch.int8, torch.bfloat16, True), (torch.float8_e4m3fn, torch.float16, True),
                              (torch.int8, torch.float32, False), (torch.float32, torch.bfloat16, False),
                              (torch.bfloat16, torch.bfloat16, True)):
        assert uses_lowp_dot(state, ring, ring) is lowp, (state, ring)
    assert not uses_lowp_dot(torch.int8, torch.bfloat16, torch.float16)
    # 8-bit checkpoints in two launches (output-only rows, then the flushing rows'): e4m3 from batch
    # 256, int8 from 128; 16-bit and fp32 ones in one
    assert default_config(256, 128, 64, 128, 8, 16, 1, 2, 132, True).split_routes
    assert not default_config(128, 128, 64, 128, 8, 16, 1, 2, 132, True).split_routes
    assert default_config(128, 128, 64, 128, 8, 16, 1, 2, 132).split_routes  # int8
    assert not default_config(64, 128, 64, 128, 8, 16, 1, 2, 132).split_routes
    assert not any(default_config(256, 128, 64, 128, 8, 16, b, 2, 132).split_routes for b in (2, 4))
    # the split's flush launch on 2 warps (the output launch's 1 spills there); one launch: no override
    assert default_config(128, 128, 64, 128, 8, 16, 1, 2, 132).flush_warps == 2
    assert default_config(64, 128, 64, 128, 8, 16, 1, 2, 132).flush_warps is None
    with pytest.raises(ValueError, match="flush_warps"):
        dataclasses.replace(default_config(128, 128, 64, 128, 8, 16, 1, 2, 132), flush_warps=3)


def test_split_routes_compile_each_route_alone():
    """The output-only launch of split routes runs in row order with no cursor advance (ROUTE 1), the
    flush launch in the flush-first order without early loads (ROUTE 2); above one block of cursors
    the routes stay in one launch."""
    from replayssm.kernels.mamba2.config import LaunchConfig
    from replayssm.kernels.mamba2.launch import replay_flags, split_routes
    from replayssm.kernels.persistent import FLUSH_ROWS

    cfg = LaunchConfig(block_p=16, heads_per_program=1, block_n=16, flush_block_n=16, num_warps=1,
                       flush_first=True, split_routes=True)
    flags = [replay_flags(cfg, 16, 4, 64, has_dt_bias=True, has_D=True, has_z=False, dt_softplus=True,
                          zero_idle=True, lowp=False, route=r) for r in (1, 2)]
    assert [(f.ROUTE.value, f.FLUSH_FIRST_BB.value, f.EARLY.value) for f in flags] == [(1, 0, True), (2, 64, False)]
    # an int8 checkpoint's int32 view is read by the output-only launch alone
    assert [replay_flags(cfg, 16, 4, 64, has_dt_bias=True, has_D=True, has_z=False, dt_softplus=True,
                         zero_idle=True, lowp=False, fmt=3, route=r, words=True).WORDS.value
            for r in (0, 1, 2)] == [False, True, False]
    assert split_routes(cfg, FLUSH_ROWS) and not split_routes(cfg, FLUSH_ROWS + 1)
