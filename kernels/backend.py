"""Choosing between the Triton kernels and the PyTorch references.

``backend`` is one of ``"auto"``, ``"triton"``, ``"torch"``. The environment variable
``REPLAYSSM_BACKEND`` (same values) overrides what callers ask for.

* ``"auto"``: Triton for CUDA tensors when Triton imports, the PyTorch reference otherwise.
* ``"triton"``: always the Triton kernels; on CPU tensors this needs ``TRITON_INTERPRET=1``
  in the environment before Triton is imported (the interpreter runs the same kernels).
* ``"torch"``: always the PyTorch reference.

Also the host-side helpers that every kernel family's launch code shares: ``num_sms``,
``dependent_launch_supported``, ``compiled_in``, ``pow2`` and ``is_pow2``.
"""

from __future__ import annotations

import functools
import os

import torch

BACKENDS = ("auto", "triton", "torch")
ENV_VAR = "REPLAYSSM_BACKEND"


class KernelBackendError(RuntimeError):
    """The requested backend cannot run on the given tensors."""


_TRITON_OK: bool | None = None


def triton_available() -> bool:
    """Whether ``import triton`` works (checked once; a plain global so torch.compile traces it)."""
    global _TRITON_OK
    if _TRITON_OK is None:
        try:
            import triton  # noqa: F401
            import triton.language  # noqa: F401

            _TRITON_OK = True
        except Exception:
            _TRITON_OK = False
    return _TRITON_OK


def triton_interpreter_on() -> bool:
    """Whether ``TRITON_INTERPRET=1`` is set (Triton kernels then run on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_backend(requested: str, device: torch.device) -> str:
    """Return ``"triton"`` or ``"torch"`` for tensors on ``device``.

    Raises ``KernelBackendError`` when Triton is forced but cannot run there.
    """
    forced = os.environ.get(ENV_VAR)
    if forced is None and requested == "auto":  # the per-call case of the decode step: nothing to parse
        return "triton" if (device.type == "cuda" and triton_available()) else "torch"
    choice = (forced or requested or "auto").lower()
    if choice not in BACKENDS:
        source = f"${ENV_VAR}" if forced else "backend"
        raise KernelBackendError(f"{source} must be one of {', '.join(BACKENDS)}; got {choice!r}")
    if choice == "torch":
        return "torch"
    if choice == "auto":
        return "triton" if (device.type == "cuda" and triton_available()) else "torch"
    # explicit triton
    if not triton_available():
        raise KernelBackendError("backend='triton' needs the triton package, which failed to import")
    if device.type != "cuda" and not triton_interpreter_on():
        raise KernelBackendError(
            f"backend='triton' on {device.type} tensors needs TRITON_INTERPRET=1 set before triton is imported"
        )
    return "triton"


@functools.lru_cache(maxsize=16)
def num_sms(device_type: str, index: int | None = None) -> int:
    """Multiprocessors of a CUDA device; off the GPU (interpreter runs) 132, so that launch
    heuristics pick the shapes they pick on a GPU of that size."""
    if device_type == "cuda":
        return torch.cuda.get_device_properties(index if index is not None else torch.cuda.current_device()
                                                ).multi_processor_count
    return 132


@functools.lru_cache(maxsize=16)
def dependent_launch_supported(device_type: str, index: int | None = None) -> bool:
    """Whether a launch may start while the launch before it finishes (programmatic dependent
    launch: CUDA devices of compute capability 9.0 or newer, a Triton with grid dependency
    control; never under the interpreter)."""
    if device_type != "cuda" or triton_interpreter_on() or not triton_available():
        return False
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
    except Exception:
        return False
    cap = torch.cuda.get_device_capability(index if index is not None else torch.cuda.current_device())
    return cap[0] >= 9


def pow2(v: int) -> int:
    """The smallest power of two >= ``v`` (1 for ``v <= 1``): a block size covering ``v``."""
    return 1 << (max(1, int(v)) - 1).bit_length()


def is_pow2(v: int) -> bool:
    """Whether ``v`` is a positive power of two (a launch knob's check)."""
    return v >= 1 and v & (v - 1) == 0


def compiled_in(values: tuple) -> tuple:
    """The same named tuple with every value a ``tl.constexpr``: how a kernel takes a tuple of
    compile-time constants (its fields then read as constants inside the kernel)."""
    import triton.language as tl

    return type(values)(*(tl.constexpr(v) for v in values))
