"""Rich renderings of results: layer tables, check lines, the convert summary, env table."""

from __future__ import annotations

from typing import Any, Iterable

from rich import box
from rich.table import Table
from rich.text import Text

from replayssm.formatting import count, human_bytes

OK = "[green]✓[/green]"
FAIL = "[red]✗[/red]"


def check_line(ok: bool, text: str) -> Text:
    line = Text()
    line.append("✓ " if ok else "✗ ", style="green" if ok else "bold red")
    line.append(text)
    return line


def note_line(text: str) -> Text:
    line = Text()
    line.append("! ", style="yellow")
    line.append(text)
    return line


def kind_short(row: dict[str, Any]) -> str:
    return row.get("kind_short") or row.get("kind_label") or row.get("kind", "?")


def _shapes(shapes: dict[str, int]) -> str:
    short = {"num_heads": "H", "head_dim": "P", "state_size": "N", "n_groups": "G", "num_k_heads": "Hk",
             "num_v_heads": "Hv", "head_k_dim": "Dk", "head_v_dim": "Dv", "intermediate_size": "D"}
    return " ".join(f"{short.get(k, k)}{v}" for k, v in shapes.items())


def inspect_table(layers: list[dict[str, Any]], *, title: str, buffer_len: int) -> Table:
    """One row per SSM layer: name, kind, (class), shapes, state bytes/seq, buffer bytes, rewritable.

    The class column appears only when the layers have different classes (else it is in the
    title); reasons for layers that cannot be rewritten are printed by ``reason_lines``.
    """
    classes = sorted({row["class_name"] for row in layers})
    if len(classes) == 1:
        title = f"{title} · {classes[0]}"
    title = f"{title} · buffers at L={buffer_len}"
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
    # narrow terminals (and pipes, which rich renders 80 columns wide) fold the long cells
    # instead of cutting the short ones to "…"
    table.add_column("layer", overflow="fold")
    table.add_column("kind", no_wrap=True, min_width=4)
    if len(classes) > 1:
        table.add_column("class", overflow="fold")
    table.add_column("shapes", overflow="fold")
    table.add_column("state/seq", justify="right", no_wrap=True, min_width=9)
    table.add_column("buffer/seq", justify="right", no_wrap=True, min_width=10)
    table.add_column("rewrite", no_wrap=True, min_width=7)
    for row in layers:
        rewritable = Text("✓", style="green") if row["can_rewrite"] else Text("✗", style="red")
        cells = [row["name"], kind_short(row)] + ([row["class_name"]] if len(classes) > 1 else [])
        cells += [_shapes(row["shapes"]), human_bytes(row["state_bytes"]),
                  human_bytes(row["buffer_bytes"]) if row["can_rewrite"] else "-", rewritable]
        table.add_row(*cells)
    return table


def reason_lines(layers: list[dict[str, Any]]) -> list[Text]:
    """"✗ 2 layers (model.layers.0.mamba, ...): <reason>" for each distinct reason."""
    groups: dict[str, list[str]] = {}
    for row in layers:
        if not row["can_rewrite"]:
            groups.setdefault(row["reason"] or "unknown reason", []).append(row["name"])
    lines = []
    for reason, names in groups.items():
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        lines.append(check_line(False, f"{count(len(names), 'layer')} not rewritable ({shown}): {reason}"))
    return lines


def summary_table(rows: list[dict[str, Any]], *, buffer_len: int, state_dtype: str, act_bytes: int,
                  act_assumed: bool = False) -> Table:
    """The convert summary: rewritten layers with their per-sequence memory."""
    act = {4: "fp32", 2: "16-bit"}.get(act_bytes, f"{act_bytes}-byte")
    if act_assumed:
        act += " (assumed: config.json records no dtype)"
    table = Table(title=f"Rewritten layers (buffer_len {buffer_len}, state {state_dtype}, {act} activations)",
                  title_justify="left", header_style="bold", show_footer=len(rows) > 1, box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    state_total = sum(r["state_bytes"] for r in rows)
    buffer_total = sum(r["buffer_bytes"] for r in rows)
    table.add_column("layer", footer=f"{len(rows)} layers", no_wrap=True)
    table.add_column("kind")
    table.add_column("state bytes/seq", justify="right", footer=human_bytes(state_total))
    table.add_column("buffer bytes/seq", justify="right", footer=human_bytes(buffer_total))
    for r in rows:
        table.add_row(r["name"], kind_short(r), human_bytes(r["state_bytes"]), human_bytes(r["buffer_bytes"]))
    return table


def files_table(files: Iterable[dict[str, Any]]) -> Table:
    table = Table(title="Files", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    table.add_column("file", no_wrap=True)
    table.add_column("role")
    table.add_column("size", justify="right")
    for f in files:
        table.add_row(f["name"], f["role"], human_bytes(f["bytes"]))
    return table


def env_table(info: dict[str, Any]) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for key in ("replayssm", "python", "platform", "torch", "cuda", "triton", "transformers", "safetensors",
                "huggingface_hub", "accelerate", "typer", "rich"):
        value = info.get(key)
        table.add_row(key, str(value) if value is not None else "[dim]not installed[/dim]")
    gpus = info.get("gpus") or []
    if gpus:
        for g in gpus:
            table.add_row(f"gpu {g['index']}", f"{g['name']} ({human_bytes(g['memory_bytes'])}, sm_{g['capability']})")
    else:
        table.add_row("gpus", "[dim]none[/dim]")
    tk = info["triton_kernels"]
    table.add_row("triton kernels", (OK + " can run: " if tk["can_run"] else FAIL + " cannot run: ") + tk["detail"])
    table.add_row("backend auto", info["backend_auto"])
    return table
