"""The demo's stand-in job: its roles (the launcher and the ranks with their data workers and
comm threads), started as ``python -m hostd.demo ROLE ...`` (``main``), and the CPU work of a
step and a batch (``busy``, ``calibrate``); ``JOB_LAYERS``, the layers it has."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import threading
import time

from hostd.demo.agentproc import HOSTD
from hostd.host import Host, paths

JOB_LAYERS = ("trainer", "comms", "data")


def rename(name: str) -> None:
    """Set the calling thread's comm (what ``ps -L`` and hostd's comm predicates see)."""
    Host().write(paths.task("self", threading.get_native_id(), "comm"), name)


def busy(iterations: int) -> int:
    acc = 0
    for i in range(iterations):
        acc = (acc + i * i) % 1_000_003
    return acc


def calibrate(ms: float) -> int:
    """Iterations of ``busy`` that take about ``ms`` milliseconds on this CPU, now."""
    n = 20_000
    while True:
        t = time.perf_counter()
        busy(n)
        took = time.perf_counter() - t
        if took > 0.02:
            return max(1, int(n * ms / 1000 / took))
        n *= 2


# -- the stand-in job's roles ----------------------------------------------------------------
def _launcher(
    ranks: int, warmup: float, seconds: float, step: int, batch: int, out: int, go: int
) -> None:
    """Start the ranks, connected as gloo connects them (to each other, not through the
    launcher), and wait for them. Rank 0 starts counting ``warmup`` s after a byte arrives on
    ``go`` (the arm is ready) and writes the result to ``out``."""
    rename("pt_elastic")
    threading.Thread(
        target=lambda: (rename("pt_tcpstore_uv"), time.sleep(1e9)), daemon=True
    ).start()
    pairs = [socket.socketpair() for _ in range(ranks - 1)]
    procs = []
    for r in range(ranks):
        fds = [a.fileno() for a, _ in pairs] if r == 0 else [pairs[r - 1][1].fileno()]
        extra = [str(warmup), str(seconds), str(out), str(go)] if r == 0 else []
        procs.append(
            subprocess.Popen(
                [
                    *HOSTD[:2],
                    "hostd.demo",
                    "rank",
                    str(step),
                    str(batch),
                    ",".join(map(str, fds)),
                    *extra,
                ],
                pass_fds=(*fds, out, go) if r == 0 else tuple(fds),
                start_new_session=True,  # torchrun starts each rank in a session of its own
                # and gives it its rank (torch.distributed.elastic): hostd knows a rank by it
                env={
                    **os.environ,
                    "RANK": str(r),
                    "LOCAL_RANK": str(r),
                    "WORLD_SIZE": str(ranks),
                    "TORCHELASTIC_RUN_ID": "hostd-demo",
                },
            )
        )
    for a, b in pairs:
        a.close()
        b.close()
    for p in procs:
        p.wait()


def _rank(step: int, batch: int, fds: str, timing: list[str]) -> None:
    """A rank: a step of CPU work on each batch from its DataLoader worker, then an all-reduce
    through its comm thread (rank 0 gathers the others and decides when to stop)."""
    peers = [socket.socket(fileno=int(fd)) for fd in fds.split(",") if fd]
    req_r, req_w = os.pipe()
    got_r, got_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the DataLoader worker: one batch of CPU work per request
        rename("pt_data_worker")
        os.close(req_w)
        os.close(got_r)
        while os.read(req_r, 1):
            busy(batch)
            os.write(got_w, b"b")
        os._exit(0)
    os.close(req_r)
    os.close(got_w)
    os.write(req_w, b"rr")  # two batches in flight, as DataLoader's prefetch
    ask: queue.SimpleQueue = queue.SimpleQueue()
    answer: queue.SimpleQueue = queue.SimpleQueue()
    result: dict = {}

    def gather() -> bytes:  # rank 0: every peer's step, then the verdict for all
        for s in peers:
            if not s.recv(1):
                result["error"] = "a rank exited"
                return b""
        now = time.monotonic()
        ready = result.get("go")
        if result.get("counted_at") is None and ready is not None and now >= ready + warmup:
            result.update(counted_at=now, steps=0)
        elif result.get("counted_at") is not None:
            result["steps"] += 1
        stop = result.get("counted_at") is not None and now >= result["counted_at"] + seconds
        result["now"] = now
        verdict = b"x" if stop else b"c"
        for s in peers:
            s.sendall(verdict)
        return verdict

    def comm() -> None:  # the all-reduce: one exchange with the peers per step
        rename("gloo_tcp_loop")
        try:
            while ask.get():
                if leader:
                    answer.put(gather())
                else:
                    peers[0].sendall(b"s")
                    answer.put(peers[0].recv(1))
        except OSError:  # a peer is gone: stop the rank
            answer.put(b"")

    leader = bool(timing)
    if leader:
        warmup, seconds, out, go = float(timing[0]), float(timing[1]), int(timing[2]), timing[3]

        def ready() -> None:  # the demo says the arm is set up (agent applied): warm up, count
            os.read(int(go), 1)
            result["go"] = time.monotonic()

        threading.Thread(target=ready, daemon=True).start()
    threading.Thread(target=comm, daemon=True).start()
    while True:
        os.read(got_r, 1)
        os.write(req_w, b"r")
        busy(step)
        ask.put(True)
        if answer.get() != b"c":
            break
    os.close(req_w)
    os.waitpid(pid, 0)
    if leader:
        line = {"error": result.get("error", "stopped early")}
        if "error" not in result and result.get("counted_at") is not None:
            took = result["now"] - result["counted_at"]
            line = {"steps": result["steps"], "seconds": round(took, 3)}
            line["steps_per_s"] = result["steps"] / took
        os.write(out, (json.dumps(line) + "\n").encode())


def main(argv: list[str]) -> None:
    role = argv[0]
    if role == "launcher":
        ranks, warmup, seconds, step, batch, out, go = argv[1:8]
        _launcher(
            int(ranks), float(warmup), float(seconds), int(step), int(batch), int(out), int(go)
        )
    elif role == "rank":
        _rank(int(argv[1]), int(argv[2]), argv[3], argv[4:])
    else:
        raise SystemExit(f"hostd.demo: unknown role {role!r}")
