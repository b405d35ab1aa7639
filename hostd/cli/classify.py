"""``hostd classify`` (threads per layer) and ``hostd explain TID`` (why a thread is where it is).

Both run one observe + classify pass through ``hostd.cli.common.snapshot`` and render it.
"""

from __future__ import annotations

import os
from collections import Counter

import typer
from rich.table import Table

import hostd.preempt
from hostd.agent import DEFAULT_RUN_DIR, DEFAULT_STATE_DIR, agent_pid, read_status
from hostd.classify import Classified
from hostd.cli.common import (
    JsonOpt,
    LayerOpt,
    PidOpt,
    PolicyOpt,
    RootOpt,
    Selection,
    TidOpt,
    fail,
    out,
    print_json,
    show,
    snapshot,
    styled,
)
from hostd.held import STATES, held, open_journal, shown
from hostd.model.node import KINDS as NODE_KINDS


def _row(item: Classified) -> dict:
    t = item.task
    return {
        "tid": t.tid,
        "pid": t.pid,
        "start_time": t.start_time,
        "comm": t.comm,
        "pcomm": t.process.comm,
        "parent_comm": t.process.parent_comm,
        "layer": item.layer,
        "group": item.group,
        "uid": t.uid,
        "cgroup": t.process.cgroup,
        "gpu": list(t.process.gpu_devices),
        "policy": t.policy_name,
        "nice": t.nice,
        "job": t.process.job.id if t.process.job else None,
        "role": t.process.job.role if t.process.job else None,
        "activity": t.activity or None,
    }


