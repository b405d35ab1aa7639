"""``hostd plan``: what the policy would do on this host (nothing is changed).

``--json`` prints ``Plan.to_json()`` exactly, so plans can be diffed and kept as golden files.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter

import typer
from rich.table import Table

from hostd.agent.lock import agent_pid
from hostd.agent.status import read_status
from hostd.cli.common import (
    JsonOpt,
    LayerOpt,
    PidOpt,
    PolicyOpt,
    RootOpt,
    Selection,
    TidOpt,
    err,
    out,
    print_json,
    show,
    snapshot,
    styled,
)
from hostd.host import Host
from hostd.journal import JOURNAL_NAME, Journal, JournalError, base_affinities, read_boot_id
from hostd.model.cpus import format_cpulist
from hostd.plan import PLAN_FORMAT
from hostd.statedir import DEFAULT_RUN_DIR, DEFAULT_STATE_DIR


def plan(
    policy: str = PolicyOpt,
    root: str = RootOpt,
    tasks: bool = typer.Option(False, "--tasks", "-t", help="List every thread decision."),
    pid: list[int] = PidOpt,
    tid: list[int] = TidOpt,
    layer: list[str] = LayerOpt,
    scope_pid: list[int] = typer.Option(
        [], "--scope-pid", help="Plan only for this process and its descendants (as run does)."
    ),
    state_dir: str = typer.Option(
        DEFAULT_STATE_DIR,
        "--state-dir",
        envvar="HOSTD_STATE_DIR",
        help="The agent's journal: threads it already placed are planned from their original "
        "affinity, as the agent plans them (live host only).",
    ),
    run_dir: str = typer.Option(
        DEFAULT_RUN_DIR,
        "--run-dir",
        envvar="HOSTD_RUN_DIR",
        help="A running agent's status: the sessions it demoted are planned as it plans them.",
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Plan CPUs per layer, thread placement and sched, IRQs, governors and NUMA (dry run).

    The plan is the host's (or --scope-pid's, as run makes it); --pid, --tid and --layer choose
    which of its thread decisions are counted and listed."""
    snap = snapshot(policy, root, scope_pid)
    chosen = Selection(snap.host, snap.policy, pid, tid, layer)
    if snap.host.live:
        snap.base_affinity = journal_base(snap.host, state_dir)
        snap.demoted_sessions, snap.runaways = watch_state(run_dir)
    p = snap.plan()
    if pid or tid or layer:
        p = dataclasses.replace(p, tasks=tuple(t for t in p.tasks if chosen(t.pid, t.tid, t.layer)))
    if as_json:
        print_json(p.to_json(), schema=PLAN_FORMAT)
        return
    out.print(
        styled(
            "policy ",
            (p.policy, "bold"),
            f" (mode {p.mode}) on "
            f"{snap.topology.hostname or 'host'}: {len(p.online)} CPUs, shared pool "
            f"{format_cpulist(p.pool) or '-'}",
        )
    )
    table = Table(title_justify="left")
    for col in ("layer", "kind", "threads", "own CPUs", "mems", "sched", "notes"):
        table.add_column(col)
    for lp in p.layers:
        ly = snap.policy.layer(lp.name)
        s = ly.sched
        sched = s.policy or "-"
        if s.priority is not None:
            sched += f" {s.priority}"
        if s.nice is not None:
            sched += f" nice {s.nice}"
        if s.group_nice is not None:
            group = f"session nice {s.group_nice}"
            sched = group if sched == "-" else f"{sched}, {group}"
        role = ""
        if ly.preempt and snap.policy.preemptible:
            role = "preempts"
        elif ly.name in snap.policy.preemptible:
            role = "preemptible"
        if role:
            sched = role if sched == "-" else f"{sched}; {role}"
        own = format_cpulist(lp.cpus) if lp.kind != "open" else "(pool)"
        table.add_row(
            lp.name, lp.kind, str(lp.threads), own or "-", format_cpulist(lp.mems), sched,
            "; ".join(lp.notes),
        )  # fmt: skip
    show(table)
    moved = sum(1 for t in p.tasks if t.affinity is not None)
    by_layer = Counter(t.layer for t in p.tasks)
    out.print(
        f"threads: {len(p.tasks)} with a decision ({moved} affinity changes; "
        + ", ".join(f"{k} {v}" for k, v in sorted(by_layer.items()))
        + ")"
    )
    if tasks and p.tasks:
        tt = Table(title_justify="left")
        for col in ("tid", "pid", "comm", "layer", "affinity", "sched", "node"):
            tt.add_column(col)
        for t in p.tasks:
            sched = (t.policy or "-") + (f" {t.priority}" if t.priority else "")
            if t.nice is not None:
                sched += f" nice {t.nice}"
            if t.group_nice is not None:
                group = f"session nice {t.group_nice}"
                sched = group if sched == "-" else f"{sched}, {group}"
            tt.add_row(
                str(t.tid), str(t.pid), t.comm, t.layer,
                "-" if t.affinity is None else format_cpulist(t.affinity), sched,
                "-" if t.node is None else str(t.node),
            )  # fmt: skip
        show(tt)
    changed = [
        i
        for i in p.irqs
        if i.affinity != next((x.affinity for x in snap.topology.irqs if x.irq == i.irq), None)
    ]
    out.print(f"IRQs: {len(p.irqs)} placed, {len(changed)} would move")
    for i in changed[:20]:
        out.print(f"  IRQ {i.irq} {i.name} -> CPUs {format_cpulist(i.affinity)} ({i.reason})")
    if p.cpufreq:
        govs = Counter((c.governor, c.min_freq, c.epp) for c in p.cpufreq)
        for (gov, floor, epp), n in sorted(govs.items(), key=str):
            out.print(
                f"cpufreq: {n} CPUs -> governor {gov or '-'}, min {floor or '-'} kHz, "
                f"EPP {epp or '-'}"
            )
    for n in p.numa:
        out.print(f"NUMA: process {n.pid} {n.comm!r} ({n.layer}) -> node {n.node}")
    for note in p.notes:
        out.print(f"note: {note}")


def journal_base(host: Host, state_dir: str) -> dict:
    """The original affinities the agent's journal holds ({} without a journal); a journal that
    cannot be read is said once, on stderr."""
    if not os.path.exists(os.path.join(state_dir, JOURNAL_NAME)):
        return {}
    try:
        return base_affinities(Journal(state_dir, read_boot_id(host)))
    except (JournalError, OSError) as exc:
        err.print(f"hostd: note: {exc}; threads hostd placed are planned from their affinity now")
        return {}


def watch_state(run_dir: str) -> tuple[frozenset[int], frozenset[tuple[int, int]]]:
    """The sessions a running agent demoted and the threads it found running away, by (tid,
    start time), from its status file (none when no agent runs)."""
    status = read_status(run_dir) if agent_pid(run_dir) is not None else None
    preempt = status.get("preempt") if isinstance(status, dict) else None
    if not isinstance(preempt, dict):
        return frozenset(), frozenset()

    def ints(entry: object, *names: str) -> tuple[int, ...] | None:  # a malformed entry: None
        got = tuple(entry.get(n) for n in names) if isinstance(entry, dict) else ()
        return got if got and all(type(v) is int for v in got) else None

    demoted = [ints(d, "session") for d in preempt.get("demoted") or []]
    runaways = [ints(r, "tid", "start") for r in preempt.get("runaways") or []]
    return (
        frozenset(d[0] for d in demoted if d is not None),
        frozenset((r[0], r[1]) for r in runaways if r is not None),
    )
