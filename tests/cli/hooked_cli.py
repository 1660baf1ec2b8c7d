"""The replayssm CLI with a failure injected once the first weight file is copied (tests only).

    python hooked_cli.py fail|pause convert MODEL OUT_DIR ...

"fail" raises RuntimeError (an internal error); "pause" sleeps in short steps (as copying
work would, so a pending Ctrl-C is seen within 0.1 s) until the process is signalled.
"""

from __future__ import annotations

import sys
import time

import replayssm.conversion as conversion
from replayssm.cli.main import run

MODE = sys.argv[1]
_real_copy = conversion.copy_file


def _copy_then_inject(src, dst, *, expected_size=None, **kwargs):
    copied = _real_copy(src, dst, expected_size=expected_size, **kwargs)
    if expected_size is not None:  # a weight file
        if MODE == "fail":
            raise RuntimeError("injected failure after the first weight file")
        while True:
            time.sleep(0.1)
    return copied


conversion.copy_file = _copy_then_inject
run(sys.argv[2:])
