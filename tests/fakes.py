"""A fake kernel for a fixture tree: per-thread calls that change the tree's own files.

``FakeCalls(tree)`` offers ``hostd.host.syscalls.ThreadCalls`` over a copy of a fixture host
(``tests/fixtures/hosts/<name>``): ``set_affinity`` rewrites the thread's ``Cpus_allowed_list``,
``set_sched``/``set_nice`` its ``stat`` fields (policy, RT priority, nice), so that what hostd
reads back after a write is what it wrote, as on a live kernel. A thread without files is gone
(ESRCH). Every write is recorded in ``writes``; page moves are refused (ENOSYS). With
``Host(tree, calls=FakeCalls(tree))`` the agent runs whole passes without root.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from hostd.host.errors import Gone, HostError
from hostd.host.parsers import split_stat
from hostd.host.syscalls import POLICY_NAMES, POLICY_NUMBERS
from hostd.model.cpus import format_cpulist, parse_cpulist

NICE, RT_PRIORITY, POLICY = 16, 37, 38  # indexes in split_stat's fields: proc(5) (19), (40), (41)


HOSTS = Path(__file__).resolve().parent / "fixtures" / "hosts"


def host_copy(tmp_path: Path, name: str = "dgx-h100") -> Path:
    """A writable copy of fixture host ``name`` below ``tmp_path`` (skips the test without it)."""
    import pytest

    if not (HOSTS / name).is_dir():
        pytest.skip(f"no {name} fixture tree")
    dest = tmp_path / "host"
    shutil.copytree(HOSTS / name, dest, symlinks=True)
    return dest


class FakeCalls:
    def __init__(self, tree: Path) -> None:
        self.tree = Path(tree)
        self.writes: list[tuple[str, int, object]] = []  # (call, tid, value)
        self.reset_on_fork: dict[int, bool] = {}

    # -- the tree's files ----------------------------------------------------------------------
    def _task_dir(self, tid: int) -> Path:
        for path in self.tree.glob(f"proc/*/task/{tid}"):
            if (path / "stat").is_file():
                return path
        raise Gone(errno.ESRCH, f"task/{tid}", "no such thread")

    def _stat_files(self, tid: int) -> list[Path]:
        task = self._task_dir(tid)
        files = [task / "stat"]
        leader = self.tree / "proc" / str(tid) / "stat"
        if task.parent.parent.name == str(tid) and leader.is_file():
            files.append(leader)  # a group leader's process file says the same
        return files

    def _fields(self, tid: int) -> list[str]:
        return split_stat(self._stat_files(tid)[0].read_text())[1]

    def _set_fields(self, tid: int, values: dict[int, int]) -> None:
        for path in self._stat_files(tid):
            text = path.read_text()
            cut = text.rindex(")") + 2
            fields = text[cut:].split(" ")
            for index, value in values.items():
                fields[index] = str(value)
            path.write_text(text[:cut] + " ".join(fields))

    # -- ThreadCalls ---------------------------------------------------------------------------
    def get_affinity(self, tid: int) -> frozenset[int]:
        for line in (self._task_dir(tid) / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return parse_cpulist(line.split(":", 1)[1].strip())
        return frozenset()

    def set_affinity(self, tid: int, cpus: frozenset[int]) -> None:
        path = self._task_dir(tid) / "status"
        lines = [
            f"Cpus_allowed_list:\t{format_cpulist(cpus)}"
            if line.startswith("Cpus_allowed_list:")
            else line
            for line in path.read_text().splitlines()
        ]
        path.write_text("\n".join(lines) + "\n")
        self.writes.append(("affinity", tid, cpus))

    def get_sched(self, tid: int) -> tuple[str, int, bool]:
        fields = self._fields(tid)
        policy = int(fields[POLICY])
        name = POLICY_NAMES.get(policy, str(policy))
        return name, int(fields[RT_PRIORITY]), self.reset_on_fork.get(tid, False)

    def set_sched(self, tid: int, policy: str, priority: int, reset_on_fork: bool) -> None:
        self._set_fields(tid, {POLICY: POLICY_NUMBERS[policy], RT_PRIORITY: priority})
        self.reset_on_fork[tid] = reset_on_fork
        self.writes.append(("sched", tid, (policy, priority, reset_on_fork)))

    def get_nice(self, tid: int) -> int:
        return int(self._fields(tid)[NICE])

    def set_nice(self, tid: int, nice: int) -> None:
        self._set_fields(tid, {NICE: nice})
        self.writes.append(("nice", tid, nice))

    def move_pages(self, pid: int, pages: list[int], node: int | None) -> list[int]:
        raise HostError(errno.ENOSYS, "move_pages", "a fixture tree has no pages")

    def migrate_pages(self, pid: int, old: frozenset[int], new: frozenset[int]) -> int:
        raise HostError(errno.ENOSYS, "migrate_pages", "a fixture tree has no pages")
