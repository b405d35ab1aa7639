"""The last line of a CI run: which test tiers ran and which were skipped, and why.

Reads pytest's output (``-ra``: a "SKIPPED [n] path:line: reason" line per skip) and prints one
line, e.g. ``tiers: unit ran, cli ran, host ran, privileged ran, vm SKIPPED (no qemu), packaging
ran``. A tier is SKIPPED when none of its tests ran; "partly" when some of them skipped.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

TIERS = ("unit", "cli", "host", "privileged", "vm", "packaging")
SKIP = re.compile(r"^SKIPPED \[(\d+)\] tests/(\w+)/[^:]*:\d+: (.*)$")
RAN = re.compile(r"^tests/(\w+)/\S+ ([.sFExX]+)")


def main(path: str) -> int:
    text = Path(path).read_text(errors="replace")
    ran: dict[str, int] = {}
    for m in map(RAN.match, text.splitlines()):
        if m:
            ran[m.group(1)] = ran.get(m.group(1), 0) + sum(c != "s" for c in m.group(2))
    skipped: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = SKIP.match(line)
        if m:
            skipped.setdefault(m.group(2), []).append(m.group(3))
    parts = []
    for tier in TIERS:
        why = "; ".join(sorted(set(skipped.get(tier, []))))[:300]
        if ran.get(tier):
            parts.append(f"{tier} ran" + (f" (partly skipped: {why})" if why else ""))
        else:
            parts.append(f"{tier} SKIPPED ({why or 'no tests collected'})")
    print("tiers: " + ", ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
