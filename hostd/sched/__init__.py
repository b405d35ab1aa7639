"""Scheduling knobs per thread: policy + RT priority + reset-on-fork, and nice.

``task/TID@START/sched`` holds ``[policy, priority, reset_on_fork]`` ("fifo", 10, true);
``task/TID@START/nice`` holds an int. ``task/PID@START/autogroup`` holds the nice of the
autogroup of the session that process PID leads (/proc/PID/autogroup, sched(7)): with
autogroups on, CFS first shares the CPU between sessions by that weight, then between the
threads of each session by theirs, so a thread's own nice cannot win against another session.
Reset-on-fork is set for real-time threads so that their children start as SCHED_OTHER
(sched(7)). Called through ``hostd.knobs`` by ``hostd.reconcile``.

``session/SID@SINCE/preempted`` is the record of a session demoted at tick SINCE
(``hostd.preempt``): a thread created by a demoted (SCHED_IDLE) thread is born SCHED_IDLE
(reset-on-fork resets only real-time policies and negative nice), also after a crash of
hostd. Restoring the record sweeps the session: every SCHED_IDLE thread started since SINCE
in the session, or in a process descending from it, gets the session's original policy
back (the threads hostd saw have records of their own, restored after this one).
"""

from __future__ import annotations

import errno
import time

from hostd import knobs
from hostd.host import Gone, Host, HostError, paths
from hostd.host.parsers import parse_stat
from hostd.model.tasks import session_members

SCHED_IDLE = 5  # include/uapi/linux/sched.h


def _read_sched(host: Host, key: str) -> list:
    tid = knobs.live_tid(host, key)
    policy, prio, reset = host.threads().get_sched(tid)
    return [policy, prio, reset]


def _write_sched(host: Host, key: str, value: object) -> None:
    policy, prio, reset = value  # type: ignore[misc]
    tid = knobs.live_tid(host, key)
    host.threads().set_sched(tid, str(policy), int(prio), bool(reset))


def _read_nice(host: Host, key: str) -> int:
    return host.threads().get_nice(knobs.live_tid(host, key))


def _write_nice(host: Host, key: str, value: object) -> None:
    host.threads().set_nice(knobs.live_tid(host, key), int(value))  # type: ignore[arg-type]


def _session_process(host: Host, key: str) -> int:
    """A live process of the session the key's leader led: the leader, or, once it exited,
    another member (they share its autogroup, and the kernel keeps the session id unused while
    one lives). Putting an original back (``knobs.RECORDED_AT``), only a member that existed
    when it was recorded: after a crash the whole session may be gone and its id reused by an
    unrelated one, whose processes all started later."""
    try:
        return knobs.live_tid(host, key)
    except Gone:
        sid, _ = knobs.parse_task_key(key)
        at = knobs.RECORDED_AT.get()
        member = next(
            (
                pid
                for pid, st in host.processes().items()
                if st.session == sid and (at is None or st.start_time <= at)
            ),
            None,
        )
        if member is not None:
            return member
        raise


def _read_autogroup(host: Host, key: str) -> int:
    tid = _session_process(host, key)
    text = host.read(paths.proc(tid, "autogroup"))
    if text is None:
        raise Gone(errno.ESRCH, key, "the process is gone")
    try:  # "/autogroup-698 nice 0"
        return int(text.split()[-1])
    except (IndexError, ValueError):
        raise HostError(errno.EINVAL, key, f"unexpected autogroup line {text.strip()!r}") from None


def _write_autogroup(host: Host, key: str, value: object) -> None:
    rel = paths.proc(_session_process(host, key), "autogroup")
    try:
        host.write(rel, str(int(value)))  # type: ignore[call-overload]
    except HostError as exc:
        # Without CAP_SYS_ADMIN the kernel takes one autogroup change per 100 ms host-wide.
        if exc.errno != errno.EAGAIN:
            raise
        time.sleep(0.11)
        host.write(rel, str(int(value)))  # type: ignore[call-overload]


SCHED = knobs.Spec(
    "sched",
    "task/TID@START/sched",
    _read_sched,
    _write_sched,
    knobs.CHECKS["sched"],
    noun="thread scheduling policy",
    kept_by_kernel=True,
    apply_order=3,  # the policy before the nice
    per_task=True,
    inheritable=True,  # a non-real-time policy (real-time ones hostd sets with reset-on-fork)
    needs="sched",
)
NICE = knobs.Spec(
    "nice",
    "task/TID@START/nice",
    _read_nice,
    _write_nice,
    knobs.CHECKS["nice"],
    noun="thread nice",
    kept_by_kernel=True,
    apply_order=4,
    per_task=True,
    inheritable=True,
    needs="sched",
)
AUTOGROUP = knobs.Spec(
    "autogroup",
    "task/PID@START/autogroup",
    _read_autogroup,
    _write_autogroup,
    knobs.CHECKS["nice"],
    noun="session (autogroup) nice",
    kept_by_kernel=True,
    apply_order=4,
    per_task=True,
    session_bound=True,
    needs="sched",
)


def _read_preempted(host: Host, key: str) -> None:
    """Nothing to read: restoring the record always sweeps the session."""
    return None


def _sweep(host: Host, key: str, value: object) -> None:
    sid, since = knobs.parse_task_key(key)
    if not isinstance(value, dict) or not isinstance(value.get("sched"), list):
        raise HostError(errno.EINVAL, key, f"a session record needs a sched value, not {value!r}")
    policy, prio, reset = value["sched"]
    if policy not in ("other", "batch", "idle", "fifo", "rr"):
        raise HostError(errno.EINVAL, key, f"a session record with policy {policy!r}")
    leader_start = value.get("leader_start")
    procs = host.processes()
    leader = procs.get(sid)
    if leader is not None and leader.session == sid and leader.start_time != leader_start:
        return  # the session id now names another session: nothing of ours is left
    members = session_members({pid: (st.ppid, st.session) for pid, st in procs.items()}, sid)
    calls = host.threads()
    refused: list[HostError] = []
    for pid in sorted(members):
        for entry in host.listdir(paths.proc(pid, "task")):
            try:
                text = host.read(paths.task(pid, entry, "stat"))
                if not text:
                    continue
                st = parse_stat(text)
                if st.policy == SCHED_IDLE and st.start_time >= since:
                    calls.set_sched(int(entry), str(policy), int(prio), bool(reset))
            except Gone:
                continue  # it exited meanwhile
            except HostError as exc:
                refused.append(exc)
            except (ValueError, IndexError):
                continue  # a half-written stat line: the thread is exiting
    if refused:  # the record stays open: the next restore tries again
        raise type(refused[0])(
            refused[0].errno or errno.EPERM, key, f"{len(refused)} threads refused: {refused[0]}"
        )


def _check_preempted(value: object) -> str | None:
    if not isinstance(value, dict) or set(value) != {"sched", "leader_start"}:
        return f"{value!r} is not a session record (sched, leader_start)"
    start = value["leader_start"]
    if start is not None and (type(start) is not int or start < 0):
        return f"leader_start {start!r} is not a start time"
    return knobs.CHECKS["sched"](value["sched"])


PREEMPTED = knobs.Spec(
    "preempted",
    "session/SID@SINCE/preempted",
    _read_preempted,
    _sweep,
    _check_preempted,
    noun="demoted session (what its new threads inherited)",
    apply_order=99,  # the agent writes it (hostd.agent.demotion), never a pass
    restore_phase=-1,  # first: the threads' own records then put back their own originals
    agent_owned=True,
)
