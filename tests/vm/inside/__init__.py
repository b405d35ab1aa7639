"""Tests that run inside the VM (4 CPUs, 2 NUMA nodes, cgroup v2); see tests/vm/README.md."""
