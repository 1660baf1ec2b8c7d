"""``replayssm bench MODEL``: decode-step time of stock and patched ``generate()``, as a table, JSON and a plot."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import typer

from replayssm.config import MAX_BUFFER_LEN, ModelDtype, StateDtype, parse_buffer_len, parse_state_dtype
from replayssm.presets import PRESETS

from .cmd_inspect import MODEL_HELP
from .common import choices, err, option_parser, out, print_json, quiet_transformers

_PRESET_NAMES = ", ".join(PRESETS)


def bench_command(
    model: Optional[str] = typer.Argument(None, metavar="MODEL", show_default=False,
                                          help=MODEL_HELP + " Or --preset instead."),
    preset: Optional[str] = typer.Option(None, "--preset", metavar="NAME", show_default=False,
                                         help=f"A real-size model with random weights, no download: {_PRESET_NAMES}."),
    batch_sizes: Optional[str] = typer.Option(None, "--batch-sizes", "-b", metavar="LIST", show_default=False,
                                              help="Comma-separated batch sizes \\[default: 1,8,64,256; --smoke: 1,2]."),
    new_tokens: Optional[int] = typer.Option(None, "--new-tokens", "-n", min=2, metavar="N", show_default=False,
                                             help="N, new tokens per row of the long timed generate(); the step "
                                                  "time is (t(N) - t(n0)) / (N - n0) with n0 = N/5 "
                                                  "\\[default: 40; --smoke: 24]."),
    prompt_len: Optional[int] = typer.Option(None, "--prompt-len", min=1, metavar="N", show_default=False,
                                             help="Prompt tokens per row \\[default: 16; --smoke: 8]."),
    dtype: Optional[str] = typer.Option(None, "--dtype", metavar=choices(ModelDtype, skip=ModelDtype.AUTO),
                                        show_default=False,
                                        callback=option_parser(parse_state_dtype),
                                        help="Weights and activations \\[default: bf16; --smoke: fp32]."),
    state_dtype: str = typer.Option(StateDtype.FP32.value, "--state-dtype", metavar=choices(StateDtype),
                                    callback=option_parser(parse_state_dtype),
                                    help="dtype of the ReplaySSM state checkpoint."),
    buffer_len: Optional[int] = typer.Option(None, "--buffer-len", "-L", show_default=False,
                                             callback=option_parser(parse_buffer_len),
                                             help=f"L of the replay variants (1-{MAX_BUFFER_LEN}) "
                                                  "\\[default: 16; --smoke: 4]."),
    variants: str = typer.Option("stock,eager,graphs,graphs-per-step", "--variants", metavar="LIST",
                                 help="Comma-separated, of: stock (unpatched transformers), eager "
                                      "(replayssm.patch), graphs (patch with cuda_graphs=True), graphs-per-step "
                                      "(the same with buffer_len=1: per-step kernels)."),
    repeats: Optional[int] = typer.Option(None, "--repeats", min=1, show_default=False,
                                          help="Timed rounds after the warm-up; the median is reported "
                                               "\\[default: 3]."),
    device: Optional[str] = typer.Option(None, "--device", metavar="DEV", show_default=False,
                                         help="auto, cpu, cuda, cuda:N \\[default: auto; --smoke: cpu]."),
    json_path: Optional[str] = typer.Option(None, "--json", metavar="PATH|-", show_default=False,
                                            help="Also write the results as JSON to PATH (- : to stdout, with the "
                                                 "table on stderr)."),
    plot_path: Optional[Path] = typer.Option(None, "--plot", metavar="PATH", show_default=False,
                                             help="Write a PNG of tokens/s against batch size, one line per variant "
                                                  "(needs matplotlib: pip install 'replayssm\\[bench]')."),
    smoke: bool = typer.Option(False, "--smoke", help="A quick check of every code path: batch sizes 1,2, few "
                                                      "tokens, fp32, on the CPU (the options above still apply)."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code",
                                           help="Allow a checkpoint's own modelling code."),
) -> int:
    """Time model.generate() per decode step: stock transformers against ReplaySSM, eager and in CUDA graphs.

    For each batch size and variant: ms per decode step (greedy, every row generating every token), tokens/s, the speed-up against stock and against eager, prefill time, peak GPU memory and the CUDA-graph capture time. One model instance is switched between the variants with replayssm.patch / unpatch. The graph variants need CUDA (on the CPU they read n/a). A cell that fails (e.g. out of memory) is shown in the table and JSON, and the exit code is then 1.

    [bold]Examples[/bold]

      replayssm bench --preset nemotron3-nano-like --plot bench.png --json bench.json

      replayssm bench ./Qwen3.5-4B --batch-sizes 1,64 --variants stock,graphs

      replayssm bench tiny:qwen3_5 --smoke
    """
    from replayssm.bench_settings import SMOKE, BenchError, BenchSettings, parse_batch_sizes, parse_variants
    from replayssm.bench_output import PLOT_HINT, check_output_path, matplotlib_available
    from replayssm.presets import preset as get_preset

    # every check that needs no torch, before importing it
    if model is not None and preset is not None:
        raise BenchError(f"give either MODEL or --preset, not both (got {model!r} and --preset {preset})")
    if model is None and preset is None:
        raise BenchError("give MODEL (a directory, a cached hub id or tiny:<family>) or --preset NAME",
                         hint=f"presets: {_PRESET_NAMES}; e.g. replayssm bench tiny:qwen3_5 --smoke")
    if preset is not None:
        get_preset(preset)
    defaults: dict[str, Any] = dict(SMOKE) if smoke else {}
    given = dict(batch_sizes=parse_batch_sizes(batch_sizes) if batch_sizes is not None else None,
                 new_tokens=new_tokens, prompt_len=prompt_len, dtype=dtype,
                 buffer_len=buffer_len, repeats=repeats, device=device)
    defaults.update({k: v for k, v in given.items() if v is not None})
    settings = BenchSettings(state_dtype=state_dtype, variants=parse_variants(variants), **defaults)
    json_file = None if json_path in (None, "-") else check_output_path(json_path, "--json")
    plot_file = check_output_path(plot_path, "--plot", suffix=".png") if plot_path is not None else None
    if plot_file is not None and not matplotlib_available():
        err.print(f"! --plot: matplotlib is not installed; {PLOT_HINT} to get the plot (the table is printed "
                  "without it)", markup=False)
        plot_file = None

    from replayssm.bench import load_model, run_bench
    from replayssm.bench_output import plot, write_atomically

    quiet_transformers()
    to_stdout = json_path == "-"
    err.print(f"loading {model or 'preset ' + preset} ({settings.dtype}) ...", markup=False)
    net, info = load_model(model=model, preset=preset, settings=settings, trust_remote_code=trust_remote_code)
    err.print(f"timing {', '.join(settings.variants)} at batch sizes "
              f"{', '.join(map(str, settings.batch_sizes))} on {info['device']}")

    def progress(row) -> None:
        err.print(f"  {row.variant:<16} batch {row.batch_size:>4}: " + _cell_summary(row), markup=False)

    debug = os.environ.get("REPLAYSSM_DEBUG", "").strip().lower() not in ("", "0", "false", "no")
    result = run_bench(net, settings, model_info=info, on_row=progress, raise_errors=debug)
    data = result.to_dict()
    data["command"] = settings.command_line(model, preset)
    print_table(err if to_stdout else out, bench_table(data))
    if to_stdout:
        print_json(data)
    elif json_file is not None:
        write_atomically(json_file, json.dumps(data, indent=2, default=str) + "\n")
        out.print(f"wrote {json_file}", markup=False)
    if plot_file is not None:
        plot(result, plot_file)
        (err if to_stdout else out).print(f"wrote {plot_file}", markup=False)
    if result.failed:
        err.print(f"! {len(result.failed)} of {len(result.rows)} cells failed (see the note column)")
        return 1
    return 0


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.1f}"


def _ratio(row: dict[str, Any], ref: str) -> str:
    value = row[f"speedup_vs_{ref}"]
    if row["variant"] == ref:
        return ""
    return f"{value:.2f}x" if value else "-"


def _cell_summary(row) -> str:
    if row.status in ("ok", "fallback") and row.ms_per_step is not None:
        text = f"{_ms(row.ms_per_step)} ms/step, {row.tokens_per_s:,.0f} tokens/s"
        return text + (f" ({row.note})" if row.note else "")
    return f"{row.status}: {row.note}" if row.status != "n/a" else f"n/a: {row.note}"


def print_table(console, table) -> None:
    """At a terminal, fit its width (long cells fold); into a file or pipe, at the table's full width."""
    if console.is_terminal:
        console.print(table)
        return
    from rich.measure import Measurement

    width = Measurement.get(console, console.options.update(width=10_000), table).maximum
    saved = console.width
    console.width = max(saved, width)
    try:
        console.print(table)
    finally:
        console.width = saved


