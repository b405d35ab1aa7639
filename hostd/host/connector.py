"""The kernel's proc connector: fork, exec, comm and exit events of every task, as they happen.

A netlink socket (``NETLINK_CONNECTOR``, multicast group ``CN_IDX_PROC``) receives one message
per event; see ``include/uapi/linux/cn_proc.h`` and ``drivers/connector/cn_proc.c``. Called by
the agent's event loop (``hostd.agent``) and by ``hostd doctor``'s probe.

What the kernel does, and what this module does about it (FACTS.md):

* **Subscription is acknowledged**: the kernel answers ``PROC_CN_MCAST_LISTEN`` with an ack
  event carrying our sequence number and an error code (EPERM without CAP_NET_ADMIN). Events can
  reach this socket through someone else's subscription, so only our own ack counts. In a new
  pid or user namespace the request is silently ignored: no ack within the timeout means "not
  available here" (the agent then polls /proc).
* **Event-type filter** (kernel >= 6.6): an 8-byte ``proc_input`` asks for fork, exec, comm and
  exit only, so uid/gid/sid/ptrace/coredump events never wake hostd. Older kernels ignore the
  8-byte form without an ack; we then subscribe with the 4-byte form (every event type).
* **Overflow**: a large receive buffer (SO_RCVBUFFORCE, 8 MiB by default) avoids losing events
  in a burst; when the kernel still drops some, ``recv`` fails once with ENOBUFS. ``read()``
  then returns an ``Overflow`` marker: the caller must rescan /proc, since it cannot know what
  it missed.

Threads are tasks: a new thread is a fork event whose child tid differs from its tgid; a rename
is a comm event with the tid. Pids are the host's (the initial pid namespace).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import struct
import time
from typing import NamedTuple

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
NLMSG_DONE = 3
SO_RCVBUFFORCE = 33

PROC_CN_MCAST_LISTEN = 1
PROC_CN_MCAST_IGNORE = 2

# enum proc_cn_event (cn_proc.h)
EV_NONE = 0x0
EV_FORK = 0x1
EV_EXEC = 0x2
EV_COMM = 0x200
EV_EXIT = 0x80000000
WANTED = EV_FORK | EV_EXEC | EV_COMM | EV_EXIT
EV_ALL = WANTED | 0x4 | 0x40 | 0x80 | 0x100 | 0x20000000 | 0x40000000  # PROC_EVENT_ALL

_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_CNMSG = struct.Struct("=IIIIHH")  # idx, val, seq, ack, len, flags
_HEAD = struct.Struct("=IIQ")  # what, cpu, timestamp_ns
_EVENT_AT = _NLMSG.size + _CNMSG.size
_DATA_AT = _EVENT_AT + _HEAD.size
_TWO = struct.Struct("=ii")
_FOUR = struct.Struct("=iiii")
_HEAD_FOUR = struct.Struct("=IIQiiii")  # the header, then a fork's or an exit's first four
_ACK = struct.Struct("=I")

DEFAULT_RCVBUF = 8 * 1024 * 1024


class Event(NamedTuple):
    """One task event. ``kind``: "fork", "exec", "comm" or "exit"."""

    kind: str
    tid: int  # the task concerned (for fork: the new one)
    tgid: int  # its thread group (process) id
    parent_tgid: int = 0  # fork only: the creating process
    comm: str = ""  # comm only: the new name
    ts: int = 0  # when the kernel sent it: CLOCK_MONOTONIC ns (time.monotonic_ns()); 0 unknown


class Overflow(NamedTuple):
    """The kernel dropped events (ENOBUFS): rescan /proc."""

    kind: str = "overflow"


class ConnectorError(OSError):
    """The proc connector is not available (no permission, not in the initial namespaces)."""


def _request(seq: int, payload: bytes) -> bytes:
    cn = _CNMSG.pack(CN_IDX_PROC, CN_VAL_PROC, seq, seq, len(payload), 0) + payload
    return _NLMSG.pack(_NLMSG.size + len(cn), NLMSG_DONE, 0, seq, os.getpid()) + cn


def parse(data: bytes | memoryview) -> Event | int | None:
    """One netlink message: an ``Event``, an ack's error code (int), or None (not wanted)."""
    if len(data) >= _DATA_AT + 16:  # a fork or an exit (a storm's): one unpack
        what, _cpu, ts, a, b, c, d = _HEAD_FOUR.unpack_from(data, _EVENT_AT)
        if what == EV_FORK:
            return Event("fork", c, d, b, "", ts)
        if what == EV_EXIT:
            return Event("exit", a, b, 0, "", ts)
    elif len(data) < _DATA_AT:
        return None
    what, _cpu, ts = _HEAD.unpack_from(data, _EVENT_AT)
    if what == EV_FORK:
        _ptid, ptgid, tid, tgid = _FOUR.unpack_from(data, _DATA_AT)
        return Event("fork", tid, tgid, ptgid, "", ts)
    if what == EV_EXIT:
        tid, tgid = _TWO.unpack_from(data, _DATA_AT)
        return Event("exit", tid, tgid, 0, "", ts)
    if what == EV_COMM:
        tid, tgid = _TWO.unpack_from(data, _DATA_AT)
        raw = bytes(data[_DATA_AT + 8 : _DATA_AT + 24])
        name = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
        return Event("comm", tid, tgid, 0, name, ts)
    if what == EV_EXEC:
        tid, tgid = _TWO.unpack_from(data, _DATA_AT)
        return Event("exec", tid, tgid, 0, "", ts)
    if what == EV_NONE:
        return _ACK.unpack_from(data, _DATA_AT)[0]
    return None


