"""``hostd run``, ``restore``, ``status``, ``enable``, ``disable`` and ``doctor``.

Thin wrappers over ``hostd.agent``, ``hostd.reconcile.restore`` and ``hostd.doctor``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time

import typer
from rich.table import Table

from hostd.agent import (
    DEFAULT_RUN_DIR,
    DEFAULT_STATE_DIR,
    Agent,
    AgentError,
    agent_pid,
    read_status,
    summarize,
)
from hostd.cli.common import (
    EXIT_FAILURE,
    EXIT_PARTIAL,
    JsonOpt,
    PolicyOpt,
    RootOpt,
    err,
    fail,
    get_host,
    out,
    policy_file,
    print_json,
    show,
    styled,
)
from hostd.doctor import Finding, job_findings, probe
from hostd.host import Host
from hostd.journal import Journal, JournalError, read_boot_id
from hostd.knobkinds import BY_KIND
from hostd.policy import PolicyError
from hostd.reconcile import DONE
from hostd.reconcile import restore as restore_journal
from hostd.sidecar import HOST_WIDE_KINDS, SidecarError
from hostd.sidecar import describe as describe_sidecar
from hostd.sidecar import scope as sidecar_scope
from hostd.statedir import Locked, UnsafeDir, lock_host, open_dir, open_file
from hostd.tasks import scan

StateOpt = typer.Option(
    DEFAULT_STATE_DIR, "--state-dir", envvar="HOSTD_STATE_DIR", help="Where the journal lives."
)
RunOpt = typer.Option(
    DEFAULT_RUN_DIR, "--run-dir", envvar="HOSTD_RUN_DIR", help="Pid, status and switch files."
)


def _logging(verbose: bool) -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
    )


def run(
    policy: str = PolicyOpt,
    mode: str = typer.Option(None, "--mode", help="enforce or observe (default: the policy's)."),
    once: bool = typer.Option(False, "--once", help="One pass, then exit (changes are kept)."),
    state_dir: str = StateOpt,
    run_dir: str = RunOpt,
    allow_insecure_policy: bool = typer.Option(
        False, "--allow-insecure-policy", help="Accept a policy file non-root users can write."
    ),
    scope_pid: list[int] = typer.Option(
        [], "--scope-pid", help="Only this process and its descendants (repeatable)."
    ),
    sidecar: bool = typer.Option(
        False,
        "--sidecar",
        envvar="HOSTD_SIDECAR",
        help="Manage only this pod's tasks (or this cgroup's parent); host-wide knobs off.",
    ),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Log every decision (DEBUG), not only what changed."
    ),
) -> None:
    """Run the agent: apply the policy and keep it applied; Ctrl-C (SIGTERM) restores."""
    if os.geteuid() != 0:
        fail(
            "hostd run needs root (it changes other users' threads); `hostd plan` shows what "
            "it would do",
            EXIT_FAILURE,
        )
    _logging(verbose)
    if mode not in (None, "enforce", "observe"):
        fail(f"--mode {mode!r}: expected enforce or observe")
    if sidecar:
        try:
            sidecar_scope(Host())  # it can tell its pod's tasks, or says why not
        except SidecarError as exc:
            fail(str(exc), EXIT_FAILURE)
    policy = policy_file(policy)  # an installed policy's name: its file
    try:
        agent = Agent(
            Host(),
            policy,
            state_dir=state_dir,
            run_dir=run_dir,
            mode=mode,
            allow_insecure_policy=allow_insecure_policy,
            scope=scope_pid or None,
            sidecar=sidecar,
        )
    except PolicyError as exc:
        fail(str(exc))
    except AgentError as exc:  # a damaged journal
        fail(str(exc), EXIT_FAILURE)
    for warning in agent.policy.warnings:
        logging.getLogger("hostd").warning("policy %s", warning)
    try:
        report = agent.run(once=once)
    except (AgentError, SidecarError) as exc:
        fail(str(exc), EXIT_FAILURE)
    if once:
        out.print(f"one pass ({agent.mode}): {summarize(report.counts)}")
        if agent.mode == "enforce" and len(agent.journal):
            out.print(f"changes are kept; `hostd restore --state-dir {state_dir}` undoes them")


def restore(
    state_dir: str = StateOpt,
    run_dir: str = RunOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Put every knob hostd changed back to its original value (also after a crash)."""
    if agent_pid(run_dir):
        fail(
            f"an agent is running (pid {agent_pid(run_dir)}): stop it (it restores) or "
            "`hostd disable` it",
            EXIT_FAILURE,
        )
    if os.geteuid() != 0:
        fail("hostd restore needs root (it writes what the root agent changed)", EXIT_FAILURE)
    try:
        os.close(open_dir(state_dir, 0o700))
        lock = lock_host()  # no agent starts while this restore runs
    except UnsafeDir as exc:
        fail(str(exc), EXIT_FAILURE)
    except Locked as exc:
        fail(f"an agent is running (pid {exc.pid or '?'}): stop it (it restores)", EXIT_FAILURE)
    try:
        _restore(state_dir, as_json)
    finally:
        os.close(lock)  # (the command may run inside a longer process: the tests' CliRunner)


