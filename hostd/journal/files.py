"""The journal's file and its host: the file's name, the error a journal that cannot be
written or read raises, the boot id its records are stamped with (``read_boot_id``, for the
agent and the commands that open a journal), and the low-level file steps the writer and the
compaction share (writing all of a buffer, fsync of the folder, the length up to the last
newline).
"""

from __future__ import annotations

import os
from pathlib import Path

from hostd.host import paths

JOURNAL_NAME = "journal.jsonl"


class JournalError(Exception):
    """The journal could not be written (nothing was recorded) or read at all."""


def read_boot_id(host) -> str:
    return (host.read_line(paths.sysctl("kernel/random/boot_id")) or "unknown").strip()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _whole_lines(fd: int) -> int:
    """The length of the file up to and including its last newline."""
    end = os.fstat(fd).st_size
    pos = end
    while pos > 0:
        start = max(0, pos - 65536)
        block = os.pread(fd, pos - start, start)
        cut = block.rfind(b"\n")
        if cut >= 0:
            return start + cut + 1
        pos = start
    return 0
