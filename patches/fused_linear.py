"""The model's linear layers as a weight-streaming Triton GEMV at decode batch sizes.

``fuse_decode_linears(model)`` gives every ``nn.Linear`` of the model (its own ``forward``, not a
subclass's) an instance ``forward``: a one-row CUDA input with a 16-bit weight of its dtype, inside a
CUDA-graph capture (the graph-decoded step of a batch-1 ``generate()``), runs
``replayssm.kernels.linear.linear_small_batch`` (cuBLAS's GEMV reaches a fraction of the copy
bandwidth on the decode step's small projections); anything else (eager calls, more rows, prefill,
fp32 models, CPU tensors, autograd, ``torch.compile``, tensor subclasses) runs the module's own forward. fp32 weights keep cuBLAS so that an fp32 model's tokens stay those of
the stock model. The instance attribute is a ``functools.partial`` of a module-level function, so deep copies and
pickles of a patched model stay self-contained; ``unfuse_decode_linears`` removes exactly those.

Fewer, larger launches where a step's projections share their input: the patched mixers call
``linear_outputs`` / ``linear_concat`` (one grouped launch for, e.g., Gated DeltaNet's four input
projections, where each call would take the kernel; otherwise one GEMM where their weights are packed,
``packed_linear``), and a gated MLP (``gate_proj``, ``up_proj``,
``down_proj``, ``act_fn``) gets an instance ``forward`` that runs gate and up as one gated launch
(activation and product on the fp32 sums) once its first call outside a capture has found, on one
row, that the module computes ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` exactly.
"""

from __future__ import annotations

import functools

import torch

from replayssm.kernels.backend import resolve_backend
from replayssm.kernels.linear import (GROUP_MAX, linear_small_batch_gated_triton, linear_small_batch_group_triton,
                                      linear_small_batch_triton)

from .packed_linear import packed_outputs

#: devices and weight dtypes whose small-batch calls run the kernel
KERNEL_DEVICES = ("cuda",)
KERNEL_WEIGHT_DTYPES = (torch.bfloat16, torch.float16)
#: rows of x that take the kernel: one (a batch-1 decode step). On the H200 it beat cuBLAS there
#: (1.16x over the Qwen3.5-like step's linears, 1.14x Nemotron-like) and lost at 8 rows (0.81x, 0.90x)
#: (examples/benchmarks/README.md)
DECODE_ROWS = 1


def _capturing() -> bool:
    """Whether a CUDA graph is being captured: only then does the kernel run. A Triton launch costs
    2-4x cuBLAS's host time per call, which an eager decode step pays on every linear layer; a
    replayed graph pays no host time per kernel."""
    return torch.cuda.is_current_stream_capturing()
#: tensor types whose memory is what their dtype says (a tensor subclass, e.g. a quantized weight that
#: reports bf16, keeps the module's path)
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _takes_kernel(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> bool:
    """Whether ``F.linear(x, weight, bias)`` runs the kernel (see the module notes)."""
    return (weight is not None and weight.dtype in KERNEL_WEIGHT_DTYPES and x.dtype == weight.dtype
            and type(x) is torch.Tensor and type(weight) in _PLAIN and (bias is None or type(bias) in _PLAIN)
            and (bias is None or bias.dtype == weight.dtype) and not torch.compiler.is_compiling()
            and x.dim() >= 1 and 0 < x.numel() <= DECODE_ROWS * weight.shape[1] and x.shape[-1] == weight.shape[1]
            and x.device.type in KERNEL_DEVICES and weight.device == x.device and weight.stride(-1) == 1
            and not (torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad))
            and _capturing() and resolve_backend("auto", x.device) == "triton")


