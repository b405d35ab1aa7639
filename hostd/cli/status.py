"""``hostd status``: the running agent's state, exit code and last pass, and its renderers.

Reads the agent's status file (``hostd.agent.read_status``); ``status`` is registered in
``hostd.cli``. ``sizing_lines`` is shared with ``hostd top``.
"""

from __future__ import annotations

import os
import time

import typer
from rich.table import Table

from hostd.agent import agent_pid, read_status, summarize
from hostd.cli.agent import RunOpt
from hostd.cli.common import JsonOpt, out, print_json, show

# ``hostd status`` exit codes (docs/commands.md), after LSB's for a service's status: 0 the
# agent runs and applies the policy; 1 it ended without restoring (killed, crashed, the host lost
# power): its journal holds originals and ``hostd restore`` puts them back; 3 no agent runs and
# nothing is left to restore; 5 the agent runs, switched off with ``hostd disable``.
STATUS_RUNNING, STATUS_UNCLEAN, STATUS_STOPPED, STATUS_DISABLED = 0, 1, 3, 5


def agent_state(st: dict | None, pid: int | None, switched_off: bool) -> tuple[str, int, str]:
    """(state, exit code, the line that says it) from the last status file, the running agent's
    pid and the persisted switch."""
    persisted = (
        "; the switch persists: an agent started later stays off until `hostd enable`"
        if switched_off
        else ""
    )
    if pid is not None and st is not None and st.get("state") == "disabled":
        return (
            "disabled",
            STATUS_DISABLED,
            f"disabled by `hostd disable` (agent pid {pid}){persisted}",
        )
    if pid is not None:
        return "running", STATUS_RUNNING, f"running (agent pid {pid})"
    if st is None:
        return "stopped", STATUS_STOPPED, f"not running (no agent has run here){persisted}"
    records = (st.get("journal") or {}).get("records", 0)
    if st.get("state") != "stopped":
        return (
            "unclean",
            STATUS_UNCLEAN,
            f"not running: the agent ended without restoring (its last state: {st.get('state')}); "
            f"its journal held {records} originals: run `hostd restore`{persisted}",
        )
    if records:
        return (
            "stopped",
            STATUS_STOPPED,
            f"stopped; its changes were kept ({records} originals in the journal): "
            f"`hostd restore` undoes them{persisted}",
        )
    return "stopped", STATUS_STOPPED, f"stopped, everything restored{persisted}"


def status(run_dir: str = RunOpt, as_json: bool = JsonOpt) -> None:
    """Mode, policy, layers with thread counts, and the last pass of the running agent.

    Exit status: 0 running; 1 ended without restoring (run `hostd restore`); 3 not running,
    nothing to restore; 5 running but switched off (`hostd disable`)."""
    st = read_status(run_dir)
    pid = agent_pid(run_dir)
    switched_off = os.path.lexists(os.path.join(run_dir, "disabled"))
    state, code, line = agent_state(st, pid, switched_off)
    if st is None:
        if as_json:
            print_json({"state": state, "running": False, "disabled": switched_off})
        else:
            out.print(f"hostd: {line}")
        raise typer.Exit(code)
    st["running"] = pid is not None
    st["agent_state"], st["disabled"] = state, switched_off
    if as_json:
        print_json(st)
        raise typer.Exit(code)
    out.print(f"hostd {st['version']}: {line}")
    if state != "running":  # stopped, crashed or switched off: what its last status file says of
        # preemption, attempts, sizing and layers no longer holds; only the end and what to do
        ran = "runs" if pid is not None else "ran"
        out.print(f"it {ran} in mode {st['mode']}, policy {st['policy']['name']} "
                  f"({st['policy']['source']})")  # fmt: skip
        for text in next_steps(state):
            out.print(text)
        raise typer.Exit(code)
    observe = st["mode"] != "enforce"
    out.print(f"mode {st['mode']}, policy {st['policy']['name']} ({st['policy']['source']})")
    if observe:
        out.print(
            f"{st['mode']} mode: hostd changes nothing on this host; what follows says what it "
            "would do (`hostd run --mode enforce` to apply it)"
        )
    last = st.get("last_pass") or {"time": time.time(), "seconds": 0, "counts": {}}
    age = time.time() - last["time"]
    out.print(
        f"last pass {age:.1f}s ago took {last['seconds'] * 1000:.1f} ms: "
        f"{summarize(last['counts'])}; journal holds {st['journal']['records']} originals"
    )
    source = st.get("source") or {}
    if source:
        out.print(f"source {source.get('kind')}: {source.get('detail')}")
    if st.get("metrics"):
        out.print(f"metrics: {st['metrics']}")
    own = st.get("self") or {}
    if own:
        out.print(
            f"the agent itself: {own['cpu_seconds']:.2f} CPU-s so far, "
            f"{own['rss_bytes'] / 2**20:.0f} MiB resident"
        )
    events = st.get("events") or {}
    if events.get("events"):
        out.print(
            f"events {events['events']} in {events.get('event_passes', 0)} event passes, "
            f"{events.get('full_passes', 0)} full passes, "
            f"{events.get('overflows', 0)} overflows, "
            f"{events.get('device_events', 0)} device events"
        )
    table = Table(title_justify="left")
    for col in ("layer", "kind", "threads", "own CPUs", "notes"):
        table.add_column(col)
    from hostd.model.cpus import format_cpulist

    for layer in st["layers"]:
        table.add_row(
            layer["name"],
            layer["kind"],
            str(layer["threads"]),
            format_cpulist(layer["cpus"]) or "-",
            "; ".join(layer["notes"]),
        )
    if st["layers"]:
        show(table)
    for text in preempt_lines(st.get("preempt") or {}, observe=observe):
        out.print(text)
    for text in sizing_lines(st.get("sizing")) + attempt_lines(st.get("attempts")):
        out.print(text)
    raise typer.Exit(code)


