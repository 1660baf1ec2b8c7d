"""``replayssm inspect MODEL``: the SSM layers of a model, from its config alone."""

from __future__ import annotations

import typer

from replayssm.config import DEFAULT_BUFFER_LEN, MAX_BUFFER_LEN, parse_buffer_len

from .common import option_parser, out, print_json, quiet_transformers

MODEL_HELP = ("A checkpoint directory, a hub id already in the local Hugging Face cache (nothing is downloaded), "
              "or tiny:<family> (a built-in tiny model, e.g. tiny:mamba2, tiny:nemotron_h, tiny:qwen3_next).")


def inspect_command(
    model: str = typer.Argument(..., metavar="MODEL", help=MODEL_HELP, show_default=False),
    buffer_len: int = typer.Option(DEFAULT_BUFFER_LEN, "--buffer-len", "-L", callback=option_parser(parse_buffer_len),
                                   help=f"Ring-buffer length used for the buffer-bytes column (1-{MAX_BUFFER_LEN})."),
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
    from replayssm.formatting import count, human_bytes
    from replayssm.inspection import describe

    from .render import check_line, inspect_table, note_line, reason_lines

    quiet_transformers()
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
    act = info["act_dtype"] + (" assumed: config.json records no dtype" if info["act_dtype_assumed"] else "")
    out.print(f"state per sequence: {human_bytes(totals['state_bytes'])} (fp32); "
              f"buffers per sequence at L={buffer_len}: {human_bytes(totals['buffer_bytes'])} ({act} activations)")
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
