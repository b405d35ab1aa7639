"""Self-sizing layers, applied: every ``[sizing] interval`` the agent measures each self-sizing
layer's utilisation and asks ``hostd.plan.sizing.decide`` for its CPU count.

A layer's utilisation over an interval is the busy share of the CPUs it has of its own (from
``/proc/stat``: one read, whatever the number of threads; kernel threads and interrupts on
those CPUs count too). When a count changes, ``sizes`` holds the new one, the layer's history
starts again (its next window is measured at its new size), and the agent re-layers now
(``hostd.agent.incremental``: the layers' CPUs planned again with ``sizes`` and each layer's
present CPUs, ``current``: sticky growth; the layer's threads written at once, the pool's a few
at a time), journaled as every change is; the log, ``hostd status`` and the metrics say each
resize and why. A layer that loses its last thread forgets its size (it starts again at its
minimum). Nothing is read while the policy has no self-sizing layer. It reads through the host
door and the incremental state (the plan, the topology, the layers' thread counts), with the
policy in force (``AgentState``); the loop ticks it (``hostd.agent.parts.Resize``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from typing import TYPE_CHECKING

from hostd.plan.sizing import Decision, decide, shrink_window

if TYPE_CHECKING:
    from hostd.agent.incremental import Incremental
    from hostd.agent.state import AgentState
    from hostd.host import Host

log = logging.getLogger("hostd")
KEEP_RESIZES = 20  # the last resizes the status document shows


class Sizer:
    def __init__(self, host: Host, inc: Incremental, state: AgentState) -> None:
        self.host, self.inc, self.state = host, inc, state
        self.prev: dict[int, tuple[int, int]] = {}  # cpu -> (busy, total) ticks last tick
        self.history: dict[str, deque[float]] = {}
        self.sizes: dict[str, int] = {}  # the count each self-sizing layer was given
        self.resizes: deque[dict] = deque(maxlen=KEEP_RESIZES)
        self.last: dict[str, Decision] = {}
        self.due = 0.0
        self.cost = 0.0  # seconds the last tick took
        self.count: Counter[str] = Counter()  # resizes since start, by layer

    @property
    def wanted(self) -> bool:
        return bool(self.state.policy.self_sizing) and self.inc.plan is not None

    def tick(self) -> bool:
        """One interval: True when a layer's count changed (the agent re-layers now)."""
        started = time.monotonic()
        policy = self.state.policy
        sizing = policy.sizing
        self.due = started + sizing.interval
        plan, topo = self.inc.plan, self.inc.topology
        if plan is None or topo is None:
            return False
        times = self.host.cpu_times()
        window = shrink_window(sizing) + 1
        members = self.inc.layer_counts
        current: dict[str, int] = {}
        for layer in policy.self_sizing:
            lp = next((p for p in plan.layers if p.name == layer.name), None)
            if lp is None:
                continue
            # what it was given last (the pool may have had less: asking again changes nothing)
            current[layer.name] = self.sizes.get(layer.name, len(lp.cpus))
            if not members[layer.name]:
                self.history.pop(layer.name, None)
                self.sizes.pop(layer.name, None)
                continue
            busy = total = 0
            for cpu in lp.cpus:
                now, before = times.get(cpu), self.prev.get(cpu)
                if now is None or before is None:
                    continue
                busy += now[0] - before[0]
                total += now[1] - before[1]
            hist = self.history.setdefault(layer.name, deque(maxlen=window))
            if total > 0:
                hist.append(min(1.0, max(0.0, busy / total)))
        self.prev = times
        history = {name: list(h) for name, h in self.history.items()}
        decisions = decide(policy, topo, history, current, members=members)
        self.last = decisions
        changed = [d for d in decisions.values() if d.changed and d.count > 0]
        for d in changed:
            self.sizes[d.layer] = d.count
            self.history.pop(d.layer, None)
            self.count[d.layer] += 1
            self.resizes.append({
                "time": round(time.time(), 3), "layer": d.layer, "from": d.was,
                "to": d.count, "why": d.why,
            })  # fmt: skip
            log.info("resize layer=%s cpus=%d->%d why=%r", d.layer, d.was, d.count, d.why)
        self.cost = time.monotonic() - started
        return bool(changed)

    def planned(self) -> dict[str, int]:
        """The sizes the next plan uses: those of layers that have threads now."""
        members = self.inc.layer_counts
        return {name: n for name, n in self.sizes.items() if members[name]}

    def doc(self) -> dict:
        return {
            "layers": {
                name: {
                    "cpus": d.count,
                    "why": d.why,
                    "util": [round(u, 3) for u in self.history.get(name, ())][-10:],
                }
                for name, d in self.last.items()
            },
            "resizes": list(self.resizes),
            "resizes_total": dict(self.count),
            "tick_seconds": round(self.cost, 6),
        }
