"""Finding the rows that flush this step on the device: shared pieces of the delta-rule persistent
flush launch and of the Mamba-2 flush-first program order (``flush_first_row``).

A persistent flush launch runs a few programs per multiprocessor that share the work items
of the rows flushing this step (``cursor == L - 1``). The rows are found on the device:
every program loads the cursors of a chunk of rows, takes an inclusive prefix count of
the flushing ones, and maps item rank ``r`` to the row whose count first exceeds ``r``.
No host decision depends on the cursors, so the launch can be captured in a CUDA graph.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: rows per launch (each program holds one cursor per row of its chunk in registers)
FLUSH_ROWS = 4096


@triton.jit
def flush_row_prefix(cur_ptr, s_cur, row0, n_rows, flush_at, BB: tl.constexpr):
    """(inclusive prefix count (BB,) int32 of the chunk's rows whose cursor is ``flush_at``
    (``L - 1``; 0 on already advanced cursors), their number)."""
    offs = tl.arange(0, BB)
    cv = tl.load(cur_ptr + (row0 + offs) * s_cur, mask=offs < n_rows, other=-1)
    fl = (cv == flush_at).to(tl.int32)
    return tl.cumsum(fl, axis=0), tl.sum(fl, axis=0)


@triton.jit
def nth_flush_row(csum, rank, row0):
    """Index (int64) of the chunk's flushing row number ``rank`` (0-based)."""
    return (row0 + tl.sum((csum <= rank).to(tl.int32), axis=0)).to(tl.int64)


def flush_row_chunks(n_rows_total: int):
    """(row0, n_rows, BB) for each launch over ``n_rows_total`` rows (BB: a power of two >= n_rows)."""
    for row0 in range(0, n_rows_total, FLUSH_ROWS):
        n = min(FLUSH_ROWS, n_rows_total - row0)
        yield row0, n, max(16, triton.next_power_of_2(n))


@triton.jit
def flush_first_row(pid, per_row, cur_ptr, s_cur, n_rows, flush_at, BB: tl.constexpr):
    """The row of program ``pid`` in a launch of ``per_row`` programs per row (the program's index
    within its row is ``pid % per_row``) such that the programs of the rows whose cursor is
    ``flush_at`` come first (in row order), then the other rows' (in row order); row order itself
    when no row or every row flushes. Every program loads the ``n_rows`` cursors (``BB`` a power of
    two ``>= n_rows``; padding reads -1). Returns (row (int64), the cursors (BB,), offsets (BB,))."""
    offs = tl.arange(0, BB)
    cur = tl.load(cur_ptr + offs * s_cur, mask=offs < n_rows, other=-1)
    fl = (cur == flush_at).to(tl.int32)
    n_flush = tl.sum(fl, axis=0)
    row = pid // per_row
    if (n_flush > 0) & (n_flush < n_rows):
        csum = tl.cumsum(fl, axis=0)
        first = n_flush * per_row  # programs of the flush rows
        in_flush = pid < first
        rank = tl.where(in_flush, pid, pid - first) // per_row
        # flush row number `rank` (prefix count csum), or other row number `rank` (prefix count
        # offs + 1 - csum; padding rows count past every rank)
        row = tl.sum((tl.where(in_flush, csum, offs + 1 - csum) <= rank).to(tl.int32), axis=0)
    return row.to(tl.int64), cur, offs
