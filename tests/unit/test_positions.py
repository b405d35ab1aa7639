"""Where a policy error's key path sits in the text (hostd.policy.positions), table by table."""

from __future__ import annotations

import pytest

from hostd.policy.positions import position

TEXT = """\
# a comment that says [[layer]] and name = "no"
version = 1

[agent]
mode = "enforce"  # [agent] again, in a comment

[[layer]]
name = "comms"
comment = "a string with [[layer]] and match = inside"
match = [
  [{ comm_prefix = ["pt_nccl", "NCCL"] }, { job_gpu = true }],
  # a comment between groups: [{ uid = 0 }]
  [{ "comm_regex" = '^x[]]' }, { not = { uid = 0 } }],
]
sched = { policy = "fifo", priority = 5 }

[[layer]]
name = "rest"
comment = '''multi
line [[layer]]'''
match = [[]]
"""


@pytest.mark.parametrize(
    ("path", "want"),
    [
        ("version", (2, 1)),
        ("agent.mode", (5, 1)),
        ("layer[0].name", (8, 1)),
        ("layer[0].match", (10, 1)),
        ("layer[0].match[0][1].job_gpu", (11, 45)),
        ("layer[0].match[1][0].comm_regex", (13, 6)),  # quoted key; a comment group skipped
        ("layer[0].match[1][1].not.uid", (13, 42)),
        ("layer[0].sched.priority", (15, 28)),
        ("layer[1].name", (18, 1)),  # the header in a multi-line string is no header
        ("layer[1].match[0]", (21, 10)),
        ("layer[1].cpus", (17, 3)),  # absent: its table
        ("layer[2].name", None),
        ("pool_min", None),
        ("", None),
    ],
)
def test_positions(path, want):
    assert position(TEXT, path) == want
