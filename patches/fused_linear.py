"""The model's linear layers as a weight-streaming Triton GEMV at decode batch sizes.

``fuse_decode_linears(model)`` gives every ``nn.Linear`` of the model (its own ``forward``, not a
subclass's) an instance ``forward``: a one-row CUDA input with a 16-bit weight of its dtype, inside a
CUDA-graph capture (the graph-decoded step of a batch-1 ``generate()``), runs
``replayssm.kernels.linear.linear_small_batch`` (cuBLAS's GEMV reaches a fraction of the copy
bandwidth on the decode step's small projections); anything else (eager calls, more rows, prefill,
fp32 models, CPU tensors, autograd, ``torch.compile``, tensor subclasses) runs the module's own forward. fp32 weights keep cuBLAS so that an fp32 model's tokens stay those of
the stock model. The instance attribute is a ``functools.partial`` of a module-level function, so deep copies and
pickles of a patched model stay self-contained; ``unfuse_decode_linears`` removes exactly those.
"""

from __future__ import annotations

import functools

import torch

from replayssm.kernels.backend import resolve_backend
from replayssm.kernels.linear import linear_small_batch_triton

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


def _small_batch_forward(module: torch.nn.Linear, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 (nn.Linear's name)
    x, params = input, module._parameters  # (not module.weight: __getattr__ costs a µs or more a call)
    weight, bias = params.get("weight"), params.get("bias")
    if (weight is not None and weight.dtype in KERNEL_WEIGHT_DTYPES and x.dtype == weight.dtype
            and type(x) is torch.Tensor and type(weight) in _PLAIN and (bias is None or type(bias) in _PLAIN)
            and (bias is None or bias.dtype == weight.dtype) and not torch.compiler.is_compiling()
            and x.dim() >= 1 and 0 < x.numel() <= DECODE_ROWS * weight.shape[1] and x.shape[-1] == weight.shape[1]
            and x.device.type in KERNEL_DEVICES and weight.device == x.device and weight.stride(-1) == 1
            and not (torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad))
            and _capturing() and resolve_backend("auto", x.device) == "triton"):
        return linear_small_batch_triton(x, weight, bias)
    return type(module).forward(module, x)


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
    return count


def unfuse_decode_linears(model: torch.nn.Module) -> None:
    """Remove the instance ``forward`` that ``fuse_decode_linears`` set (and no other)."""
    for module in model.modules():
        if _is_ours(module.__dict__.get("forward")):
            del module.__dict__["forward"]
