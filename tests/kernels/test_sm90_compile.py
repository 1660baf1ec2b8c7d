"""The 8-bit rounding and decoding helpers compile for sm_90 on this machine (no GPU): the Triton
interpreter, which the other CPU tests use, runs the Python source and checks no types, so a route
that only the compiler rejects (say, two return types) would otherwise fail on the first GPU."""

import os
import subprocess
import sys

SCRIPT = r"""
import itertools
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from replayssm.kernels import int8_dot, quant_triton as Q

target = GPUTarget("cuda", 90, 32)
stored = {4: "*i8", 3: "*fp8e4nv", 2: "*fp16", 1: "*bf16"}
for fmt, sr, axis, cast in itertools.product(stored, (False, True), (0, 1), (False, True)):
    sig = dict(x_ptr="*fp32", q_ptr=stored[fmt], d_ptr="*fp32", rng_ptr="*i64", M="i32", N="i32")
    consts = dict(AXIS=axis, FMT=fmt, SR=sr, BM=16, BN=64, CAST_E4M3=cast)
    triton.compile(ASTSource(Q.quant_probe_kernel, {**sig, **{k: "constexpr" for k in consts}}, constexprs=consts),
                   target=target)
for fmt in (4, 3):
    consts = dict(FMT=fmt, BLOCK=256)
    sig = dict(q_ptr=stored[fmt], out_ptr="*fp32", n="i32", FMT="constexpr", BLOCK="constexpr")
    triton.compile(ASTSource(Q.codes_probe_kernel, sig, constexprs=consts), target=target)
consts = dict(BM=32, BW=32)
sig = dict(w_ptr="*i32", c_ptr="*fp32", out_ptr="*fp32", M="i32", NW="i32", BM="constexpr", BW="constexpr")
triton.compile(ASTSource(int8_dot.planes_probe_kernel, sig, constexprs=consts), target=target)
print("compiled")
"""


def test_quantize_and_decode_routes_compile_for_sm90():
    """Every stored format x rounding x scale axis x e4m3 route of ``quantize_tile`` (the flush
    kernels' rounding), the 8-bit code decoding and the int8 words' ``dp4a`` products, compiled
    to a cubin by Triton's own toolchain."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]


ROLLBACK = r"""
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from replayssm.kernels import rollback as R

target = GPUTarget("cuda", 90, 32)
strides = dict(C="i32", h_b="i32", h_c="i32", h_k="i32", s_b="i32", s_c="i32", s_k="i32")
for dtype, name in ((tl.bfloat16, "*bf16"), (tl.float32, "*fp32")):
    for mark_only in (False, True):
        consts = dict(K=4, BLOCK_C=512, BLOCK_K=4, HIST=dtype, STATE=dtype, MARK_ONLY=mark_only)
        sig = dict(table="*i64", n_value="i32", **strides, **{k: "constexpr" for k in consts})
        triton.compile(ASTSource(R._rollback_layers_kernel, sig, constexprs=consts), target=target)
    for per_row in (False, True):
        consts = dict(K=4, BLOCK_C=512, BLOCK_K=4, N_TENSOR=per_row)
        sig = dict(cursor="*i32", n="*i32", n_value="i32", hist=name, state=name, committed="*i32", n_stride="i32",
                   **strides, **{k: "constexpr" for k in consts})
        triton.compile(ASTSource(R._rollback_kernel, sig, constexprs=consts), target=target)
print("compiled")
"""


def test_rollback_kernels_compile_for_sm90():
    """The one-layer and the all-layers rollback (its tensors found through an address table) compiled
    to a cubin: the interpreter casts the table's integers to pointers without the compiler's checks."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", ROLLBACK], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]


def test_mamba2_8bit_split_launches_compile_for_sm90():
    """The Mamba-2 replay step's default for 8-bit checkpoints at batch 256, split routes (the
    output-only launch, which for int8 reads the codes as int32 words, then the flush launch): both
    launches compiled to cubins through ``scripts/sm90_resources.py``."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    for dtype in ("int8", "float8_e4m3fn"):
        proc = subprocess.run([sys.executable, str(root / "scripts" / "sm90_resources.py"), "--kernel", "replay",
                               "--state-dtype", dtype, "--batch", "256"], capture_output=True, text=True,
                              timeout=600, env=env, cwd=root)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "split_routes=True, flush_warps=2" in proc.stdout, proc.stdout
        assert proc.stdout.count("replay_kernel: REG:") == 2, proc.stdout


def test_verify_kernels_on_rounding_checkpoints_compile_for_sm90_without_spills():
    """The verify programs whose flush-first fold rounds (bf16, int8 / fp8 codes and scales,
    stochastic bf16) compiled to cubins at their default launches, batch 8 and 256, through
    ``scripts/sm90_resources.py``: no stack (the compiler, not the interpreter, checks their types;
    its register allocation sets the delta rule's warps for them)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    for family, dtype, batch in (("mamba2", "int8", 256), ("delta", "bfloat16", 256),
                                 ("kda", "bfloat16 --stochastic", 256), ("delta", "float8_e4m3fn", 8)):
        proc = subprocess.run([sys.executable, str(root / "scripts" / "sm90_resources.py"), "--family", family,
                               "--state-dtype", *dtype.split(), "--batch", str(batch)], capture_output=True,
                              text=True, timeout=600, env=env, cwd=root)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "verify_kernel: REG:" in proc.stdout and "STACK:0 " in proc.stdout, (family, dtype, proc.stdout)
