"""``python -m hostd.demo ROLE ...``: run one role of the demo's stand-in job
(``hostd.demo.job``)."""

from __future__ import annotations

import sys

from hostd.demo.job import main

if __name__ == "__main__":
    main(sys.argv[1:])
