"""NUMA page migration on the real kernel (one node here: the multi-node test is the VM tier)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hostd import knobkinds, knobs
from hostd.host import Host, HostError
from hostd.numa import move_process, pages_by_node, private_pages

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to move another's pages")

_HOLDER = (
    "b = bytearray(32 << 20)\n"
    "for i in range(0, len(b), 4096): b[i] = 1\n"
    "import time; print('ok', flush=True); time.sleep(60)\n"
)


@pytest.fixture
def holder():
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ok"
    yield proc.pid
    proc.kill()
    proc.wait()


def test_move_to_node_0_in_time_boxed_batches(holder):
    host = Host()
    report = move_process(host, holder, 0)
    assert report.pages > 32 * 256 * 0.9  # the 32 MiB buffer is among its private pages
    assert report.moved > 0 and report.batches > 1
    # Query page by page: every present page is on node 0.
    status = host.threads().move_pages(holder, private_pages(host, holder)[:4096], None)
    present = [s for s in status if s >= 0]
    assert present and set(present) == {0}
    assert set(pages_by_node(host, holder)) == {0}


def test_absent_node_is_a_clean_error(holder):
    host = Host()
    nodes = {int(e[4:]) for e in os.listdir("/sys/devices/system/node") if e[4:].isdigit()}
    absent = max(nodes) + 1
    with pytest.raises(HostError) as err:
        move_process(host, holder, absent)
    assert err.value.errno == 19  # ENODEV


def test_numa_knob_reads_the_majority_node(holder):
    host = Host()
    key = knobs.task_key(holder, host.start_time(holder), "numa")
    assert knobkinds.read(host, key) == [0, None]
    knobkinds.write(host, key, [0, "move_pages"])  # moving to where it is: a no-op that succeeds
    knobkinds.write(host, key, [0, "migrate_pages"])
    assert set(pages_by_node(host, holder)) == {0}
