"""hostd: protect latency-critical threads of AI training jobs from userspace.

The package is layered as DESIGN.md describes: ``host`` is the only door to the kernel,
``policy``/``classify``/``plan`` form the pure core, and ``cli`` renders results.
"""

__version__ = "0.1.0"
