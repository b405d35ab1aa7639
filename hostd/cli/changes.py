"""``hostd changes``: every knob hostd holds changed now (the ``tuned-adm verify`` of hostd):
its original, its value now, and whether someone else changed it since hostd wrote it, from the
agent's journal (``hostd.held``). Exit status: 0 nothing held changed or everything as hostd
wrote it; 4 someone else changed some since (``hostd restore`` leaves those)."""

from __future__ import annotations

from collections import Counter

import typer
from rich.table import Table

from hostd.cli.agent import StateOpt
from hostd.cli.common import JsonOpt, get_host, out, print_json, show
from hostd.held import STATES, held, open_journal, shown

EXIT_CHANGED = 4


def changes(
    state_dir: str = StateOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Every knob hostd holds changed: its original, its value now, and whether someone else
    changed it since hostd wrote it. Exit status 4 when someone did."""
    host = get_host("/")
    journal, why = open_journal(host, state_dir)
    found = held(host, journal) if journal is not None else []
    counts = Counter(h.state for h in found)
    if as_json:
        print_json({"state_dir": state_dir, "journal": journal is not None, "why": why,
                    "counts": dict(counts), "knobs": [h.as_json() for h in found]})  # fmt: skip
    elif journal is None:
        out.print(f"hostd holds nothing changed: {why}")
    elif not found:
        out.print(f"hostd holds nothing changed (the journal in {state_dir} is empty)")
    else:
        table = Table(title_justify="left")
        said = ", ".join(f"{n} {STATES[s]}" for s, n in counts.most_common())
        table.title = f"hostd holds {len(found)} knobs changed: {said}"
        for name in ("what", "key", "before hostd", "now", "state"):
            table.add_column(name)
        for h in found:
            table.add_row(h.what, h.key, shown(h.kind, h.original), shown(h.kind, h.current),
                          h.state)  # fmt: skip
        show(table)
    if counts["changed"]:
        raise typer.Exit(EXIT_CHANGED)