def _small_batch_forward(module: torch.nn.Linear, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 (nn.Linear's name)
    params = module._parameters  # (not module.weight: __getattr__ costs a µs or more a call)
    weight, bias = params.get("weight"), params.get("bias")
    if _takes_kernel(input, weight, bias):
        return linear_small_batch_triton(input, weight, bias)
    return type(module).forward(module, input)


def _grouped(x: torch.Tensor, modules) -> torch.Tensor | None:
    """The columns of every module's output, from one launch, or None where a call would not take it
    (a module not routed here, or a call that any of them would leave to its own forward)."""
    if not (x.device.type in KERNEL_DEVICES and _capturing()) or not 1 < len(modules) <= GROUP_MAX or not all(
            _is_ours(m.__dict__.get("forward")) for m in modules):
        return None
    params = [m._parameters for m in modules]
    weights, biases = [p.get("weight") for p in params], [p.get("bias") for p in params]
    if (any(b is None for b in biases) and any(b is not None for b in biases)) or not all(
            _takes_kernel(x, w, b) for w, b in zip(weights, biases)):
        return None
    return linear_small_batch_group_triton(x, weights, None if biases[0] is None else biases)


def _one_launch(x: torch.Tensor, modules) -> torch.Tensor | None:
    """All the modules' output columns from one launch: the grouped kernel where each call would take it,
    else one GEMM on their packed weight (``packed_linear``), else None."""
    out = _grouped(x, modules)
    return packed_outputs(x, modules, _is_ours) if out is None else out


def linear_outputs(x: torch.Tensor, modules) -> tuple[torch.Tensor, ...]:
    """``tuple(m(x) for m in modules)`` for linear layers that share their input: one launch for all
    (the outputs are views of its columns) where ``_one_launch`` finds one."""
    out = _one_launch(x, modules)
    if out is None:
        return tuple(m(x) for m in modules)
    return torch.split(out, [m.out_features for m in modules], dim=-1)


def linear_concat(x: torch.Tensor, modules) -> torch.Tensor:
    """``torch.cat([m(x) for m in modules], -1)``, in one launch where ``_one_launch`` finds one."""
    out = _one_launch(x, modules)
    return torch.cat([m(x) for m in modules], dim=-1) if out is None else out


# ------------------------------------------------------------------ gated MLPs
_MLP_ATTR = "_replayssm_gated_mlp"


def _activation_name(act: torch.nn.Module) -> str | None:
    """The kernel activation that computes ``act``, or None."""
    name = type(act).__name__
    if isinstance(act, torch.nn.SiLU) or name == "SiLUActivation":
        return "silu"
    if isinstance(act, torch.nn.ReLU):
        return "relu"
    if name in ("GELUTanh", "NewGELUActivation") or (isinstance(act, torch.nn.GELU) and act.approximate == "tanh"):
        return "gelu_tanh"
    return None


def is_gated_mlp(module: torch.nn.Module) -> bool:
    """A module with ``gate_proj``, ``up_proj``, ``down_proj`` (``nn.Linear``, gate and up bias-free, of one
    shape) and an ``act_fn`` the gated kernel computes: what ``fuse_decode_linears`` routes."""
    linears = [getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    return (all(isinstance(m, torch.nn.Linear) for m in linears) and linears[0].bias is None
            and linears[1].bias is None and linears[0].weight.shape == linears[1].weight.shape
            and _activation_name(getattr(module, "act_fn", None)) is not None)


def _gated_mlp_forward(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The MLP's forward; inside a capture, one gated launch for gate and up (then ``down_proj``). The
    first call outside a capture checks, on one row, that the module computes
    ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` exactly; a module that does not keeps its forward."""
    activation = module.__dict__.get(_MLP_ATTR)
    gate, up = module.gate_proj, module.up_proj
    capturing = x.device.type in KERNEL_DEVICES and _capturing()
    if (activation and capturing and _is_ours(gate.__dict__.get("forward")) and _is_ours(up.__dict__.get("forward"))
            and _takes_kernel(x, gate.weight, None) and _takes_kernel(x, up.weight, None)):
        return module.down_proj(linear_small_batch_gated_triton(x, gate.weight, up.weight, activation=activation))
    if activation is None and not capturing and x.numel() and not torch.compiler.is_compiling():
        row = x.reshape(-1, x.shape[-1])[:1]
        with torch.no_grad():
            same = torch.equal(type(module).forward(module, row),
                               module.down_proj(module.act_fn(gate(row)) * up(row)))
        module.__dict__[_MLP_ATTR] = _activation_name(module.act_fn) if same else False
    return type(module).forward(module, x)


def _is_ours_mlp(forward) -> bool:
    return isinstance(forward, functools.partial) and forward.func is _gated_mlp_forward


def _is_ours(forward) -> bool:
    return isinstance(forward, functools.partial) and forward.func is _small_batch_forward


def fuse_decode_linears(model: torch.nn.Module) -> int:
    """Route the small-batch calls of every plain ``nn.Linear`` of ``model`` to the GEMV kernel (see
    the module notes). Modules that already have an instance ``forward`` are left alone. Returns the
    number of modules rewritten (already rewritten ones included)."""
    count = 0
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear) or type(module).forward is not torch.nn.Linear.forward:
            continue
        forward = module.__dict__.get("forward")
        if forward is None:
            module.forward = functools.partial(_small_batch_forward, module)
        count += forward is None or _is_ours(forward)
    for module in model.modules():
        if is_gated_mlp(module) and "forward" not in module.__dict__:
            module.forward = functools.partial(_gated_mlp_forward, module)
    return count


def unfuse_decode_linears(model: torch.nn.Module) -> None:
    """Remove the instance ``forward`` that ``fuse_decode_linears`` set (and no other)."""
    for module in model.modules():
        if _is_ours(module.__dict__.get("forward")) or _is_ours_mlp(module.__dict__.get("forward")):
            del module.__dict__["forward"]
            module.__dict__.pop(_MLP_ATTR, None)
