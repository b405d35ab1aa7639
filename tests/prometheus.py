"""A real Prometheus server for the metrics tests: Debian's ``prometheus`` package, downloaded
and unpacked into ``.cache/prometheus`` (``python -m tests.prometheus install``; .ci/run does
it), never installed: no service starts, nothing on the host changes. ``promtool`` (in the same
package) checks and tests the shipped rules (tests/unit/test_prometheus_rules.py).

``Prometheus(targets, tmp)`` runs it on a free localhost port, scraping ``targets`` every
second (each with its own target labels, ``labels``, for a fleet), with its storage in ``tmp``;
``query(expr)`` asks its HTTP API.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "prometheus"


def binary() -> str | None:
    """The Prometheus server to run: the unpacked package's, else one on PATH."""
    unpacked = CACHE / "root" / "usr" / "bin" / "prometheus"
    return str(unpacked) if unpacked.exists() else shutil.which("prometheus")


def promtool() -> str | None:
    """Prometheus' rule checker and tester (the same package ships it beside the server): the
    unpacked package's, else one on PATH."""
    unpacked = CACHE / "root" / "usr" / "bin" / "promtool"
    return str(unpacked) if unpacked.exists() else shutil.which("promtool")


def install() -> int:
    """Download Debian's package and unpack it below the cache (apt-get download, dpkg-deb -x)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(["apt-get", "download", "prometheus"], cwd=CACHE, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    deb = max(CACHE.glob("prometheus_*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(CACHE / "root")], check=True)
    print(binary(), promtool())
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    def __init__(
        self, targets: list[str], tmp: Path, labels: dict[str, dict[str, str]] | None = None
    ) -> None:
        """``labels``: target labels of each target (a fleet's ``node``), as a static config
        gives them."""
        found = binary()
        assert found, "no prometheus binary"
        self.port = free_port()
        config = tmp / "prometheus.yml"
        static = f"      - targets: {json.dumps(targets)}\n"
        if labels is not None:
            static = "".join(
                f"      - targets: {json.dumps([t])}\n        labels: {json.dumps(labels[t])}\n"
                for t in targets
            )
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: hostd\n    static_configs:\n" + static
        )
        self.log = tmp / "prometheus.log"
        self.proc = subprocess.Popen(
            [found, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log.open("w"), stderr=subprocess.STDOUT,
        )  # fmt: skip

    def query(self, expr: str) -> list[dict]:
        """The instant vector ``expr`` gives now ([] while Prometheus is not up yet)."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return json.loads(resp.read())["data"]["result"]
        except OSError:
            return []

    def wait(self, expr: str, timeout: float = 60) -> list[dict]:
        """``query(expr)`` once it has a result (a deadline only bounds a failure)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.query(expr)
            if got:
                return got
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise AssertionError(f"{expr}: no result\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    if sys.argv[1:] == ["install"]:
        sys.exit(install())
    sys.exit(f"usage: {os.path.basename(sys.argv[0])} install")
