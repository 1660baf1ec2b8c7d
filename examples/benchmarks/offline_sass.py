"""Compile the Mamba-2 replay kernel for an H100/H200 (sm_90) without a GPU and report its resources.

For one layer shape, batch and checkpoint dtype it builds the launch configuration the launcher
would use (``replay_config``), lays each entry of a JSON list of ``make_replay_config`` knobs over
it, compiles the kernel the launcher would pick (specialized or runtime sizes) with Triton's own
ptxas for sm_90 and the alignment facts of a real launch (16-byte aligned pointers, integers
divisible by 16, as the JIT specializes them), and prints one JSON line per entry: registers and
stack per thread, SASS instructions, global loads of 8 or 16 bytes, integer kernel arguments,
programs in the grid. Counts, not times: a way to choose which variants to time on a GPU
(``kernel_ab.py``). Needs the Triton wheel's NVIDIA backend
(``cuobjdump``, ``ptxas``); uses Triton's compiler API (``ASTSource``), which may change between
Triton versions.

    python examples/benchmarks/offline_sass.py mamba2-2.7b 1 float32 '[{}, {"BLOCK_P": 8}]'
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from replayssm.kernels.mamba2 import triton_decode as td

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mamba2 import SHAPES  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
SHOWN = ("BLOCK_P", "HC", "BLOCK_N", "BLOCK_NF", "num_warps", "num_stages", "early_load", "flush_fma", "specialize",
         "n_pb", "order")  # printed with each row
POINTER = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.int32: "*i32"}


def kernel_arguments(H, P, N, G, Bt, L, sdt, adt, c):
    """The launcher's runtime arguments in kernel order (``launch_mamba2_replay_decode``: 15
    tensors, then sizes and strides; dt_bias and D present, no z) and its compile-time flags."""
    x, out = torch.zeros(Bt, H, P, dtype=adt), torch.zeros(Bt, H, P, dtype=adt)
    dt, B, C = torch.zeros(Bt, H, dtype=adt), torch.zeros(Bt, G, N, dtype=adt), torch.zeros(Bt, G, N, dtype=adt)
    state, cur = torch.zeros(Bt, H, P, N, dtype=sdt), torch.zeros(Bt, dtype=torch.int32)
    xb, db, bb = torch.zeros(Bt, H, L, P, dtype=adt), torch.zeros(Bt, H, L), torch.zeros(Bt, G, L, N, dtype=adt)
    A = dtb = D = torch.zeros(H)
    tensors = [x, dt, B, C, state, xb, db, bb, cur, A, dtb, D, x, out, cur]
    ints = [P, N, L, G, H // G, c["HC"], c["n_hc"], c["n_pb"], *x.stride(), *dt.stride(), *B.stride(), *C.stride(),
            *state.stride(), *xb.stride(), *db.stride(), *bb.stride(), cur.stride(0), 1, 1, 1, 0, 0, 0, *out.stride()]
    layer = dict(HAS_DT_BIAS=True, HAS_D=True, HAS_Z=False, DT_SOFTPLUS=True,
                 DOT_LOWP=td.uses_lowp_dot(sdt, adt, adt), DOT_PREC="tf32x3")
    flags = td.replay_kernel_constexprs(c, N, layer, zero_idle=False, route=0, advance=True, arrive_on_cursor=False,
                                        n_rows=Bt)
    return tensors + ints, flags


def compile_case(H, P, N, G, Bt, L, sdt, adt, overrides):
    """Registers, stack, SASS instructions, integer arguments and programs of one configuration."""
    base = td.replay_config(Bt, H, P, N, G, L, sdt.itemsize, adt.itemsize, 132)  # an H200's 132 SMs
    c = td.make_replay_config(H, P, N, G, L, **dict(td.replay_knobs(base), **overrides))
    kern = td._mamba2_replay_kernel if c["specialize"] else td._mamba2_replay_kernel_dyn
    values, flags = kernel_arguments(H, P, N, G, Bt, L, sdt, adt, c)
    names = list(kern.arg_names)
    if len(values) + len(flags) != len(names):
        raise RuntimeError(f"the kernel takes {len(names)} arguments, this tool builds {len(values) + len(flags)}")
    sig, constants, attrs = {}, {}, {}
    for i, (name, param) in enumerate(zip(names, kern.params)):
        v = flags[name] if name in flags else values[i]
        if isinstance(v, torch.Tensor):
            sig[name] = POINTER[v.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]  # as the launcher specializes CUDA allocations (16-byte aligned)
        elif name in flags or param.is_constexpr or v == 1:  # ints equal to 1 are specialized at launch too
            sig[name], constants[(i,)] = "constexpr", v
        else:
            sig[name] = "i32"
            if v % 16 == 0:  # and ints divisible by 16
                attrs[(i,)] = [["tt.divisibility", 16]]
    cc = triton.compile(ASTSource(fn=kern, signature=sig, constexprs=constants, attrs=attrs),
                        target=GPUTarget("cuda", 90, 32), options=dict(num_warps=c["num_warps"],
                                                                        num_stages=c["num_stages"]))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cc.asm["cubin"])
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", path], capture_output=True, text=True).stdout
        res = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", path], capture_output=True,
                             text=True).stdout
    regs, stack = re.search(r"REG:(\d+)", res), re.search(r"STACK:(\d+)", res)
    return dict(config={k: c[k] for k in SHOWN}, regs=int(regs.group(1)) if regs else None,
                stack=int(stack.group(1)) if stack else None,
                sass_instructions=len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/", sass, re.M)),
                wide_global_loads=len(re.findall(r"\bLDG\.E\.(?:64|128)\b", sass)),
                int_args=sum(1 for t in sig.values() if t == "i32"), programs=Bt * G * c["n_hc"] * c["n_pb"])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (3, 4) or argv[0] not in SHAPES or argv[2] not in DTYPES or not argv[1].isdigit():
        print(f"usage: offline_sass.py SHAPE BATCH DTYPE ['[knobs, ...]']  (SHAPE: {', '.join(SHAPES)}; "
              f"DTYPE: {', '.join(DTYPES)})", file=sys.stderr)
        return 2
    try:
        entries = json.loads(argv[3]) if len(argv) == 4 else [{}]
    except json.JSONDecodeError as e:
        print(f"offline_sass: the knob list is not JSON: {e}", file=sys.stderr)
        return 2
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        print("offline_sass: the knob list must be a JSON list of objects", file=sys.stderr)
        return 2
    for ov in entries:
        try:
            row = compile_case(*SHAPES[argv[0]], int(argv[1]), 16, DTYPES[argv[2]], torch.bfloat16, ov)
        except (TypeError, ValueError) as e:  # a knob the configuration refuses
            row = dict(error=f"{type(e).__name__}: {e}")
        print(json.dumps(dict(knobs=ov, **row)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
