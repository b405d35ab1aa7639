"""The reaction benchmark's floor: the least a userspace agent in Python can do per thread.

bench/reaction.py's ``floor`` arm runs this instead of hostd. It subscribes to the proc connector
(hostd's own ``hostd.host.connector``, the same receive buffer) and, for each fork or comm event
of a thread whose name starts with ``bench_hot``, sets the hot CPU, SCHED_BATCH and nice -5:
one read of the thread's comm and three syscalls. No policy, no classification, no journal, no
cgroup. It runs at the agent's priority (nice -10, its session's autogroup too, as hostd does
when it leads its session). What it cannot do in 5 ms on a machine, no Python agent can: its
tail is the machine's (event delivery, wake-up, the measuring thread's own scheduling).

    floor_reactor.py HOT_CPU    # prints "ready" once subscribed; SIGTERM ends it
"""

from __future__ import annotations

import os
import select
import signal
import sys

from hostd.host.connector import Overflow, ProcConnector

PREFIX = b"bench_hot"


def main() -> int:
    hot = {int(sys.argv[1])}
    os.setpriority(os.PRIO_PROCESS, 0, -10)
    if os.getsid(0) == os.getpid():
        with open("/proc/self/autogroup", "w") as fh:
            fh.write("-10")
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    batch = os.sched_param(0)
    with ProcConnector() as conn:
        print("ready", flush=True)
        while not stop:
            try:
                if not select.select([conn], [], [], 0.5)[0]:
                    continue
            except InterruptedError:
                continue
            for ev in conn.read():
                if isinstance(ev, Overflow) or ev.kind not in ("fork", "comm"):
                    continue
                try:
                    fd = os.open(f"/proc/{ev.tid}/task/{ev.tid}/comm", os.O_RDONLY)
                    try:
                        name = os.read(fd, 64)
                    finally:
                        os.close(fd)
                    if not name.startswith(PREFIX):
                        continue
                    os.sched_setaffinity(ev.tid, hot)
                    os.sched_setscheduler(ev.tid, os.SCHED_BATCH, batch)
                    os.setpriority(os.PRIO_PROCESS, ev.tid, -5)
                except OSError:  # gone already
                    continue
    return 0


if __name__ == "__main__":
    sys.exit(main())
