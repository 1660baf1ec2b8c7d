"""Per-family table of a stock and a patched run of transformers' model tests (JUnit XML in, Markdown out).

    python tests/transformers_suite/table.py RESULTS_DIR     # reads RESULTS_DIR/<family>-{stock,patched}.xml

Each row: passed / failed (errors included) / skipped, stock and patched, the tests whose outcome
differs, and how many patched tests ran the replay decode path and flushed. A patched failure whose
message says a recorded ``layers=`` selection matches no SSM layer is marked [layer names]: the
configuration block stores layer names relative to the class that was patched.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

LAYER_NAMES = "matches none of the SSM layers"


def outcomes(path: Path) -> dict[str, tuple[str, str, dict]]:
    """test id -> (outcome, first line of the failure message, properties)."""
    result = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name', '')}"
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                message = (node.get("message") or node.text or "").strip().splitlines()[:1]
                message = message[0] if message else ""
                break
        result[name] = (outcome, message, props)
    return result


def counts(results) -> str:
    c = {k: sum(1 for o, _, _ in results.values() if o == k) for k in ("passed", "failed", "skipped")}
    return f"{c['passed']} / {c['failed']} / {c['skipped']}"


def main(directory: str) -> str:
    root = Path(directory)
    families = sorted({p.name.rsplit("-", 1)[0] for p in root.glob("*-stock.xml")})
    lines = ["| family | stock pass / fail / skip | patched pass / fail / skip | replay ran / flushed (tests) "
             "| differ |", "| --- | --- | --- | --- | --- |"]
    details = []
    for family in families:
        stock_path, patched_path = root / f"{family}-stock.xml", root / f"{family}-patched.xml"
        if not patched_path.exists():
            continue
        stock, patched = outcomes(stock_path), outcomes(patched_path)
        ran = sum(1 for _, _, p in patched.values() if int(p.get("replay_steps", 0) or 0))
        flushed = sum(1 for _, _, p in patched.values() if int(p.get("replay_flushes", 0) or 0))
        differ = sorted(t for t in set(stock) | set(patched)
                        if stock.get(t, ("absent",))[0] != patched.get(t, ("absent",))[0])
        lines.append(f"| {family} | {counts(stock)} | {counts(patched)} | {ran} / {flushed} | {len(differ)} |")
        for test in differ:
            outcome, message, _ = patched.get(test, ("absent", "", {}))
            cause = " [layer names]" if LAYER_NAMES in message else ""
            details.append(f"- {family} `{test}`: stock {stock.get(test, ('absent',))[0]}, patched {outcome}"
                           f"{cause}{': ' + message[:160] if message and outcome == 'failed' else ''}")
    out = "\n".join(lines)
    if details:
        out += "\n\nTests whose outcome differs:\n\n" + "\n".join(details)
    return out + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: table.py RESULTS_DIR")
    print(main(sys.argv[1]), end="")
