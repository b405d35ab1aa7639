"""The cpuset actuators: thread affinity (``affinity``) and cpuset cgroups (``cgroup``).

The CPU-set type and its text forms are values of the pure core: ``hostd.model.cpus``.
"""
