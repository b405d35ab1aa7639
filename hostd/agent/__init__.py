"""The agent: observe -> classify -> plan -> diff -> journal -> apply -> report, driven by events.

``Agent.pass_once()`` runs one full pass (``hostd run --once``): topology, every thread, the
whole plan. ``Agent.run()`` then waits on its event sources in one ``select`` loop:

* **proc connector** (``hostd.host.connector``): fork, exec, comm and exit events. Pending
  events are drained and coalesced per thread (a bounded batch), then ``event_pass`` re-reads
  just those threads (one stat and one sched_getaffinity each), classifies them, decides them
  with the last full plan's ``TaskPlanner`` and applies the difference: milliseconds, however
  many threads the host has. A lost event (ENOBUFS) triggers a full rescan.
* **device events** (``hostd.host.uevents``): a CPU going offline or online, a PCI or network
  device coming or going: a full pass with the topology read again (a CPU back online also
  gets back the v1 cpusets the kernel emptied).
* **timers**: a full rescan for drift (someone else changed a knob hostd owns; a thread whose
  event was missed) every ``[agent] rescan_interval`` seconds, stretched to 100 times the cost
  of a rescan so it never takes more than 1% of a CPU; without the connector (a container
  without the host's pid namespace, or ``[agent] source = "poll"``), a full pass every
  ``[agent] interval`` seconds instead. When events change a layer's thread count enough to
  change its CPU share, a full re-plan follows, at most one per 20 times its cost (a layer that
  shrank waits 30 s: a short-lived matching process must not make the host flap).
* **the watch** (``hostd.agent.watch``): every ``[preempt] interval`` while a protected layer
  has threads, what threads wanted from the scheduler: busy sessions of preemptible layers
  are demoted (``hostd.preempt``), starving threads boosted, runaway real-time threads
  returned to normal scheduling.

SIGTERM/SIGINT restore everything hostd changed (unless the policy says ``restore_on_exit =
false``). SIGHUP reloads the policy (a bad new policy keeps the old one, and says why); SIGUSR1
runs a full pass at once (``hostd enable``/``disable`` use it). Files:

* ``STATE_DIR/journal.jsonl``: the originals (``hostd.journal``); survives a crash, so
  ``hostd restore`` works after ``kill -9``.
* ``RUN_DIR/agent.pid`` (locked while the agent runs), ``RUN_DIR/status.json`` (written after
  every full pass and at most once a second otherwise, read by ``hostd status``),
  ``RUN_DIR/disabled`` (present: switched off).

The parts, one job each: ``core`` (``Agent``: the full pass and the event pass), ``loop`` (the
scheduler: when each is due; start and stop), ``parts`` (the periodic parts, each saying when
it is due and what it does, given only what it needs), ``state`` (what the agent shares with
them: ``AgentState``), ``events`` (a burst of events coalesced per thread), ``incremental`` (the
last full plan, kept true thread by thread), ``sources`` (what wakes the loop), ``status``
(``status.json``), ``lock`` (one agent per host) and ``watch`` (with ``sampling``,
``demotion``, ``weights`` and ``guard``, which change threads through ``applier``). Only this
module and ``loop`` import ``core``; the ``Agent`` here is ``core``'s, run by ``loop``.

With ``scope`` (``hostd run --scope-pid PID``) only those processes and their descendants are
classified and changed: a sandbox for tests. ``sidecar`` (``hostd run --sidecar``) scopes it to
its own pod and leaves host-wide knobs alone (``hostd.sidecar``).
The agent never touches its own process, and uses the doctor's probe to leave out what the host
does not allow (feature by feature) instead of failing.
"""

from __future__ import annotations

from collections import Counter

from hostd.agent import core, loop
from hostd.agent.lock import AgentError, agent_pid
from hostd.agent.status import read_status
from hostd.reconcile import PassReport
from hostd.statedir import DEFAULT_RUN_DIR, DEFAULT_STATE_DIR

__all__ = [
    "DEFAULT_RUN_DIR",
    "DEFAULT_STATE_DIR",
    "Agent",
    "AgentError",
    "agent_pid",
    "read_status",
    "summarize",
]


class Agent(core.Agent):
    """The agent: its passes and parts (``hostd.agent.core.Agent``), run by its loop."""

    def run(self, once: bool = False) -> PassReport:
        return loop.run(self, once)


def summarize(counts: Counter | dict) -> str:
    return ", ".join(f"{v} {k}" for k, v in sorted(dict(counts).items())) or "nothing to do"
