"""``describe``: what ``replayssm inspect`` shows about a model, from its config alone."""

from __future__ import annotations

from typing import Any

from .config import DEFAULT_BUFFER_LEN, StateDtype, activation_dtype, parse_buffer_len
from .errors import ReplaySSMError
from .resolve import resolve_model


def describe(model: str, *, buffer_len: int = DEFAULT_BUFFER_LEN, trust_remote_code: bool = False) -> dict[str, Any]:
    """Every SSM layer of MODEL and the checkpoint's weights, as a JSON-ready dict.

    The model is built on the meta device (no weights read). Buffer bytes assume activations
    in the dtype config.json records (``act_dtype``); when it records none, 16-bit
    (``act_dtype_assumed`` is then True).
    """
    buffer_len = parse_buffer_len(buffer_len)
    resolved = resolve_model(model, materialize=False)  # path errors before torch is imported

    from .checkpoint_dir import scan_checkpoint
    from .resolve import build_meta_model, load_config

    config = load_config(resolved, trust_remote_code=trust_remote_code)
    from .discovery import find_ssm_layers  # torch

    meta = build_meta_model(config, trust_remote_code=trust_remote_code, causal_lm_only=False)
    records = find_ssm_layers(meta)
    act_dtype, assumed = activation_dtype(config.to_dict())
    act_bytes = StateDtype(act_dtype).itemsize
    layers = []
    for r in records:
        row = r.to_dict()
        row["buffer_bytes"] = r.buffer_bytes(buffer_len, act_bytes) if r.can_rewrite else 0
        layers.append(row)
    weights: dict[str, Any] | None = None
    if resolved.path is not None:
        try:
            scan = scan_checkpoint(resolved.path)
            weights = {"ok": True, "files": len(scan.weights), "bytes": scan.weights_bytes,
                       "tensors": scan.num_tensors, "error": None}
        except ReplaySSMError as exc:
            weights = {"ok": False, "files": 0, "bytes": 0, "tensors": 0, "error": str(exc)}
    rewritable = [row for row in layers if row["can_rewrite"]]
    return {
        "ok": True,
        "model": model,
        "source": resolved.to_dict(),
        "model_type": getattr(config, "model_type", None),
        "architecture": type(meta).__name__,
        "buffer_len": buffer_len,
        "act_dtype": act_dtype,
        "act_dtype_assumed": assumed,
        "act_bytes": act_bytes,
        "layers": layers,
        "rewritable": len(rewritable),
        "totals": {"state_bytes": sum(row["state_bytes"] for row in layers),
                   "buffer_bytes": sum(row["buffer_bytes"] for row in rewritable)},
        "weights": weights,
    }


__all__ = ["describe"]