def next_steps(state: str) -> list[str]:
    """What to do about an agent that does not run (or runs switched off), for ``hostd
    status``; the state line already says it where ``hostd restore`` is the answer."""
    if state == "disabled":
        return ["`hostd enable` switches it back on"]
    if state == "stopped":
        return ["`hostd run` (or its service) starts it again"]
    return []


def sizing_lines(sizing: dict | None, last: int = 5) -> list[str]:
    """Self-sizing layers: each one's size and why, then the last resizes (``hostd status``,
    ``hostd top``)."""
    if not sizing:
        return []
    lines = [
        f"self-sizing {name}: {v['cpus']} CPUs ({v['why']})"
        for name, v in sorted((sizing.get("layers") or {}).items())
    ]
    now = time.time()
    for r in list(sizing.get("resizes") or ())[-last:]:
        lines.append(
            f"  {now - r['time']:.0f}s ago {r['layer']} {r['from']} -> {r['to']} CPUs: {r['why']}"
        )
    return lines


def attempt_lines(attempts: dict | None) -> list[str]:
    """The job attempts the agent is recording (``hostd report`` compares them)."""
    lines = []
    for a in (attempts or {}).get("live") or ():
        rate = a.get("throughput")
        unit = a.get("throughput_unit") or ""
        lines.append(
            f"recording job {a['job']} attempt {a['attempt']} "
            f"({'protected' if a['protected'] else 'not protected'}"
            + (f", {rate:g} {unit}".rstrip() if rate is not None else "")
            + ")"
        )
    more = ((attempts or {}).get("other") or {}).get("attempts")
    if more:
        lines.append(f"recording {more} more attempts")
    return lines


# What an event of the agent's log of recent events (``Applier.note``) did, as observe mode says
# it: there, it decided them and changed nothing.
WOULD = {
    "demote": "would demote",
    "release": "would release",
    "boost": "would boost",
    "runaway": "would return to normal",
    "weight": "would weigh",
}


def preempt_lines(pre: dict, observe: bool = False) -> list[str]:
    """What preemption and the starvation guard are doing, for ``hostd status``; in observe
    mode, what they would do (they decide, and change nothing)."""
    if not pre:
        return []
    lines = []
    if pre.get("enabled"):
        protected = ", ".join(pre.get("protected_layers", []))
        state = "active" if pre.get("active") else "idle (no protected thread)"
        yields = "would yield" if observe else "yield"
        lines.append(
            f"preemption {state}: busy sessions ({pre.get('busy_cpus')}+ CPUs) of "
            f"{', '.join(pre.get('preemptible_layers', []))} {yields} to {protected}"
        )
        demoted = "would have been demoted" if observe else "demoted"
        for d in pre.get("demoted", []):
            lines.append(
                f"  session {d['session']} {demoted} {d['seconds']:.0f}s ago: wanted "
                f"{d['demand_at_demotion']:.2f} CPUs, now {d['demand_now']:.2f}"
            )
        for path in pre.get("demoted_cgroups", []):
            what = (
                "hostd's cgroup for demoted processes of the root cgroup"
                if path == "/hostd.demoted"
                else "it holds only demoted work"
            )
            lines.append(
                f"  cgroup {path} {'would yield' if observe else 'yields'} as a whole ({what})"
            )
    counts = pre.get("counts", {})
    if pre.get("guard"):
        boosts, runaways = counts.get("boosts", 0), counts.get("runaways", 0)
        names = (f" ({', '.join(r['comm'] + '/' + str(r['tid']) for r in pre['runaways'])})"
                 if pre.get("runaways") else "")  # fmt: skip
        if observe:
            lines.append(
                f"starvation guard (observe mode): would have made {boosts} boosts, would "
                f"have returned {runaways} runaway real-time threads to normal{names}"
            )
        else:
            lines.append(
                f"starvation guard: {boosts} boosts, "
                f"{runaways} runaway real-time threads returned to normal{names}"
            )
    for ev in pre.get("recent", [])[-5:]:
        about = (
            f"session {ev['session']}" if "session" in ev else f"{ev.get('comm')}/{ev.get('tid')}"
        )
        when = time.strftime("%H:%M:%S", time.localtime(ev["time"]))
        what = WOULD.get(ev["what"], f"would {ev['what']}") if observe else ev["what"]
        lines.append(f"  {when} {what} {about}: {ev['why']}")
    return lines
