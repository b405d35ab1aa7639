"""The values every layer shares: CPU sets, threads and processes, the host's topology.

Pure data and their pure helpers: this package imports nothing of the kernel door
(``hostd.host``), the readers or the actuators, so the pure core (policy, classify, plan,
preempt) can use it; pyproject.toml's import contract checks that.
"""
