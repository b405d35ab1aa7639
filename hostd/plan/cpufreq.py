"""cpufreq decisions: governor, frequency floor and EPP per CPU of the layers that ask (pure)."""

from __future__ import annotations

from collections.abc import Mapping

from hostd.model.topology import Topology
from hostd.plan.values import CpuFreqPlan
from hostd.policy import Policy


def plan_cpufreq(
    topo: Topology, policy: Policy, layer_cpus: Mapping[str, frozenset[int]], notes: list[str]
) -> list[CpuFreqPlan]:
    """Governor, frequency floor and EPP on the CPUs of layers that ask, where the CPU offers
    them."""
    freq_plans: list[CpuFreqPlan] = []
    for layer in policy.layers:
        if not (layer.governor or layer.min_freq or layer.epp):
            continue
        for cpu_id in sorted(layer_cpus.get(layer.name, ())):
            freq = topo.cpus[cpu_id].freq
            if freq is None:
                continue
            governor = layer.governor
            if governor and governor not in freq.available_governors:
                notes.append(
                    f"cpu{cpu_id}: governor {governor!r} not offered "
                    f"({' '.join(freq.available_governors) or 'none'})"
                )
                governor = None
            floor = _min_freq(layer.min_freq, freq.hw_min_freq, freq.hw_max_freq)
            epp = layer.epp
            if epp and (freq.epp is None or (epp != "default" and epp not in freq.available_epp)):
                epp = None
            if governor or floor or epp:
                freq_plans.append(CpuFreqPlan(cpu_id, layer.name, governor, floor, epp))

    return freq_plans


def _min_freq(spec: str | None, hw_min: int | None, hw_max: int | None) -> int | None:
    if spec is None or hw_max is None:
        return None
    if spec == "max":
        value = hw_max
    elif spec.endswith("%"):
        value = hw_max * int(spec[:-1]) // 100
    else:
        value = int(spec)
    return max(hw_min or 0, min(value, hw_max))
