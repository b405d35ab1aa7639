"""The VM tier: multi-NUMA, cgroup-v2 tests run inside one small QEMU VM (see README.md)."""