def classify(
    policy: str = PolicyOpt,
    root: str = RootOpt,
    pid: list[int] = PidOpt,
    tid: list[int] = TidOpt,
    layer: list[str] = LayerOpt,
    members: bool = typer.Option(False, "--members", "-m", help="List each thread."),
    wide: bool = typer.Option(
        False, "--wide", "-w", help="Whole comments and cgroups (else one line each, cut)."
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Sort every thread into the policy's layers: counts per layer, or each member. On a
    terminal a row is one line (an 80-column one too), its long cells cut; --wide: whole."""
    whole = wide or not out.is_terminal  # piped: every cell whole, for grep
    snap = snapshot(policy, root)
    known = [ly.name for ly in snap.policy.layers]
    chosen = Selection(snap.host, snap.policy, pid, tid, layer)
    items = [c for c in snap.classified if chosen(c.task.pid, c.task.tid, c.layer)]
    if as_json:
        counts = Counter(c.layer for c in items)
        print_json(
            {
                "policy": snap.policy.name,
                "layers": [{"name": n, "threads": counts.get(n, 0)} for n in known],
                "threads": [_row(c) for c in items],
            }
        )
        return
    counts = Counter(c.layer for c in items)
    procs: dict[str, set[int]] = {}
    for c in items:
        procs.setdefault(c.layer, set()).add(c.task.pid)
    table = Table(title=f"policy {snap.policy.name}: {len(items)} threads", title_justify="left")
    named = max(len(ly.name) for ly in snap.policy.layers)
    table.add_column("layer", no_wrap=True, min_width=named)
    table.add_column("threads", no_wrap=True, min_width=7, justify="right")
    table.add_column("processes", no_wrap=True, min_width=9, justify="right")
    table.add_column("kind", no_wrap=True, min_width=8)
    table.add_column("comment", no_wrap=not whole)
    room = out.width - (named + 7 + 9 + 8) - 3 * 5 - 1  # what the borders and the rest leave
    for ly in snap.policy.layers:
        if layer and ly.name not in layer:
            continue
        table.add_row(
            ly.name,
            str(counts.get(ly.name, 0)),
            str(len(procs.get(ly.name, ()))),
            ly.kind,
            ly.comment if whole else _cut(ly.comment, room),
        )
    show(table)
    if members:
        # 80 columns: tid, pid, comm (15 at most), layer, group and the cgroup, cut; --wide (or
        # piped): the process's leader and parent too, and every cell whole
        mt = Table(title_justify="left")
        for col, width in (("tid", 7), ("pid", 7), ("comm", 15)):
            mt.add_column(col, no_wrap=True, min_width=width)
        if whole:
            mt.add_column("leader")
            mt.add_column("parent")
        mt.add_column("layer", no_wrap=True, min_width=named)
        mt.add_column("group", no_wrap=True, min_width=5, justify="right")
        mt.add_column("cgroup", no_wrap=not whole)
        room = out.width - (7 + 7 + 15 + named + 5) - 3 * 6 - 1
        for c in items:
            t = c.task
            if whole:
                row = [str(t.tid), str(t.pid), t.comm, t.process.comm, t.process.parent_comm]
                mt.add_row(*row, c.layer, str(c.group), t.process.cgroup)
            else:
                mt.add_row(str(t.tid), str(t.pid), _cut(t.comm, 15), c.layer, str(c.group),
                           _cut(t.process.cgroup, room, left=True))  # fmt: skip
        show(mt)


def explain(
    tid: int = typer.Argument(..., help="Thread id (a pid is its main thread's tid)."),
    policy: str = PolicyOpt,
    root: str = RootOpt,
    as_json: bool = JsonOpt,
    run_dir: str = typer.Option(
        DEFAULT_RUN_DIR, "--run-dir", help="The running agent's folder (what it demoted, boosted)."
    ),
    state_dir: str = typer.Option(
        DEFAULT_STATE_DIR,
        "--state-dir",
        envvar="HOSTD_STATE_DIR",
        help="The agent's journal: what hostd holds changed on the thread, and its originals.",
    ),
    why_not: bool = typer.Option(
        False, "--why-not", help="Also each AND-group of the layers before it, and what failed."
    ),
) -> None:
    """Say what hostd holds changed on a thread now, which layer and AND-group matched it, and
    (--why-not) why the layers before it did not."""
    snap = snapshot(policy, root)
    task = next((t for t in snap.tasks if t.tid == tid), None)
    if task is None:
        fail(f"thread {tid}: no such thread on this host (it may have exited)")
    ex = snap.classifier.explain(task)
    preempt_lines = _preempt(snap, task, ex.layer, run_dir)
    held, unheld = _held(snap.host, task, state_dir)
    if as_json:
        print_json(
            {
                "thread": _row(Classified(task, ex.layer, ex.group)),
                "layer": ex.layer,
                "group": ex.group,
                "layers": [
                    {
                        "layer": r.layer,
                        "matched": r.matched,
                        "groups": [
                            {
                                "group": g.index,
                                "matched": g.matched,
                                "failed": g.failed.describe() if g.failed else None,
                                "actual": g.actual,
                            }
                            for g in r.groups
                        ],
                    }
                    for r in ex.layers
                ],
                "preempt": preempt_lines,
                "held": held,
                "job": task.job_line(),
                "node": {"kind": task.process.node.kind, "line": task.process.node.line()},
            }
        )
        return
    p = task.process
    out.print(
        f"thread {task.tid} {task.comm!r} of process {p.pid} {p.comm!r} (parent {p.parent_comm!r},"
        f" uid {task.uid}, cgroup {p.cgroup}, GPU devices: {', '.join(p.gpu_devices) or 'none'})"
    )
    job = task.job_line()
    out.print(f"job: {job}" if job else "job: none (no launcher, Slurm step or job environment)")
    out.print(f"on the node: {p.node.line()} ({NODE_KINDS[p.node.kind]})")
    if held is None:
        out.print(f"hostd now: {unheld}")
    elif not held:
        out.print("hostd now: holds nothing changed on this thread")
    for h in held or []:
        now, before = shown(h["kind"], h["current"]), shown(h["kind"], h["original"])
        line = f"hostd now: {h['what']} {now} (before hostd: {before})"
        if h["state"] != "held":
            line += f"; {STATES[h['state']]}"
        out.print(line)
    layer = snap.policy.layer(ex.layer)
    group = layer.match[ex.group]
    why = " and ".join(pr.describe() for pr in group) or "the catch-all (matches every thread)"
    out.print(styled("-> layer ", (ex.layer, "bold"), f", group {ex.group}: {why}"))
    out.print(f"   ({layer.comment})")
    for line in ex.lines(groups=why_not):
        out.print("   " + line)
    if task.is_kthread and not any(
        pr.name == "is_kthread" and pr.value is True and not pr.negate for pr in group
    ):
        out.print(
            "   kernel thread: hostd never changes it unless the matching group says "
            "is_kthread = true"
        )
    for line in preempt_lines:
        out.print("   " + line)


def _cut(text: str, width: int, left: bool = False) -> str:
    """``text`` in ``width`` cells at most, an ellipsis where it was cut (``left``: its end
    kept, as a cgroup path's last part says the most)."""
    if len(text) <= width:
        return text
    if width < 2:
        return text[:width]
    return "…" + text[-(width - 1) :] if left else text[: width - 1] + "…"


def _held(host, task, state_dir: str) -> tuple[list[dict] | None, str]:
    """What the agent's journal holds changed on this thread (its task keys; its session's
    weight where it leads one), or None and why not."""
    journal, why = open_journal(host, state_dir)
    if journal is None:
        return None, why
    return [h.as_json() for h in held(host, journal, f"task/{task.tid}@{task.start_time}/")], ""


def _preempt(snap, task, layer: str, run_dir: str) -> list[str]:
    """Preemption's lines for this thread: its layer's role, its session, the live agent's view
    (when one runs with this run dir and the same policy)."""
    sid = task.process.session
    agent = agent_pid(run_dir) if snap.host.live else None
    status = read_status(run_dir) if agent is not None else None
    live = None
    if (
        status
        and status.get("state") == "running"
        and status.get("policy", {}).get("sha256") == snap.policy.sha256
    ):
        live = status.get("preempt")
    try:
        agent_sid = os.getsid(agent) if agent is not None else -1
    except OSError:
        agent_sid = -1
    mates = [c for c in snap.classified if c.task.process.session == sid]
    pids = {c.task.process.pid for c in mates}
    launched = next(
        (
            c.layer
            for c in snap.classified
            if c.layer in snap.policy.protected and c.task.process.ppid in pids
        ),
        None,
    )
    kept = hostd.preempt.why_kept(
        sid,
        layers={c.layer for c in mates},
        tty=any(c.task.process.tty for c in mates),
        own_sid=agent_sid,
        protected=snap.policy.protected,
        shielding=hostd.preempt.shielding_layers(snap.policy),
        places=(c.task.process.node for c in mates),
        keep=snap.policy.preempt,
        launched=launched,
    )
    return hostd.preempt.explain(
        snap.policy, layer, tid=task.tid, session=sid, kept_because=kept, live=live
    )