class ProcConnector:
    """A subscribed proc-connector socket. ``fileno()`` for select; ``read()`` drains it."""

    def __init__(self, rcvbuf: int = DEFAULT_RCVBUF, timeout: float = 0.5) -> None:
        self.filtered = False  # the kernel filters event types for us (>= 6.6)
        self.rcvbuf = 0
        self._seq = (os.getpid() << 12 ^ time.monotonic_ns()) & 0x3FFFFFFF
        try:
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        except OSError as exc:
            raise ConnectorError(exc.errno, f"netlink connector socket: {exc.strerror}") from None
        try:
            self._set_rcvbuf(rcvbuf)
            self.sock.bind((os.getpid(), CN_IDX_PROC))
            self._subscribe(timeout)
        except BaseException:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self._buf = bytearray(4096)

    def _set_rcvbuf(self, size: int) -> None:
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, size)
        except OSError:  # without CAP_NET_ADMIN: as much as net.core.rmem_max allows
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
        self.rcvbuf = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)

    def _subscribe(self, timeout: float) -> None:
        # The kernel acks every request, but sends the ack through the event filter, which
        # passes an ack (event type 0) only to an unfiltered listener. So: subscribe to every
        # event type in the 8-byte form and check the ack, then narrow to the types we want
        # (that second request's ack is filtered away). A kernel before 6.6 ignores the 8-byte
        # form without an ack: then the 4-byte form, unfiltered.
        if self._request(struct.pack("=II", PROC_CN_MCAST_LISTEN, EV_ALL), timeout):
            self._request(struct.pack("=II", PROC_CN_MCAST_LISTEN, WANTED), None)
            self.filtered = True
        elif not self._request(struct.pack("=I", PROC_CN_MCAST_LISTEN), timeout):
            raise ConnectorError(
                errno.ETIMEDOUT,
                "proc connector: no acknowledgement (not in the host's pid/user namespace?)",
            )

    def _request(self, payload: bytes, timeout: float | None) -> bool:
        """Send one control request; with a timeout, wait for its ack (False: none came)."""
        self._seq += 1
        self.sock.send(_request(self._seq, payload))
        if timeout is None:
            return True
        err = self._await_ack(self._seq, timeout)
        if err:
            raise ConnectorError(err, f"proc connector refused: {os.strerror(err)}")
        return err is not None

    def _await_ack(self, seq: int, timeout: float) -> int | None:
        """Our ack's error code, or None on timeout. Events before it are dropped: the caller
        rescans /proc after subscribing."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.sock], [], [], left)
            if not ready:
                return None
            data = self.sock.recv(4096)
            if len(data) < _DATA_AT:
                continue
            # The kernel numbers its messages itself; our request's ack field, plus one, is
            # what identifies the answer to it.
            cn_ack = _CNMSG.unpack_from(data, _NLMSG.size)[3]
            parsed = parse(data)
            if isinstance(parsed, int) and cn_ack == seq + 1:
                return parsed

    def fileno(self) -> int:
        return self.sock.fileno()

    def mute_renames(self, mute: bool) -> bool:
        """Ask the kernel to stop (or start again) sending rename (comm) events: the way out of
        one thread's rename storm (``hostd.agent.loop``). Only where it filters event types
        (>= 6.6); False elsewhere."""
        if not self.filtered:
            return False
        wanted = WANTED & ~EV_COMM if mute else WANTED
        with contextlib.suppress(OSError):
            self._request(struct.pack("=II", PROC_CN_MCAST_LISTEN, wanted), None)
            return True
        return False

    def read(self, limit: int = 4096) -> list[Event | Overflow]:
        """Every pending event, up to ``limit``; never blocks. An ``Overflow`` means rescan."""
        out: list[Event | Overflow] = []
        recv_into, buf = self.sock.recv_into, self._buf
        view = memoryview(buf)
        while len(out) < limit:
            try:
                n = recv_into(buf)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    out.append(Overflow())
                    continue
                raise
            ev = parse(view[:n])
            if ev is not None and not isinstance(ev, int):
                out.append(ev)
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._request(struct.pack("=I", PROC_CN_MCAST_IGNORE), None)
        self.sock.close()

    def __enter__(self) -> ProcConnector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
