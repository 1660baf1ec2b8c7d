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
from replayssm.kernels import quant_triton as Q

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
print("compiled")
"""


def test_quantize_and_decode_routes_compile_for_sm90():
    """Every stored format x rounding x scale axis x e4m3 route of ``quantize_tile`` (the flush
    kernels' rounding) and the 8-bit code decoding, compiled to a cubin by Triton's own toolchain."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]
