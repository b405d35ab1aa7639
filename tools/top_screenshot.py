"""A picture of ``hostd top`` for README: one refresh of its screen, drawn by the same functions
(``hostd.cli.stats.layer_table`` and ``top_table`` over a one-second measurement of the live
host), saved as SVG by rich.

    python3 tools/top_screenshot.py docs/top.svg [--interval 1] [--top 8] [--width 110]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console, Group
from rich.text import Text

from hostd.cli.stats import layer_table, top_table
from hostd.host import Host
from hostd.policy import load_default
from hostd.stats import measure
from hostd.topology import read_topology


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--width", type=int, default=110)
    args = ap.parse_args()
    host, pol = Host(), load_default()
    result = measure(host, pol, args.interval, top=args.top)
    name = read_topology(host).hostname or "this host"
    head = Text(f"hostd top on {name}: every {args.interval:g} s, q quits", style="bold")
    with open(os.devnull, "w") as sink:
        console = Console(record=True, width=args.width, force_terminal=True, file=sink)
        console.print(Group(head, layer_table(pol.name, result), top_table(result)))
    args.out.write_text(console.export_svg(title="hostd top"))


if __name__ == "__main__":
    main()
