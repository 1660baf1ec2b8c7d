"""``replayssm inspect MODEL``: the SSM layers of a model, from its config alone."""

from __future__ import annotations

from typing import Any

import typer

from .common import out, print_json, quiet_transformers

MODEL_HELP = ("A checkpoint directory, a hub id already in the local Hugging Face cache (nothing is downloaded), "
              "or tiny:<family> (a built-in tiny model, e.g. tiny:mamba2, tiny:nemotron_h, tiny:qwen3_next).")


def describe(model: str, *, buffer_len: int = 16, trust_remote_code: bool = False) -> dict[str, Any]:
    """Everything ``inspect`` shows, as a JSON-ready dict (meta device: no weights read)."""
    from replayssm.checkpoint import scan_checkpoint
    from replayssm.discovery import find_ssm_layers
    from replayssm.errors import ReplaySSMError
    from replayssm.resolve import build_meta_model, load_config, resolve_model
    from replayssm.validate import checkpoint_dtype_name

    quiet_transformers()
    resolved = resolve_model(model, materialize=False)
    config = load_config(resolved, trust_remote_code=trust_remote_code)
    meta = build_meta_model(config, trust_remote_code=trust_remote_code, causal_lm_only=False)
    records = find_ssm_layers(meta)
    dtype = checkpoint_dtype_name(config.to_dict()) or "bf16"
    act_bytes = 4 if dtype == "fp32" else 2
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
        "act_bytes": act_bytes,
        "layers": layers,
        "rewritable": len(rewritable),
        "totals": {"state_bytes": sum(row["state_bytes"] for row in layers),
                   "buffer_bytes": sum(row["buffer_bytes"] for row in rewritable)},
        "weights": weights,
    }


def inspect_command(
    model: str = typer.Argument(..., metavar="MODEL", help=MODEL_HELP, show_default=False),
    buffer_len: int = typer.Option(16, "--buffer-len", "-L", min=1, max=256,
                                   help="Ring-buffer length used for the buffer-bytes column."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code",
                                           help="Allow a checkpoint's own modelling code (config only)."),
    json_output: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
) -> int:
    """Show a model's SSM layers: kind, class, shapes, state bytes per sequence, rewritable or why not.

    The model is built on the meta device from its config: no weights are read.

    [bold]Examples[/bold]

      replayssm inspect tiny:nemotron_h

      replayssm inspect ./checkpoints/Nemotron-H-8B --buffer-len 32

      replayssm inspect ibm-granite/granite-4.0-h-tiny --json
    """
    from replayssm.checkpoint import human_bytes

    from .render import check_line, count, inspect_table, note_line, reason_lines

    info = describe(model, buffer_len=buffer_len, trust_remote_code=trust_remote_code)
    if json_output:
        print_json(info)
        return 0
    layers = info["layers"]
    title = f"{info['architecture']} ({info['model_type']}) · {count(len(layers), 'SSM layer')}"
    if not layers:
        out.print(note_line(f"{info['architecture']} ({info['model_type']}) has no SSM layer; nothing to convert"))
        return 0
    out.print(inspect_table(layers, title=title, buffer_len=buffer_len))
    for line in reason_lines(layers):
        out.print(line)
    totals = info["totals"]
    out.print(f"state per sequence: {human_bytes(totals['state_bytes'])} (fp32); "
              f"buffers per sequence at L={buffer_len}: {human_bytes(totals['buffer_bytes'])}")
    weights = info["weights"]
    if weights is not None:
        if weights["ok"]:
            out.print(check_line(True, f"weights: {count(weights['files'], 'safetensors file')}, "
                                       f"{weights['tensors']} tensors, {human_bytes(weights['bytes'])}"))
        else:
            out.print(check_line(False, f"weights: {weights['error']}"))
    n = info["rewritable"]
    if n == len(layers):
        out.print(check_line(True, f"{'all ' if n > 1 else ''}{count(n, 'SSM layer')} can be rewritten"))
    elif n:
        out.print(note_line(f"{n} of {count(len(layers), 'SSM layer')} can be rewritten; convert with "
                            "--skip-unsupported to skip the others"))
    else:
        out.print(check_line(False, "no SSM layer can be rewritten by this version"))
    return 0
