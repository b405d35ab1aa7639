"""The demo's other processes, helpers shared with the benchmarks: CPU contention
(``Contention``), the processes of a session (``session_pids``) and killing all that a child
started (``kill_session``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys


# -- helpers shared with bench/trainer/run.py --------------------------------------------------
class Contention:
    """``n`` CPU hogs in a session of their own (another tenant): ``stress-ng --cpu n`` where
    it is installed, else Python busy loops."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.tool = "stress-ng" if shutil.which("stress-ng") else "python busy loops"
        if self.tool == "stress-ng":
            argv = ["stress-ng", "--cpu", str(n), "--cpu-method", "int64", "--quiet"]
        else:
            code = (
                "import os\nfor _ in range(%d - 1):\n    if os.fork() == 0: break\nwhile True: pass"
            )
            argv = [sys.executable, "-c", code % n]
        self.proc = subprocess.Popen(
            argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def pids(self) -> list[int]:
        return session_pids(self.proc.pid)

    def stop(self) -> None:
        kill_session(self.proc)


def _processes() -> dict:
    """{pid: its parsed /proc/PID/stat} of every process now (read through ``Host``)."""
    from hostd.host import Host

    return Host().processes()


def session_pids(sid: int) -> list[int]:
    """The processes of session ``sid`` now."""
    return sorted(pid for pid, st in _processes().items() if st.session == sid)


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL what ``proc`` started: its session (it was started with start_new_session) and
    every descendant, also those in sessions of their own (the ranks); then reap it."""
    table = _processes()
    doomed = {pid for pid, st in table.items() if st.session == proc.pid} | {proc.pid}
    grew = True
    while grew:
        more = {pid for pid, st in table.items() if st.ppid in doomed} - doomed
        doomed |= more
        grew = bool(more)
    for pid in sorted(doomed):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