def _restore(state_dir: str, as_json: bool) -> None:
    host = Host()
    try:
        journal = Journal(state_dir, read_boot_id(host))
    except JournalError as exc:
        fail(f"{exc}: nothing restored", EXIT_FAILURE)
    report = restore_journal(host, journal)
    lost = [{"line": n, "why": why} for n, why in journal.damaged]
    if journal.torn:
        why = (
            "cut off: if hostd crashed while writing it, its knobs were never written; if the "
            "file was damaged, what was recorded after it is lost"
        )
        lost.append({"line": journal.torn, "why": why})
    failed = [r for r in report.results if r.outcome not in DONE]
    aside = None
    if lost and not failed:
        aside = journal.set_aside()  # every readable record is back: the agent may start
    if as_json:
        print_json(
            {
                "results": [
                    {"key": r.key, "outcome": r.outcome, "value": r.value, "detail": r.detail}
                    for r in report.results
                ],
                "unreadable": lost,
                "set_aside": str(aside) if aside else None,
                "journal_problem": journal.problem or None,
            }
        )
    else:
        for r in report.results:
            out.print(f"{r.key}: {r.outcome}" + (f" ({r.detail})" if r.detail else ""))
        for item in lost:
            out.print(f"{journal.path} line {item['line']}: not restored ({item['why']})")
        out.print(f"restore: {summarize(report.counts)}")
        if lost:
            where = f"; the file is set aside as {aside}" if aside else ""
            err.print(
                f"hostd: restore is partial: {len(lost)} journal line(s) could not be read, "
                f"and what they recorded is not restored{where}"
            )
    if journal.problem:
        err.print(f"hostd: everything readable is restored, but the journal {journal.problem}")
    if failed:
        raise typer.Exit(EXIT_FAILURE)
    if lost:
        raise typer.Exit(EXIT_PARTIAL)


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


# What an event of the agent's log of recent events (``loop.note``) did, as observe mode says
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


def _switch(run_dir: str, disabled: bool, as_json: bool) -> None:
    verb = "disable" if disabled else "enable"
    if os.geteuid() != 0:
        fail(f"hostd {verb} needs root (it switches the agent that runs as root)", EXIT_FAILURE)
    try:
        dir_fd = open_dir(run_dir)
    except UnsafeDir as exc:
        fail(str(exc), EXIT_FAILURE)
    try:
        if disabled:
            os.close(open_file(dir_fd, "disabled", os.O_WRONLY | os.O_CREAT, 0o644))
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink("disabled", dir_fd=dir_fd)
    except OSError as exc:
        fail(f"{run_dir}/disabled: {exc.strerror}", EXIT_FAILURE)
    finally:
        os.close(dir_fd)
    pid = agent_pid(run_dir)
    if pid is not None:
        os.kill(pid, signal.SIGUSR1)
    if as_json:
        print_json({"disabled": disabled, "agent_pid": pid, "run_dir": run_dir})
    elif pid is None:
        out.print(f"hostd {'disabled' if disabled else 'enabled'} (no agent is running now)")
    else:
        out.print(
            f"hostd {'disabled: restoring everything' if disabled else 'enabled'} "
            f"(agent pid {pid}, within one pass)"
        )


def disable(run_dir: str = RunOpt, as_json: bool = JsonOpt) -> None:
    """Switch the running agent off: it restores everything and stays idle."""
    _switch(run_dir, True, as_json)


def enable(run_dir: str = RunOpt, as_json: bool = JsonOpt) -> None:
    """Switch the agent back on."""
    _switch(run_dir, False, as_json)


def doctor(
    root: str = RootOpt,
    as_json: bool = JsonOpt,
    sidecar: bool = typer.Option(
        False, "--sidecar", envvar="HOSTD_SIDECAR", help="What `hostd run --sidecar` may do here."
    ),
) -> None:
    """Say what this host allows hostd to do, and what it will and will not do here."""
    host = get_host(root)
    caps = probe(host)
    caps.findings += job_findings(scan(host, read_fds=True))
    if sidecar:
        caps.findings += [Finding(*line) for line in describe_sidecar(host)]
    if as_json:
        found = [{"feature": f.feature, "ok": f.ok, "detail": f.detail} for f in caps.findings]
        print_json({"findings": found})
        return
    for f in caps.findings:
        mark = ("ok", "green") if f.ok else ("no", "yellow")
        out.print(styled(mark, f"  {f.feature:15} {f.detail}"))
    off = sorted(caps.disabled_kinds() | (HOST_WIDE_KINDS if sidecar else set()))
    named = ", ".join(f"{BY_KIND[kind].noun} ({kind})" for kind in off)
    out.print(
        "hostd run will "
        + ("change everything its policy asks for" if not off else f"leave out: {named}")
    )
