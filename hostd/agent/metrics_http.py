"""The metrics exporter's HTTP server: bounded, counted and timed connections (``Server``, and
``Handler`` that keeps scrapes off the log); ``hostd.agent.metrics.Exporter`` serves ``/metrics``
with it.

The HTTP server is the agent's guest, and bounded so that no client can starve it (issue 44.2):
at most ``MAX_CLIENTS`` connections at once (one thread and one file descriptor each; the next
is closed on accept and counted), each given ``IDLE_S`` per read or write and ``DEADLINE_S`` in
all before it is shut down; an accept that fails for want of descriptors waits a moment rather
than spinning on the listening socket.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import socketserver
import threading
import time
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

log = logging.getLogger("hostd")

# The exporter's bounds: connections at once, seconds a read or write may wait, seconds a
# connection may last in all (a scrape takes milliseconds; Prometheus' own timeout is 10 s).
MAX_CLIENTS = 8
IDLE_S = 5.0
DEADLINE_S = 15.0
# Accept's errors that mean "out of descriptors or memory now": wait, do not spin.
_SCARCE = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class Handler(WSGIRequestHandler):
    timeout = IDLE_S  # StreamRequestHandler: every read and write of the connection

    def log_message(self, format, *args) -> None:
        """Scrapes are not logged (a line per scrape)."""


class Server(socketserver.ThreadingMixIn, WSGIServer):
    """A WSGI server whose connections are counted, timed and bounded (module docstring)."""

    daemon_threads = True
    block_on_close = False  # a stop does not wait for a slow client
    request_queue_size = 64  # listen(2)'s backlog: a burst waits in the kernel, not in the agent

    def __init__(self, address: tuple[str, int], handler: type) -> None:
        self.address_family = socket.getaddrinfo(*address, type=socket.SOCK_STREAM)[0][0]
        self.live: dict[socket.socket, float] = {}  # each connection: when it was accepted
        self.lock = threading.Lock()
        self.ended: set[socket.socket] = set()  # shut down, their threads not done yet
        self.refused = 0  # connections ended to make room, or closed at once
        self.expired = 0  # connections shut down at DEADLINE_S
        super().__init__(address, handler)

    def get_request(self):
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in _SCARCE:
                time.sleep(0.2)  # the listener stays readable: without this, a busy loop
            raise  # (socketserver drops a failed accept and polls again)

    def verify_request(self, request, client_address) -> bool:
        """Room for this connection: at ``MAX_CLIENTS`` the oldest is shut down for it (a
        scrape takes milliseconds, so the oldest is the idlest: a client holding connections
        open cannot lock Prometheus out); at twice that (the shut ones not closed yet) it is
        closed at once."""
        with self.lock:
            if len(self.live) >= 2 * MAX_CLIENTS:
                self.refused += 1
                return False  # closed by the caller at once
            open_now = [sock for sock in self.live if sock not in self.ended]
            oldest = (
                min(open_now, key=self.live.__getitem__) if len(open_now) >= MAX_CLIENTS else None
            )
            self.live[request] = time.monotonic()
        if oldest is not None:
            self._shut(oldest)
            self.refused += 1
        return True

    def _shut(self, sock: socket.socket) -> None:
        """End a connection: its thread reads the end of the stream and closes it."""
        with self.lock:
            if sock not in self.live:
                return  # closed meanwhile
            self.ended.add(sock)
            with contextlib.suppress(OSError):  # its client went first
                sock.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request, client_address) -> None:
        """A client that timed out, went away or was ended is no error of the agent's: no
        traceback on its log."""
        log.debug("metrics: a connection from %s ended early", client_address[0])

    def close_request(self, request) -> None:
        with self.lock:
            self.live.pop(request, None)
            self.ended.discard(request)
        super().close_request(request)

    def service_actions(self) -> None:
        """Between polls of the listener (every half second): shut down the connections that
        outlived ``DEADLINE_S`` (a client sending a byte every few seconds)."""
        now = time.monotonic()
        with self.lock:
            late = [
                sock
                for sock, since in self.live.items()
                if now - since > DEADLINE_S and sock not in self.ended
            ]
        for sock in late:
            self.expired += 1  # counted first: the client sees the end at once
            self._shut(sock)
