"""Record a utilisation trace of this host's layers for the self-sizing tests and bench: every
``--interval`` seconds, every thread is classified with the default policy (or ``--policy``)
and its CPU time read (schedstat); each layer's CPUs used over the interval (CPU seconds per
second) is one value of the trace.

    sudo python3 tools/record_trace.py --seconds 60 --out tests/fixtures/traces/NAME.json \\
        --source "what ran" [--layers trainer,comms,data,compile]

Threads that live less than an interval between two samples are not seen. The trace format is
``hostd.plan.sizing.replay``'s: ``{"interval_s", "unit": "cpus_used", "source", "layers":
{name: [CPUs used per interval]}}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostd.host import Host
from hostd.policy import load_default, load_policy
from hostd.snapshot import take
from hostd.stats import sample


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--source", required=True, help="what ran while recording")
    ap.add_argument("--layers", default="trainer,comms,data,compile")
    ap.add_argument("--policy")
    args = ap.parse_args()
    host = Host()
    pol = load_policy(args.policy) if args.policy else load_default()
    wanted = args.layers.split(",")
    layers: dict[str, list[float]] = {name: [] for name in wanted}
    snap = take(host, pol)
    layer_of = {c.task.key: c.layer for c in snap.classified}
    before, at = sample(host, [c.task for c in snap.classified]), time.monotonic()
    steps = round(args.seconds / args.interval)
    for _ in range(steps):
        time.sleep(max(0.0, at + args.interval - time.monotonic()))
        snap = take(host, pol)  # new threads are classified as they come
        layer_of.update({c.task.key: c.layer for c in snap.classified})
        now, then = sample(host, [c.task for c in snap.classified]), time.monotonic()
        used = dict.fromkeys(wanted, 0.0)
        for key, counters in now.items():
            layer = layer_of.get(key)
            if layer in used and key in before:
                used[layer] += max(0, counters.run_ns - before[key].run_ns) / 1e9
        for name in wanted:
            layers[name].append(round(used[name] / (then - at), 3))
        before, at = now, then
    doc = {
        "interval_s": args.interval,
        "unit": "cpus_used",
        "source": args.source,
        "layers": layers,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
