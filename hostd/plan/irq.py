"""IRQ placement: where each IRQ should be allowed to run (pure)."""

from __future__ import annotations

from collections.abc import Mapping

from hostd.model.topology import Topology
from hostd.plan.values import IrqPlan
from hostd.policy import Policy


def plan_irqs(
    topo: Topology, policy: Policy, layer_cpus: Mapping[str, frozenset[int]], notes: list[str]
) -> list[IrqPlan]:
    """Off the CPUs of ``irqs = "avoid"`` layers; a NIC's IRQs on its own node's CPUs. The
    current affinity is kept where it overlaps the target (drivers spread queues on purpose)."""
    online = topo.online
    avoid = frozenset().union(
        *(layer_cpus.get(ly.name, frozenset()) for ly in policy.layers if ly.irqs == "avoid")
    )
    nic_of_irq = {irq: nic for nic in topo.nics for irq in nic.irqs}
    irq_plans: list[IrqPlan] = []
    for irq in topo.irqs:
        nic = nic_of_irq.get(irq.irq)
        if nic is not None and nic.node is not None:
            target = nic.local_cpus - avoid
            reason = f"NIC {nic.name} on node {nic.node}"
        elif avoid:
            target = online - avoid
            reason = "off the CPUs of irqs=avoid layers"
        else:
            continue  # no rule acts on this IRQ: hostd has no opinion
        if not target:
            target = online - avoid
            reason += " (its node is all avoided: any non-avoided CPU)"
        if not target:
            notes.append(f"IRQ {irq.irq}: every CPU is avoided; left as it is")
            continue
        current = irq.affinity & online
        desired = (current & target) or target
        irq_plans.append(IrqPlan(irq.irq, irq.name, desired, reason))

    return irq_plans
