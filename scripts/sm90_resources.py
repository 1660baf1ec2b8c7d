"""Registers and spills of the kernels' launches, compiled for sm_90 on a machine without a GPU.

Triton compiles for a target it is told of: a stand-in driver names sm_90, each launch is compiled
(``warmup``), never run, and ``cuobjdump`` (shipped with Triton) reads the cubin. A program at the
255-register cap with a stack spills; registers per thread times warps bound the programs per SM.
``--ops`` adds the program's most frequent SASS instructions (a conversion such as I2F or F2I runs
at a quarter of the fp32 rate). A first filter for launch variants before a GPU times them.

    python scripts/sm90_resources.py --family mamba2 --batch 256 --T 5
    python scripts/sm90_resources.py --family delta --configs "VerifyConfig(block_v=16, num_warps=1)"
    python scripts/sm90_resources.py --kernel replay --family mamba2 --state-dtype int8 --ops
    python scripts/sm90_resources.py --family kda --state-dtype bfloat16 --stochastic
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

from replayssm.kernels.quant import is_scaled


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
        self.kernel, self.compiled = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.compiled.append(self.kernel.warmup(*args, grid=grid, **kwargs))
        return launch


def _shim(module, names) -> dict:
    """Replace each kernel ``names`` of ``module`` by a ``_Compile`` stand-in; returns them by name."""
    shims = {name: _Compile(getattr(module, name)) for name in names}
    for name, shim in shims.items():
        setattr(module, name, shim)
    return shims


def _compiled(shims) -> list:
    """(name, compiled kernel) of each launch the stand-ins compiled (a name once per launch), and reset them."""
    out = [(name, c) for name, s in shims.items() for c in s.compiled]
    for s in shims.values():
        s.compiled = []
    return out


def _cuobjdump(compiled, flag: str) -> str:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    try:
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)


def resources(compiled) -> str:
    """``REG:.. STACK:.. SHARED:..`` of a compiled kernel."""
    out = _cuobjdump(compiled, "-res-usage")
    fields = next(line for line in out.splitlines() if "REG:" in line).split()
    return " ".join(x for x in fields if x.split(":")[0] in ("REG", "STACK", "SHARED"))


def sass_ops(compiled, most: int = 16) -> str:
    """The ``most`` most frequent SASS opcodes of a compiled kernel, with their counts."""
    ops = collections.Counter()
    for line in _cuobjdump(compiled, "-sass").splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            ops[m.group(1)] += 1
    return ", ".join(f"{op}:{n}" for op, n in ops.most_common(most))


class BadConfig(ValueError):
    """A ``--configs`` expression that is not a ``VerifyConfig(...)`` / ``LaunchConfig(...)`` of the family."""


def _parse(configs, cls) -> list:
    name = cls.__name__
    out = []
    for text in configs:
        try:
            cfg = eval(text, {"__builtins__": {}}, {name: cls})  # a developer's own expression
        except Exception as exc:
            raise BadConfig(f"expected {name}(...) with {cls.__module__}'s fields; got {text!r} ({exc})")
        if not isinstance(cfg, cls):
            raise BadConfig(f"expected {name}(...); got {text!r}")
        out.append(cfg)
    return out


def _quant_args(batch, sdt, scale_shape, stochastic) -> dict:
    """The launch's state_scale / state_rng for a checkpoint of ``sdt``."""
    return dict(state_scale=torch.zeros(batch, *scale_shape) if is_scaled(sdt) else None,
                state_rng=torch.zeros(batch, 2, dtype=torch.int64) if stochastic else None)


def _mamba2(batch, T, L, act, sdt, stochastic, configs):
    from replayssm.kernels.mamba2 import verify_launch
    from replayssm.kernels.mamba2.config import VerifyConfig, verify_config

    shims = _shim(verify_launch, ("verify_kernel",))
    H, P, N, G = 96, 80, 128, 8  # nemotron3-nano
    z = torch.zeros
    args = (z(batch, T, H, P, dtype=act), z(batch, T, H, dtype=act), z(batch, T, G, N, dtype=act),
            z(batch, T, G, N, dtype=act), z(batch, H, P, N).to(sdt), z(batch, H, L, P, dtype=act), z(batch, H, L),
            z(batch, G, L, N, dtype=act), z(batch, dtype=torch.int32), z(H), z(H), z(H), None, True,
            z(batch, T, H, P, dtype=act), True)
    for cfg in [verify_config(batch, H, P, N, G, 132)] + _parse(configs, VerifyConfig):
        verify_launch.launch_verify(*args, cfg, **_quant_args(batch, sdt, (H, P), stochastic))
        yield cfg, _compiled(shims)