def bench_table(data: dict[str, Any]):
    """The rich table of a ``BenchResult.to_dict()``: one row per batch size x variant."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from replayssm.formatting import human_bytes

    s, meta = data["settings"], data
    source = data["model"].get("source") or {}
    name = source.get("name") or source.get("spec") or data["model"].get("architecture", "model")
    where = meta.get("gpu") or meta.get("device", "cpu")
    v = meta.get("versions", {})
    title = (f"{name} · {data['model'].get('architecture', '')} · {where} · {s['dtype']} weights, "
             f"{s['state_dtype']} state, L={s['buffer_len']} · prompt {s['prompt_len']}, "
             f"step = (t({s['new_tokens']}) - t({s['first_tokens']})) / {s['new_tokens'] - s['first_tokens']}, "
             f"median of {s['repeats']}")
    caption = (f"{meta.get('date', '')} · torch {v.get('torch')} · triton {v.get('triton')} · "
               f"transformers {v.get('transformers')} · replayssm {v.get('replayssm')}")
    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left", header_style="bold",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for col, justify in (("batch", "right"), ("variant", "left"), ("ms/step", "right"), ("tokens/s", "right"),
                         ("vs stock", "right"), ("vs eager", "right"), ("prefill ms", "right"),
                         ("peak mem", "right"), ("capture s", "right"), ("note", "left")):
        table.add_column(col, justify=justify, no_wrap=col != "note", overflow="fold")
    rows = sorted(data["rows"], key=lambda r: (r["batch_size"], s["variants"].index(r["variant"])))
    last_batch = None
    for r in rows:
        timed = r["ms_per_step"] is not None
        note = r["note"] or ("" if r["status"] == "ok" else r["status"])
        if r["status"] == "n/a":
            note = f"n/a: {r['note']}"
        table.add_row(
            str(r["batch_size"]) if r["batch_size"] != last_batch else "", r["variant"],
            _ms(r["ms_per_step"]), f"{r['tokens_per_s']:,.0f}" if timed and r["tokens_per_s"] else "-",
            _ratio(r, "stock"), _ratio(r, "eager"),
            _ms(r["prefill_ms"]),
            human_bytes(r["peak_memory_bytes"]) if r["peak_memory_bytes"] is not None else "-",
            f"{r['capture_s']:.2f}" if r["capture_s"] is not None else "-",
            Text(note),  # plain text: an error message may hold [brackets]
        )
        last_batch = r["batch_size"]
    return table
