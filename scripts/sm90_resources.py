"""Registers and spills of the verify kernels' launches, compiled for sm_90 on a machine without a GPU.

Triton compiles for a target it is told of: a stand-in driver names sm_90, each launch is compiled
(``warmup``), never run, and ``cuobjdump -res-usage`` (shipped with Triton) reads the cubin. A program
at the 255-register cap with a stack spills; registers per thread times warps bound the programs
per SM. A first filter for launch variants before a GPU times them.

    python scripts/sm90_resources.py --family mamba2 --batch 256 --T 5
    python scripts/sm90_resources.py --family delta --configs "VerifyConfig(block_v=16, num_warps=1)"
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver


class _Sm90:
    """The calls a launch makes on the active driver before it runs anything."""

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_device_interface(self):
        return torch.cuda


class _Compile:
    """Stands for a ``@triton.jit`` kernel: ``kernel[grid](...)`` compiles, keeps the result, runs nothing."""

    def __init__(self, kernel):
        self.kernel, self.compiled = kernel, None

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.compiled = self.kernel.warmup(*args, grid=grid, **kwargs)
        return launch


def resources(compiled) -> str:
    """``REG:.. STACK:.. SHARED:..`` of a compiled kernel."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    fields = next(line for line in out.splitlines() if "REG:" in line).split()
    return " ".join(x for x in fields if x.split(":")[0] in ("REG", "STACK", "SHARED"))


class BadConfig(ValueError):
    """A ``--configs`` expression that is not a ``VerifyConfig(...)`` of the family."""


def _parse(configs, cls) -> list:
    out = []
    for text in configs:
        try:
            cfg = eval(text, {"__builtins__": {}}, {"VerifyConfig": cls})  # a developer's own expression
        except Exception as exc:
            raise BadConfig(f"expected VerifyConfig(...) with {cls.__module__}'s fields; got {text!r} ({exc})")
        if not isinstance(cfg, cls):
            raise BadConfig(f"expected VerifyConfig(...); got {text!r}")
        out.append(cfg)
    return out


def _mamba2(batch, T, L, act, configs):
    from replayssm.kernels.mamba2 import verify_launch
    from replayssm.kernels.mamba2.config import VerifyConfig, verify_config

    shim = verify_launch.verify_kernel = _Compile(verify_launch.verify_kernel)
    H, P, N, G = 96, 80, 128, 8  # nemotron3-nano
    z = torch.zeros
    args = (z(batch, T, H, P, dtype=act), z(batch, T, H, dtype=act), z(batch, T, G, N, dtype=act),
            z(batch, T, G, N, dtype=act), z(batch, H, P, N), z(batch, H, L, P, dtype=act), z(batch, H, L),
            z(batch, G, L, N, dtype=act), z(batch, dtype=torch.int32), z(H), z(H), z(H), None, True,
            z(batch, T, H, P, dtype=act), True)
    for cfg in [verify_config(batch, H, P, N, G, 132)] + _parse(configs, VerifyConfig):
        verify_launch.launch_verify(*args, cfg)
        yield cfg, resources(shim.compiled)


def _delta(batch, T, L, act, configs, kda=False):
    from replayssm.kernels.delta import verify_launch
    from replayssm.kernels.delta.config import VerifyConfig, default_verify_config

    shim = verify_launch.verify_kernel = _Compile(verify_launch.verify_kernel)
    Hk, HV, K, V = (32, 32, 128, 128) if kda else (16, 32, 128, 128)  # kimi-linear / qwen3.5-4b
    z = torch.zeros
    g = z(batch, T, HV, K) if kda else z(batch, T, HV)
    gb = z(batch, HV, L, K) if kda else z(batch, HV, L)
    args = (z(batch, T, Hk, K), z(batch, T, Hk, K), z(batch, T, HV, V, dtype=act), g, z(batch, T, HV),
            z(batch, HV, K, V), z(batch, HV, L, V, dtype=act), z(batch, Hk, L, K, dtype=act), gb,
            z(batch, dtype=torch.int32), z(batch, T, HV, V, dtype=act))
    for cfg in [default_verify_config(K, batch, kda)] + _parse(configs, VerifyConfig):
        verify_launch.launch_verify(*args, write_idle=True, config=cfg)
        yield cfg, resources(shim.compiled)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=("mamba2", "delta", "kda"), default="mamba2")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--T", type=int, default=5)
    ap.add_argument("--L", type=int, default=16)
    ap.add_argument("--configs", nargs="*", default=[], help="VerifyConfig(...) expressions beside the default")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("sm90_resources.py: unset TRITON_INTERPRET (this compiles for sm_90)", file=sys.stderr)
        return 2
    driver.set_active(_Sm90())
    act = torch.bfloat16
    if args.family == "mamba2":
        rows = _mamba2(args.batch, args.T, args.L, act, args.configs)
    else:
        rows = _delta(args.batch, args.T, args.L, act, args.configs, kda=args.family == "kda")
    try:
        for i, (cfg, res) in enumerate(rows):
            print(f"{'default ' if i == 0 else ''}{cfg}: {res}")
    except BadConfig as exc:
        print(f"sm90_resources.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
