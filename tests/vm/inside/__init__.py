"""Tests that run inside the VM (8 CPUs, 4 NUMA nodes, cgroup v2); see tests/vm/README.md."""
