"""``replayssm convert MODEL OUT_DIR``: write, validate and publish a ReplaySSM checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from replayssm.config import (
    DEFAULT_BUFFER_LEN,
    MAX_BUFFER_LEN,
    Backend,
    ModelDtype,
    StateDtype,
    StateRounding,
    parse_backend,
    parse_buffer_len,
    parse_device,
    parse_model_dtype,
    parse_state_dtype,
    parse_state_rounding,
    parse_state_seed,
)

from .cmd_inspect import MODEL_HELP
from .common import choices, option_parser, out, print_json, quiet_transformers

DTYPE_ALIASES_HELP = "also float32, bfloat16, float16, half"


def convert_command(
    model: str = typer.Argument(..., metavar="MODEL", help=MODEL_HELP, show_default=False),
    out_dir: Path = typer.Argument(..., metavar="OUT_DIR", help="Where to write the converted checkpoint "
                                   "(must not exist unless --force).", show_default=False),
    buffer_len: int = typer.Option(DEFAULT_BUFFER_LEN, "--buffer-len", "-L", callback=option_parser(parse_buffer_len),
                                   help=f"Tokens buffered between state-checkpoint writes (1-{MAX_BUFFER_LEN})."),
    state_dtype: str = typer.Option(StateDtype.FP32.value, "--state-dtype", metavar=choices(StateDtype),
                                    callback=option_parser(parse_state_dtype),
                                    help=f"dtype of the state checkpoint ({DTYPE_ALIASES_HELP}, e4m3); fp8 and "
                                         "int8 keep an fp32 scale per head-dim vector."),
    state_rounding: str = typer.Option(StateRounding.NEAREST.value, "--state-rounding",
                                       metavar=choices(StateRounding), callback=option_parser(parse_state_rounding),
                                       help="How a checkpoint below fp32 is rounded when written (stochastic: "
                                            "unbiased, reproducible for --state-seed)."),
    state_seed: int = typer.Option(0, "--state-seed", metavar="N", callback=option_parser(parse_state_seed),
                                   help="Seed of stochastic rounding."),
    layers: Optional[List[str]] = typer.Option(None, "--layers", metavar="REGEX",
                                               help="Rewrite only the SSM layers whose name matches (full match, "
                                                    "qualified or from the decoder stack on, e.g. "
                                                    "'layers\\.[0-3]\\..*'; repeatable). Default: all."),
    skip_unsupported: bool = typer.Option(False, "--skip-unsupported", "--no-strict",
                                          help="Skip SSM layers this version cannot rewrite instead of failing."),
    backend: str = typer.Option(Backend.AUTO.value, "--backend", metavar=choices(Backend),
                                callback=option_parser(parse_backend),
                                help="Kernel backend recorded in the checkpoint."),
    cuda_graphs: bool = typer.Option(False, "--cuda-graphs/--no-cuda-graphs",
                                     help="Record that generate() replays each decode step as a CUDA graph "
                                          "(on CUDA; see README)."),
    graph_max_len: Optional[int] = typer.Option(None, "--graph-max-len", metavar="N", min=2,
                                                help="With --cuda-graphs: most cache positions one generate() "
                                                     "call may use (default: sized per call)."),
    validate: bool = typer.Option(True, "--validate/--no-validate",
                                  help="Load original and converted models and compare their logits and greedy "
                                       "tokens before publishing OUT_DIR."),
    device: str = typer.Option("auto", "--device", metavar="DEV", callback=option_parser(parse_device),
                               help="Device for validation: auto, cpu, cuda, cuda:N, mps."),
    dtype: str = typer.Option(ModelDtype.AUTO.value, "--dtype", metavar=choices(ModelDtype),
                              callback=option_parser(parse_model_dtype),
                              help=f"dtype for validation (auto: the checkpoint's on GPU, fp32 on CPU; "
                                   f"{DTYPE_ALIASES_HELP})."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check input, options and output, show the plan; write nothing (no validation)."),
    force: bool = typer.Option(False, "--force", "-f", help="Replace an existing OUT_DIR (only once the new one is "
                                                           "complete)."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code",
                                           help="Allow a checkpoint's own modelling code."),
    json_output: bool = typer.Option(False, "--json", help="Print one JSON result instead of tables and bars."),
) -> int:
    """Convert a Hugging Face hybrid checkpoint into a ReplaySSM checkpoint.

    OUT_DIR is a standard checkpoint: the same weight files byte for byte, tokenizer and generation config copied, and config.json gaining a "replayssm" block. Stock transformers still loads it as the original model; replayssm.from_pretrained(OUT_DIR) loads it patched. By default the converted checkpoint is validated (original vs ReplaySSM logits and greedy tokens) before OUT_DIR appears, atomically: on any error or Ctrl-C nothing is left behind.

    MODEL needs safetensors weights (model.safetensors or a sharded index); checkpoints with only pytorch_model*.bin are refused (re-save them with save_pretrained first).

    [bold]Examples[/bold]

      replayssm convert tiny:nemotron_h out/tiny-nemotron

      replayssm convert ./Nemotron-H-8B out/nemotron-replay --buffer-len 32 --state-dtype bf16 --device cuda

      replayssm convert ibm-granite/granite-4.0-h-tiny out/granite --dry-run

      replayssm convert ./Zamba2-7B out/zamba --layers 'model\\.layers\\.[0-9]\\.mamba' --json
    """
    from replayssm.conversion import convert
    from replayssm.formatting import human_bytes

    from .progress import RichProgress
    from .render import check_line, files_table, note_line, summary_table

    quiet_transformers()
    with RichProgress(enabled=not json_output) as progress:
        result = convert(
            model, out_dir, buffer_len=buffer_len, state_dtype=state_dtype, state_rounding=state_rounding,
            state_seed=state_seed, layers=layers,
            strict=not skip_unsupported, backend=backend, cuda_graphs=cuda_graphs, graph_max_len=graph_max_len,
            validate=validate, device=device,
            dtype=dtype, dry_run=dry_run, force=force, trust_remote_code=trust_remote_code,
            progress=progress,
        )
    if json_output:
        print_json(result.to_dict())
        return 0
    if result.validation is not None:
        for check in result.validation.checks:
            out.print(check_line(check.ok, check.detail))
    for r in result.skipped:
        out.print(note_line(f"skipped {r.name} ({r.class_name}): {r.reason}"))
    if result.skipped_files:
        out.print(note_line(f"not copied: {', '.join(result.skipped_files)}"))
    for note in result.notes:
        out.print(note_line(note))
    out.print(summary_table(result.layer_rows(), buffer_len=result.config.buffer_len,
                            state_dtype=result.block["state_dtype"], act_bytes=result.act_bytes,
                            act_assumed=result.act_dtype_assumed))
    n_files, size = len(result.files), human_bytes(result.total_bytes)
    if result.dry_run:
        out.print(files_table(f.to_dict() for f in result.files))
        out.print(check_line(True, f"dry run: every check passed; would write {n_files} files ({size}) to "
                                   f"{result.out_dir}; nothing was written"))
    else:
        validated = "" if result.validation is not None else " (not validated)"
        out.print(check_line(True, f"wrote {result.out_dir} ({n_files} files, {size}) in {result.elapsed_s:.1f}s"
                                   f"{validated}"))
    return 0