def _delta(batch, T, L, act, sdt, stochastic, configs, kda=False):
    from replayssm.kernels.delta import verify_launch
    from replayssm.kernels.delta.config import VerifyConfig, default_verify_config

    shims = _shim(verify_launch, ("verify_kernel",))
    Hk, HV, K, V = (32, 32, 128, 128) if kda else (16, 32, 128, 128)  # kimi-linear / qwen3.5-4b
    z = torch.zeros
    g = z(batch, T, HV, K) if kda else z(batch, T, HV)
    gb = z(batch, HV, L, K) if kda else z(batch, HV, L)
    args = (z(batch, T, Hk, K), z(batch, T, Hk, K), z(batch, T, HV, V, dtype=act), g, z(batch, T, HV),
            z(batch, HV, K, V).to(sdt), z(batch, HV, L, V, dtype=act), z(batch, Hk, L, K, dtype=act), gb,
            z(batch, dtype=torch.int32), z(batch, T, HV, V, dtype=act))
    for cfg in [default_verify_config(K, batch, kda, rounds=sdt != torch.float32)] + _parse(configs, VerifyConfig):
        verify_launch.launch_verify(*args, write_idle=True, config=cfg, **_quant_args(batch, sdt, (HV, V), stochastic))
        yield cfg, _compiled(shims)


def _mamba2_replay(batch, L, act, sdt, configs):
    from replayssm.kernels.mamba2 import launch
    from replayssm.kernels.mamba2.config import LaunchConfig

    shims = _shim(launch, ("replay_kernel", "replay_kernel_dyn"))
    H, P, N, G = 128, 64, 128, 8  # nemotron3-super
    z = torch.zeros
    scaled = is_scaled(sdt)
    args = (z(batch, H, P, dtype=act), z(batch, H, dtype=act), z(batch, G, N, dtype=act), z(batch, G, N, dtype=act),
            z(batch, H, P, N).to(sdt), z(batch, H, L, P, dtype=act), z(batch, H, L, dtype=act),
            z(batch, G, L, N, dtype=act), z(batch, dtype=torch.int32), z(H), z(H), z(H), None, True,
            z(batch, H, P, dtype=act), False, z(batch, dtype=torch.int32))
    default = launch.launch_config(None, batch, H, P, N, G, L, sdt, act, 132)  # as the launch widens it
    for cfg in [default] + _parse(configs, LaunchConfig):
        launch.launch_replay(*args, config=cfg, state_scale=z(batch, H, P) if scaled else None)
        yield cfg, _compiled(shims)


def _delta_replay(batch, L, act, sdt, configs, kda=False):
    from replayssm.kernels.delta import launch
    from replayssm.kernels.delta.config import LaunchConfig, default_config

    shims = _shim(launch, ("coef_kernel", "gdn_coef_kernel", "output_kernel", "flush_kernel", "small_batch_kernel"))
    launch.advance_cursor_triton = lambda *a, **k: None  # a separate launch the stand-in cannot run
    Hk, HV, K, V = (32, 32, 128, 128) if kda else (16, 32, 128, 128)  # kimi-linear / qwen3.5-4b
    z = torch.zeros
    scaled = is_scaled(sdt)
    args = (z(batch, Hk, K, dtype=act), z(batch, Hk, K, dtype=act), z(batch, HV, V, dtype=act),
            z(batch, HV, K) if kda else z(batch, HV), z(batch, HV), z(batch, HV, K, V).to(sdt),
            z(batch, HV, L, V, dtype=act), z(batch, Hk, L, K, dtype=act), z(batch, HV, L, K) if kda else z(batch, HV, L),
            z(batch, dtype=torch.int32), z(batch, HV, V, dtype=act))
    for cfg in [default_config(batch, K, V, sdt, kda)] + _parse(configs, LaunchConfig):
        launch.delta_replay_decode_triton(*args, config=cfg, state_scale=z(batch, HV, V) if scaled else None)
        yield cfg, _compiled(shims)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.int8,
          "float8_e4m3fn": torch.float8_e4m3fn}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", choices=("verify", "replay"), default="verify")
    ap.add_argument("--family", choices=("mamba2", "delta", "kda"), default="mamba2")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--T", type=int, default=5, help="verify window")
    ap.add_argument("--L", type=int, default=16)
    ap.add_argument("--state-dtype", choices=tuple(DTYPES), default="float32", help="checkpoint dtype")
    ap.add_argument("--stochastic", action="store_true", help="verify: stochastic rounding of the fold")
    ap.add_argument("--configs", nargs="*", default=[],
                    help="VerifyConfig(...) / LaunchConfig(...) expressions beside the default")
    ap.add_argument("--ops", action="store_true", help="also the most frequent SASS instructions")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("sm90_resources.py: unset TRITON_INTERPRET (this compiles for sm_90)", file=sys.stderr)
        return 2
    driver.set_active(_Sm90())
    act, sdt = torch.bfloat16, DTYPES[args.state_dtype]
    kda = args.family == "kda"
    if args.kernel == "verify":
        rows = (_mamba2(args.batch, args.T, args.L, act, sdt, args.stochastic, args.configs) if args.family == "mamba2"
                else _delta(args.batch, args.T, args.L, act, sdt, args.stochastic, args.configs, kda=kda))
    else:
        rows = (_mamba2_replay(args.batch, args.L, act, sdt, args.configs) if args.family == "mamba2"
                else _delta_replay(args.batch, args.L, act, sdt, args.configs, kda=kda))
    try:
        for i, (cfg, kernels) in enumerate(rows):
            print(f"{'default ' if i == 0 else ''}{cfg}:")
            for name, compiled in kernels:
                print(f"  {name}: {resources(compiled)}")
                if args.ops:
                    print(f"    {sass_ops(compiled)}")
    except BadConfig as exc:
        print(f"sm90_resources.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
