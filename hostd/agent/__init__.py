"""The agent: observe -> classify -> plan -> diff -> journal -> apply -> report, in a loop.

``Agent.pass_once()`` runs one pass (``hostd run --once``); ``Agent.run()`` repeats it every
``[agent] interval`` seconds until SIGTERM/SIGINT, then restores everything it changed (unless
the policy says ``restore_on_exit = false``). SIGHUP reloads the policy (a bad new policy keeps
the old one, and says why); SIGUSR1 wakes the agent at once (``hostd enable``/``disable`` use
it). Files:

* ``STATE_DIR/journal.jsonl``: the originals (``hostd.journal``); survives a crash, so
  ``hostd restore`` works after ``kill -9``.
With ``scope`` (``hostd run --scope-pid PID``) only those processes and their descendants are
classified and changed: a sandbox for tests, and the shape of a sidecar that manages its own job.

* ``RUN_DIR/agent.pid`` (locked while the agent runs), ``RUN_DIR/status.json`` (written after
  every pass, read by ``hostd status``), ``RUN_DIR/disabled`` (present: switched off).

The agent never touches its own process, and uses the doctor's probe to leave out what the host
does not allow (feature by feature) instead of failing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import select
import signal
import time
from collections import Counter
from pathlib import Path

from hostd import __version__, knobs
from hostd.cpufreq import hold_cpu_dma_latency
from hostd.cpuset import parse_cpulist
from hostd.doctor import Capabilities, probe
from hostd.host import Host
from hostd.journal import Journal, read_boot_id
from hostd.plan import plan
from hostd.policy import Policy, PolicyError, insecure_reason, load_default, load_policy
from hostd.reconcile import PassReport, desired_state, observed_state, reconcile, restore
from hostd.snapshot import take

log = logging.getLogger("hostd")

DEFAULT_STATE_DIR = "/var/lib/hostd"
DEFAULT_RUN_DIR = "/run/hostd"


class AgentError(RuntimeError):
    """The agent cannot start (another one runs, the policy is refused)."""


def load_checked(path: str | None, allow_insecure: bool) -> Policy:
    """The policy, refusing one that a non-root user could have written (raises PolicyError)."""
    if path is None:
        return load_default()
    if os.geteuid() == 0 and not allow_insecure:
        why = insecure_reason(path)
        if why:
            raise PolicyError.about_file(
                str(path),
                f"a policy only root can change ({why}); "
                "pass --allow-insecure-policy to use it anyway",
            )
    return load_policy(path)


def read_status(run_dir: str | Path) -> dict | None:
    try:
        with open(Path(run_dir) / "status.json", encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def agent_pid(run_dir: str | Path) -> int | None:
    """The pid of the running agent, or None (the pid file is locked while it runs)."""
    path = Path(run_dir) / "agent.pid"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None  # nobody holds it: a stale file
        except OSError:
            return int(os.read(fd, 32).decode().strip() or 0) or None
    finally:
        os.close(fd)


class Agent:
    def __init__(
        self,
        host: Host,
        policy_path: str | None,
        *,
        state_dir: str | Path = DEFAULT_STATE_DIR,
        run_dir: str | Path = DEFAULT_RUN_DIR,
        mode: str | None = None,
        allow_insecure_policy: bool = False,
        scope: list[int] | None = None,
    ) -> None:
        self.host = host
        self.policy_path = policy_path
        self.allow_insecure = allow_insecure_policy
        self.policy = load_checked(policy_path, allow_insecure_policy)
        self.mode_override = mode
        self.scope = scope
        self.state_dir = Path(state_dir)
        self.run_dir = Path(run_dir)
        self.journal = Journal(self.state_dir, read_boot_id(host), self.policy.sha256)
        self.caps: Capabilities = probe(host)
        self.unchangeable: set[str] = set()
        self.last: dict = {}
        self.passes = 0
        self._lock_fd: int | None = None
        self._stop = False
        self._reload = False
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._latency_fd: int | None = None
        if self.journal.dropped_old_boot:
            log.info(
                "journal dropped=%d reason=task-records-from-an-earlier-boot",
                self.journal.dropped_old_boot,
            )

    @property
    def mode(self) -> str:
        return self.mode_override or self.policy.mode

    @property
    def disabled(self) -> bool:
        return (self.run_dir / "disabled").exists()

    # -- one pass ------------------------------------------------------------------------------
    def _cstate(self, on: bool) -> None:
        """Hold (or release) the policy's C-state limit; the kernel lifts it when we exit."""
        want = self.policy.cpu_dma_latency_us
        if on and want is not None and self._latency_fd is None and self.mode == "enforce":
            try:
                self._latency_fd = hold_cpu_dma_latency(self.host, want)
                log.info("cstate cpu_dma_latency_us=%d held", want)
            except OSError as exc:
                log.warning("cstate refused: %s", exc)
        elif (not on or want is None) and self._latency_fd is not None:
            os.close(self._latency_fd)
            self._latency_fd = None

    def pass_once(self) -> PassReport:
        started = time.monotonic()
        self._cstate(not self.disabled)
        if self.disabled:
            report = restore(self.host, self.journal) if len(self.journal) else PassReport()
            self._write_status(report, time.monotonic() - started, layers=[], state="disabled")
            return report
        snap = take(self.host, self.policy, self.scope)
        base = {
            knobs.parse_task_key(k): parse_cpulist(str(self.journal.original(k)))
            for k in self.journal.recorded()
            if k.endswith("/affinity")
        }
        the_plan = plan(
            snap.topology,
            snap.classified,
            self.policy,
            base_affinity=base,
            exclude_pids=frozenset({os.getpid()}),
            allow_rt=self.caps.rt,
        )
        off = self.caps.disabled_kinds()
        want = {
            k: v
            for k, v in desired_state(the_plan, snap.tasks).items()
            if knobs.kind_of(k) not in off
        }
        report = reconcile(
            self.host,
            self.journal if self.mode == "enforce" else None,
            want,
            observed_state(snap.tasks),
            live_keys={t.key for t in snap.tasks},
            unchangeable=self.unchangeable,
        )
        elapsed = time.monotonic() - started
        self._log(report, elapsed)
        layers = [
            {
                "name": lp.name,
                "kind": lp.kind,
                "threads": lp.threads,
                "cpus": sorted(lp.cpus),
                "notes": list(lp.notes),
            }
            for lp in the_plan.layers
        ]
        self._write_status(report, elapsed, layers=layers, state="running")
        return report

    def _log(self, report: PassReport, elapsed: float) -> None:
        counts = report.counts
        self.passes += 1
        log.info(
            "pass n=%d mode=%s seconds=%.3f %s",
            self.passes,
            self.mode,
            elapsed,
            " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "nothing-to-do=1",
        )
        for r in report.results:
            if r.outcome in ("error",):
                log.error("action key=%s outcome=%s detail=%r", r.key, r.outcome, r.detail)
            elif r.outcome in ("not-permitted", "unsupported"):
                log.warning("action key=%s outcome=%s detail=%r", r.key, r.outcome, r.detail)
            elif r.outcome == "unchangeable" and r.detail != "refused before":
                log.info("action key=%s outcome=unchangeable (remembered, not retried)", r.key)

    def _write_status(self, report: PassReport, elapsed: float, layers: list, state: str) -> None:
        status = {
            "version": __version__,
            "pid": os.getpid(),
            "state": state,
            "mode": self.mode,
            "policy": {
                "source": self.policy.source,
                "name": self.policy.name,
                "sha256": self.policy.sha256,
            },
            "layers": layers,
            "last_pass": {
                "time": time.time(),
                "seconds": round(elapsed, 4),
                "counts": report.counts,
            },
            "passes": self.passes,
            "journal": {"path": str(self.journal.path), "records": len(self.journal)},
            "unchangeable": sorted(self.unchangeable),
            "capabilities": {
                "rt": self.caps.rt,
                "cpuset": self.caps.cpuset,
                "irqs": self.caps.irqs,
                "cpufreq": self.caps.cpufreq,
            },
        }
        self.last = status
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.run_dir / "status.json.tmp"
        tmp.write_text(json.dumps(status, indent=1))
        os.replace(tmp, self.run_dir / "status.json")

    # -- the loop ------------------------------------------------------------------------------
    def _lock(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.run_dir / "agent.pid", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise AgentError(f"another hostd agent is running ({self.run_dir}/agent.pid)") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _signal(self, signum: int, _frame: object) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            self._stop = True
        elif signum == signal.SIGHUP:
            self._reload = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def reload(self) -> None:
        try:
            new = load_checked(self.policy_path, self.allow_insecure)
        except PolicyError as exc:
            log.warning("reload refused, keeping the running policy: %s", exc)
            return
        self.policy = new
        self.journal.policy_sha = new.sha256
        log.info("reload policy=%s sha256=%s", new.name, new.sha256[:12])

    def run(self, once: bool = False) -> PassReport:
        self._lock()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(sig, self._signal)
        log.info(
            "start version=%s mode=%s policy=%s pid=%d",
            __version__,
            self.mode,
            self.policy.source,
            os.getpid(),
        )
        report = PassReport()
        try:
            while True:
                if self._reload:
                    self._reload = False
                    self.reload()
                try:
                    report = self.pass_once()
                except Exception:  # a bug or a full disk must not leave the host half-changed
                    log.exception("pass failed; the journal is intact, the next pass retries")
                    if once:
                        raise
                if once or self._stop:
                    break
                ready, _, _ = select.select([self._wake_r], [], [], self.policy.interval)
                if ready:
                    while True:
                        try:
                            if not os.read(self._wake_r, 64):
                                break
                        except BlockingIOError:
                            break
                if self._stop:
                    break
        finally:
            self._cstate(False)
            if self._stop and self.policy.restore_on_exit and self.mode == "enforce":
                restored = restore(self.host, self.journal)
                log.info(
                    "stop restored %s",
                    " ".join(f"{k}={v}" for k, v in sorted(restored.counts.items())) or "nothing",
                )
                self._write_status(restored, 0.0, layers=[], state="stopped")
            elif self._stop:
                log.info("stop (restore_on_exit = false: changes are kept; hostd restore undoes)")
                self._write_status(PassReport(), 0.0, layers=[], state="stopped")
        return report


def summarize(counts: Counter | dict) -> str:
    return ", ".join(f"{v} {k}" for k, v in sorted(dict(counts).items())) or "nothing to do"
