"""The stand-in node of tests/privileged/test_node.py on a pure cgroup-v2 kernel: the node model
reads the same paths in the v2 tree, the infrastructure is kept, competing work is demoted, no
cgroup of another manager is written, and the stop puts everything back."""

from __future__ import annotations

from tests.privileged import test_node as on_v1
from tests.privileged.test_node import node

__all__ = ["node"]


def test_a_v2_node_keeps_its_own_and_preempts_the_rest(tmp_path, node):
    on_v1.test_the_node_keeps_its_own_and_preempts_the_rest(
        tmp_path, node, write=False, crash=False
    )
