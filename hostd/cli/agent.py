"""``hostd run``, ``restore``, ``enable``, ``disable`` and ``doctor``.

Thin wrappers over ``hostd.agent``, ``hostd.reconcile.restore`` and ``hostd.doctor``; also the
``--state-dir``/``--run-dir`` options, shared with ``hostd.cli.status``,
``changes`` and ``stats``. ``hostd status`` is in ``hostd.cli.status``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys

import typer

from hostd.agent import (
    DEFAULT_RUN_DIR,
    DEFAULT_STATE_DIR,
    Agent,
    AgentError,
    agent_pid,
    summarize,
)
from hostd.agent.lock import POLL_S, wait_for_host
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
from hostd.statedir import Locked, UnsafeDir, open_dir, open_file
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
    wait: float = typer.Option(
        0.0,
        "--wait",
        min=0,
        metavar="SECONDS",
        help=(
            f"While an agent runs (is stopping), try again every {POLL_S:g} s for up to "
            "SECONDS and restore once it is gone (default 0: refuse at once). For a "
            "Kubernetes pod's init container, started while the node's previous hostd pod "
            "still restores (deploy/k8s/daemonset.yaml)."
        ),
    ),
) -> None:
    """Put every knob hostd changed back to its original value (also after a crash)."""
    if not math.isfinite(wait):
        fail(f"--wait {wait}: expected a finite number of seconds")
    if not wait and agent_pid(run_dir):
        fail(
            f"an agent is running (pid {agent_pid(run_dir)}): stop it (it restores) or "
            "`hostd disable` it",
            EXIT_FAILURE,
        )
    if os.geteuid() != 0:
        fail("hostd restore needs root (it writes what the root agent changed)", EXIT_FAILURE)
    try:
        os.close(open_dir(state_dir, 0o700))
        lock = wait_for_host(run_dir, wait)  # no agent starts while this restore runs
    except UnsafeDir as exc:
        fail(str(exc), EXIT_FAILURE)
    except Locked as exc:
        waited = f" after waiting {wait:g} s for it to stop" if wait else ""
        fail(
            f"an agent is running (pid {exc.pid or '?'}){waited}: stop it (it restores)",
            EXIT_FAILURE,
        )
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
