"""The cursor-word arrival helpers of ``kernels/cursor.py`` in a small Triton kernel.

Without CUDA, tests/conftest.py sets TRITON_INTERPRET=1 (programs then run one after the other,
so the counts are exact but races are not exercised; the GPU suites run the same helpers inside
the decode kernels with up to 1920 programs per row).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from replayssm.kernels.cursor import (  # noqa: E402
    ARRIVAL_UNIT,
    MAX_ARRIVAL_L,
    advance_cursor_triton,
    advanced_cursor,
    arrive_on_cursor,
    count_arrival,
    cursor_of_word,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _arrive_kernel(cur_ptr, seen_ptr, n_per_row, L, FIRST: tl.constexpr):
    """Program p arrives at row p // n_per_row's cursor word, records (c, arrivals before it),
    and the row's last program stores the advanced cursor."""
    pid = tl.program_id(0)
    b = pid // n_per_row
    if FIRST:
        c, n = arrive_on_cursor(cur_ptr + b, "relaxed")
    else:
        c = cursor_of_word(tl.load(cur_ptr + b))
        tl.debug_barrier()
        n = count_arrival(cur_ptr + b, c, "relaxed")
    tl.store(seen_ptr + 2 * pid, c)
    tl.store(seen_ptr + 2 * pid + 1, n)
    if n == n_per_row - 1:
        tl.store(cur_ptr + b, advanced_cursor(c, L))


@pytest.mark.parametrize("first", [True, False], ids=["read-by-atomic", "read-by-load"])
@pytest.mark.parametrize("L", [4, MAX_ARRIVAL_L])
def test_arrivals_on_the_cursor_word(first, L):
    """Every program reads its row's cursor (idle -1, 0, L - 2, the flush slot L - 1), the
    arrival counts of a row are 0 .. n - 1, and after the launch every word is the plain
    advanced cursor again (idle rows keep -1)."""
    cursors = [-1, 0, L - 2, L - 1]
    n_per_row = 37
    cur = torch.tensor(cursors, dtype=torch.int32, device=DEV)
    seen = torch.full((len(cursors) * n_per_row, 2), -999, dtype=torch.int32, device=DEV)
    _arrive_kernel[(len(cursors) * n_per_row,)](cur, seen, n_per_row, L, FIRST=first)
    seen = seen.view(len(cursors), n_per_row, 2).cpu()
    for b, c in enumerate(cursors):
        assert seen[b, :, 0].tolist() == [c] * n_per_row
        assert sorted(seen[b, :, 1].tolist()) == list(range(n_per_row))
    assert cur.tolist() == [-1, 1, L - 1, 0]
    assert ARRIVAL_UNIT == 256 and MAX_ARRIVAL_L < ARRIVAL_UNIT // 2


def test_stand_alone_advance_launch():
    """``advance_cursor_triton`` moves active rows on modulo L (more rows than one block) and keeps idle ones."""
    c0 = torch.tensor([(-1 if b % 7 == 3 else b % 5) for b in range(300)], dtype=torch.int32)
    cur = c0.clone().to(DEV)
    advance_cursor_triton(cur, 5)
    assert torch.equal(cur.cpu(), torch.where(c0 >= 0, (c0 + 1) % 5, c0))
