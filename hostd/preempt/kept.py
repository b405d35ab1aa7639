"""Which sessions and cgroups are kept from demotion, and whose CPU counts (``hostd.preempt``).

``why_kept`` (with ``why_place_kept``, the node's ``[preempt] keep_*`` rules) says why a session
is never demoted (``hostd.agent.sampling``, ``hostd explain``); ``why_group_kept`` why a demoted
session's cgroup is not weighed down as a whole (``hostd.agent.weights``); ``counted_layers`` and
``shielding_layers`` read the policy for the watch (``hostd.agent.watch``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase

from hostd.model.node import Place, place
from hostd.policy import Policy, Preempt, gated


def why_place_kept(where: Place, keep: Preempt) -> str | None:
    """Why a process in ``where`` keeps its session from demotion, by what it is on the node
    (``[preempt] keep_*``), or None."""
    if where.kind in keep.keep_kinds:
        return f"node infrastructure: {where.line()} ([preempt] keep_kinds)"
    if where.kind == "pod":
        if where.namespace and where.namespace in keep.keep_namespaces:
            return f"node infrastructure: {where.line()} ([preempt] keep_namespaces)"
        if where.static and keep.keep_static_pods:
            return f"node infrastructure: static {where.line()} ([preempt] keep_static_pods)"
        if where.host_access and keep.keep_node_agents:
            return f"a node agent: {where.line()} ([preempt] keep_node_agents)"
    if where.unit and any(fnmatchcase(where.unit, pattern) for pattern in keep.keep_units):
        return f"{where.line()} ([preempt] keep_units)"
    if where.kind == "login" and where.uid in keep.keep_logins_of:
        return f"an operator's {where.line()} ([preempt] keep_logins_of)"
    return None


def why_kept(
    sid: int,
    *,
    layers: Iterable[str],
    tty: bool,
    own_sid: int,
    protected: frozenset[str],
    shielding: frozenset[str],
    places: Iterable[Place] = (),
    keep: Preempt | None = None,
    launched: str | None = None,
) -> str | None:
    """Why session ``sid`` must never be demoted (None: it may be). ``layers``: the layers of
    its threads; ``places``: where its processes are on the node, judged by ``keep``
    (``why_place_kept``); ``launched``: the protected layer of a process whose parent is in
    the session (the job's launcher: torchrun starts each rank in a session of its own, and a
    launcher is busy while the ranks start; a name or an environment makes no process a parent
    of a protected one, which holds a GPU or is root's). An interactive session is not kept:
    it has an allowance (``[preempt] interactive_cpus``, ``Watch.update``), as a terminal is a
    user's to open (``script``, ``ssh -t``, tmux); ``tty`` is kept in the signature for the
    callers."""
    if sid in (0, 1):
        return "the kernel's or init's session"
    if sid == own_sid:
        return "hostd's own session"
    if keep is not None:
        for where in sorted(set(places), key=lambda p: (p.kind, p.unit)):
            why = why_place_kept(where, keep)
            if why is not None:
                return why
    names = set(layers)
    held = sorted(names & protected)
    if held:
        return f"it holds threads of the protected layer {held[0]!r}"
    if launched is not None:
        return f"it started a process of the protected layer {launched!r} (the job's launcher)"
    shield = sorted(names & shielding)
    if shield:
        return f"layer {shield[0]!r} weighs its sessions itself (group_nice)"
    return None


def why_group_kept(
    path: str,
    members: Mapping[int, int | None] | None,
    demoted: Iterable[int],
    writable: Iterable[str] = (),
) -> str | None:
    """Why the cgroup at ``path`` of a demoted session must not be weighed down as a whole
    (None: it may be). ``members``: the session of every process in it and below it (None for
    a process hostd does not know: outside its scope, or too new), or None when they could not
    all be listed. Only a cgroup that holds nothing but demoted sessions yields as a whole: a
    job's thread, an operator's shell, a service or another tenant's idle work in it keeps it.
    And only a cgroup of a kind in ``writable`` (the policy's ``[cgroups] write``): every other
    is its manager's (systemd's units, the kubelet's pods, a runtime's containers)."""
    if path.strip("/") == "":
        return "the root cgroup"
    where = place(path)
    if where.kind not in writable:
        return (
            f"it is another manager's ({where.line()}); the policy's [cgroups] write does not "
            f"list {where.kind!r}"
        )
    if members is None:
        return "its processes could not all be listed"
    if not members:
        return "it holds no process"
    down = set(demoted)
    for pid, sid in sorted(members.items()):
        if sid is None:
            return f"it holds process {pid}, which hostd does not watch"
        if sid not in down:
            return f"it holds process {pid} of session {sid}, which is not demoted"
    return None


def counted_layers(policy: Policy) -> frozenset[str]:
    """The layers whose threads' CPU makes a session busy: the preemptible ones, and every
    other unprotected layer that a user can land in by what they set (a name, an argument, an
    environment: ``policy.gated``). A busy loop named like the launcher is demoted (its session's
    weight, its preemptible threads) though its own threads keep their policy; a layer behind
    a gate (the node's services, GPU services) is never made busy by a name."""
    if not policy.preemptible:
        return frozenset()
    return policy.preemptible | frozenset(
        ly.name for ly in policy.layers if not ly.preempt and not gated(ly)
    )


def shielding_layers(policy: Policy) -> frozenset[str]:
    """Layers whose sessions are never demoted because they set their own session weight."""
    return frozenset(ly.name for ly in policy.layers if ly.sched.group_nice is not None)
