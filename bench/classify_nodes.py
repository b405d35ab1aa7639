"""How well the default policy puts the threads of real training nodes in their layers.

    python3 bench/classify_nodes.py [--policy FILE] [--baseline FILE] [--write BENCHMARKS.md]

Classifies every thread of each stand-in node of ``tests/standin.py`` (8-GPU PyTorch DDP/FSDP
under Slurm, Kubernetes and ssh, Python 3.11 and 3.14, with and without
NCCL_SET_THREAD_NAME=1, DeepSpeed, JAX; each with the node's GPU services, daemons and an
operator's shell) and compares it with the layer an expert would choose. Per node: strict
accuracy (threads in their expert's layer), threads in a layer with weaker protection than
their expert's (protected > left alone > preemptible), GPU services' and other users' threads
in protected layers, job threads in the system layer; per layer of each node: threads, strict,
weaker; and every miss by thread kind. Pure classification (no /proc): it measures the policy
and the job model, not the reader.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.scan import write_section  # noqa: E402
from hostd.classify import Classifier  # noqa: E402
from hostd.policy import load_default, load_policy  # noqa: E402
from tests.standin import NODES, build, score  # noqa: E402

SECTION = "## Classification of training nodes (bench/classify_nodes.py)"


METHOD = (
    "every thread of each stand-in node of `tests/standin.py` is classified and compared with "
    "the layer an expert would choose (its reason is in the table there). Strict: threads in "
    "their expert's layer. Weaker: threads in a layer with weaker protection than their "
    "expert's (protected > left alone > preemptible). Outsiders protected: threads of GPU "
    "services and of other users, outside any job, in a protected layer. Job in system: job "
    "threads in the system layer. Pure classification of the nodes' facts (no /proc)."
)


def report(classifier: Classifier, name: str, baseline: Classifier | None, base: str) -> str:
    scores = [score(n, build(make()), classifier) for n, make in NODES.items()]
    before = [score(n, build(make()), baseline) for n, make in NODES.items()] if baseline else []
    lines = [SECTION, "", f"Policy: {name}. Method: {METHOD}", ""]
    if baseline:
        lines += [
            f"Baseline: {base}, in brackets.",
            "",
            "| node | threads | strict | weaker | outsiders protected | job in system |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for s, b in zip(scores, before, strict=True):
            lines.append(
                f"| {s.node} | {s.threads} | {s.strict:.1%} ({b.strict:.1%}) | {s.weaker} "
                f"({b.weaker}) | {s.outsiders_protected} ({b.outsiders_protected}) | "
                f"{s.job_in_system} ({b.job_in_system}) |"
            )
    else:
        lines += [
            "| node | threads | strict | weaker | outsiders protected | job in system |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for s in scores:
            lines.append(
                f"| {s.node} | {s.threads} | {s.strict:.1%} | {s.weaker} | "
                f"{s.outsiders_protected} | {s.job_in_system} |"
            )
    layers = sorted({layer for s in scores for layer in s.per_layer})
    lines += [
        "",
        "Per expert layer, strict (threads in it / threads that belong there):",
        "",
        "| node | " + " | ".join(layers) + " |",
        "|---|" + "---:|" * len(layers),
    ]
    for s in scores:
        cells = []
        for layer in layers:
            n, ok, _ = s.per_layer.get(layer, (0, 0, 0))
            cells.append(f"{ok}/{n}" if n else "-")
        lines.append(f"| {s.node} | " + " | ".join(cells) + " |")
    lines += ["", "Misses (thread kind: expert layer -> hostd's layer, threads):", ""]
    for s in scores:
        for (kind, want, got), n in sorted(s.misses.items()):
            lines.append(f"- {s.node}: `{kind}`: {want} -> {got}, {n}")
        if not s.misses:
            lines.append(f"- {s.node}: none")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", type=Path, help="a policy file (default: the embedded one)")
    ap.add_argument("--baseline", type=Path, help="a policy to compare with, side by side")
    ap.add_argument("--baseline-name", help="what to call the baseline (default: its path)")
    ap.add_argument("--write", type=Path, help="replace this section of BENCHMARKS.md")
    args = ap.parse_args()
    policy = load_policy(args.policy) if args.policy else load_default()
    baseline = Classifier(load_policy(args.baseline)) if args.baseline else None
    text = report(
        Classifier(policy),
        str(args.policy or "the embedded default"),
        baseline,
        args.baseline_name or str(args.baseline),
    )
    if args.write:
        write_section(args.write, text, SECTION)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
